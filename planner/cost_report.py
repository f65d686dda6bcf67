"""Text for the whole-run cost: the lines under a plan table and the table of a multi-cluster comparison
(``plan3d plan|evaluate --train-tokens``). Rendering only; the numbers come from ``planner.cost``."""
from __future__ import annotations

from .comparison import ComparisonDocument
from .document import CostInfo, PlanDocument


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def amount(x: float) -> str:
    """A quantity for people: thousands separated above 100 (``53,366``), 3 significant digits below (``8.26``)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def days(d: float) -> str:
    """Days in a table column: one decimal, thousands separated (``35.3``, ``1,234.5``), so a column's entries align
    and keep their trailing zero (``35.0``, not ``35``); two significant digits under a tenth of a day (``0.042``)."""
    return f"{d:,.1f}" if d >= 0.1 else f"{d:.2g}"


def money(usd: float | None) -> str:
    """``$1,234,567`` (or ``-`` without a price)."""
    return "-" if usd is None else f"${usd:,.0f}"


def price_note(c: CostInfo) -> str:
    """Where the price comes from, with its date (prices move)."""
    if c.usd_per_gpu_hour is None:
        return "no price (give --gpu-hour-price)"
    if c.price_date is None:
        return f"${c.usd_per_gpu_hour:.2f}/GPU-hour (--gpu-hour-price)"
    return f"${c.usd_per_gpu_hour:.2f}/GPU-hour as of {c.price_date} ({c.price_source})"


def cost_lines(doc: PlanDocument) -> list[str]:
    """One paragraph on the top plan's cost: time, goodput and why, GPU-hours, money with the price's date, and
    energy with what it counts. Empty when the document has no cost."""
    top = next((p for p in doc.plans if p.cost is not None), None)
    if top is None:
        return []
    c, n = top.cost, doc.input.cluster.num_gpus
    infeasible = "" if top.feasible else " (infeasible as given: the cost of its predicted step)"
    ckpt = ("async: blocks " + _duration(c.checkpoint_blocking_s) + ", writes in " + _duration(c.checkpoint_write_s)
            if c.async_checkpoint else "written in " + _duration(c.checkpoint_write_s))
    energy = "energy unknown" if c.energy_mwh is None else f"{amount(c.energy_mwh)} MWh ({c.energy_scope}, PUE {c.pue:g})"
    return [
        f"cost of plan {top.rank}{infeasible} for {c.train_tokens:.4g} tokens ({c.steps:,} steps) on {n} GPUs: "
        f"{days(c.wall_clock_days)} days failure-free, {days(c.effective_days)} days with interruptions and checkpoints "
        f"(goodput {c.goodput_fraction:.1%}), {c.gpu_hours:,.0f} GPU-hours, {money(c.usd)}",
        f"  interruptions: one every {_duration(c.mtbf_s)} ({c.expected_interruptions:,.1f} expected), restart "
        f"{_duration(c.restart_s)}; checkpoint {amount(c.checkpoint_bytes / 1e9)} GB {ckpt}, every "
        f"{c.checkpoint_interval_steps} steps ({_duration(c.checkpoint_interval_s)}, Young/Daly)",
        f"  energy: {energy}",
        f"  price: {price_note(c)}",
    ]


def comparison_table(cmp: ComparisonDocument, title: str):
    """The rich table of a multi-cluster comparison: one row per cluster, ranks by time and by cost."""
    from rich.table import Table
    from cost_models.training_cost import ENERGY_SCOPE_BOARDS_ONLY
    boards_only = any(r.document is not None and r.document.plans[0].cost.energy_scope == ENERGY_SCOPE_BOARDS_ONLY
                      for r in cmp.rows)
    t = Table(title=title, title_justify="left", caption_justify="left",
              caption="days: effective (interruptions, restarts, checkpoints counted); $: GPU-hours x the cluster's "
                      "price (date in the price column; prices move); MWh: upper bound at datasheet power x PUE"
                      + ("; * GPU boards only: that cluster file has no node-overhead power, so its MWh leaves out "
                         "the CPUs, NICs and fans the others count" if boards_only else ""))
    for col in ("time #", "cost #", "cluster", "GPUs", "tp", "pp", "dp", "cp", "ep", "tokens/s", "MFU", "days",
                "goodput", "GPU-hours", "$/GPU-h (date)", "$", "MWh"):
        t.add_column(col, justify="right" if col not in ("cluster", "$/GPU-h (date)") else "left")
    for r in cmp.rows:
        if r.document is None:
            t.add_row("-", "-", r.cluster, *["-"] * 14)
            continue
        p = r.document.plans[0]
        q, c = p.parallel, p.cost
        price = "-" if c.usd_per_gpu_hour is None else f"{c.usd_per_gpu_hour:.2f} ({c.price_date or 'option'})"
        t.add_row(str(r.rank_by_time or "-"), str(r.rank_by_cost or "-"), r.cluster,
                  str(r.document.input.cluster.num_gpus), str(q.tp), str(q.pp), str(q.dp), str(q.cp), str(q.ep),
                  f"{p.throughput.tokens_per_s:,.0f}", f"{p.throughput.mfu:.1%}", days(c.effective_days),
                  f"{c.goodput_fraction:.1%}", f"{c.gpu_hours:,.0f}", price, money(c.usd),
                  "-" if c.energy_mwh is None else amount(c.energy_mwh)
                  + (" *" if c.energy_scope == ENERGY_SCOPE_BOARDS_ONLY else ""))
    return t


def comparison_notes(cmp: ComparisonDocument) -> list[str]:
    """Why clusters without a plan have none, one line each."""
    return [f"  {r.cluster}: {r.reason}" for r in cmp.rows if r.document is None]
