"""Per-stage memory report: a rich table (largest terms first, with capacity and headroom), the JSON form shared with
the plan document (``memory.stages``), and a stacked-bar picture with the capacity line (matplotlib, optional
``plot`` extra, imported only when a picture is asked for).

Units: bytes in JSON; GiB (2**30 bytes) in the table and the picture.
"""
from __future__ import annotations

from pathlib import Path

from cost_models.memory import MemoryEstimate

from .checks import DEFAULT_AT_RISK_MARGIN, DEFAULT_MEMORY_HEADROOM, memory_verdict, verdict_of
from .errors import PlanInputError

GiB = 2**30
PLOT_SUFFIXES = (".png", ".svg")
#: Columns of the per-phase totals, in step order (``init`` = before the first step).
PHASE_COLUMNS = ("init", "forward", "backward", "optimizer")


def status(est: MemoryEstimate, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
           at_risk_margin: float = DEFAULT_AT_RISK_MARGIN) -> str:
    """The memory verdict of ``est`` (``planner.checks.memory_verdict``): fits, at risk, over headroom or OOM."""
    return memory_verdict(est, memory_headroom, at_risk_margin)


def term_order(est: MemoryEstimate) -> list[str]:
    """Term names, largest first on the peak stage (ties by name), so every table and picture agrees."""
    return list(est.peak_stage.terms())


def memory_table(est: MemoryEstimate, title: str, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                 at_risk_margin: float = DEFAULT_AT_RISK_MARGIN):
    """A rich table, one row per pipeline stage (``*`` marks the peak stage): layers, micro-batches in flight, each
    term at the stage's peak phase (columns ordered largest first on the peak stage), the total, that phase, the
    total of each phase (``init`` before the first step, ``forward``, ``backward``, ``optimizer``), what is left free
    of capacity and the verdict (``planner.checks.memory_verdict``). GiB. The caption names the backend buffers of the
    peak stage's peak phase (``cost_models.memory_buffers``)."""
    from rich.table import Table
    cap = est.capacity_bytes
    pk = est.peak_stage
    bufs = pk.buffer_terms.get(pk.phase, {})
    named = ", ".join(f"{k.replace('_', ' ')} {v / GiB:.2f}" for k, v in sorted(bufs.items(), key=lambda kv: -kv[1])
                      if v > 0)
    caption = (f"GiB per GPU; capacity {cap / GiB:.2f} GiB (free = capacity - total); over headroom above "
               f"{1 - memory_headroom:.0%} of it, at risk above {1 - at_risk_margin:.0%}")
    if named:
        caption += f"; buffers (stage {pk.stage}, {pk.phase}): {named}"
    t = Table(title=title or None, title_justify="left", caption=caption, caption_justify="left")
    names = term_order(est)
    phases = [ph for ph in PHASE_COLUMNS if ph in pk.phases]
    for col in ("stage", "layers", "in flight", *names, "total", "phase", *phases, "free", "status"):
        t.add_column(col.replace("_", " "), justify="left" if col in ("phase", "status") else "right",
                     min_width=len(col), no_wrap=True)
    for s in est.stages:
        terms = s.terms()
        t.add_row(f"{s.stage}{' *' if s.stage == pk.stage else ''}", str(s.num_layers),
                  f"{s.in_flight_microbatches:g}", *[f"{terms[n] / GiB:.2f}" for n in names],
                  f"{s.total / GiB:.2f}", s.phase, *[f"{s.phases.get(ph, 0.0) / GiB:.2f}" for ph in phases],
                  f"{(cap - s.total) / GiB:.2f}", verdict_of(s.total, cap, memory_headroom, at_risk_margin))
    return t


def plot_memory(est: MemoryEstimate, path: Path, title: str, at_risk_margin: float = DEFAULT_AT_RISK_MARGIN,
                memory_headroom: float = DEFAULT_MEMORY_HEADROOM) -> None:
    """Draw the per-stage stacked breakdown (GiB) into ``path`` (.png or .svg) with the capacity line, the usable
    limit (capacity less ``memory_headroom``: above it the layout is infeasible) and the at-risk line.

    Raises:
        PlanInputError: unsupported suffix, matplotlib missing, or the file cannot be written.
    """
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise PlanInputError(f"--plot {path}: the file must end in {' or '.join(PLOT_SUFFIXES)}")
    from .plotting import require_matplotlib
    require_matplotlib("--plot")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "plan3d"  # deterministic SVG ids

    names = term_order(est)
    xs = list(range(len(est.stages)))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(xs) + 3.0), 4.5))
    bottom = [0.0] * len(xs)
    for name in names:
        vals = [s.terms()[name] / GiB for s in est.stages]
        ax.bar(xs, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    cap = est.capacity_bytes / GiB
    ax.axhline(cap, color="black", linestyle="--", linewidth=1.2, label=f"capacity {cap:.1f} GiB")
    ax.axhline(cap * (1 - memory_headroom), color="red", linestyle="-.", linewidth=1.0,
               label=f"usable {cap * (1 - memory_headroom):.1f} GiB (--memory-headroom {memory_headroom:g})")
    ax.axhline(cap * (1 - at_risk_margin), color="grey", linestyle=":", linewidth=1.0,
               label=f"at risk above {cap * (1 - at_risk_margin):.1f} GiB")
    ax.set_xticks(xs, [f"{s.stage}\n{s.phase}" for s in est.stages])
    ax.set_xlabel("pipeline stage / peak phase")
    ax.set_ylabel("GiB per GPU")
    import textwrap
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    # the title spans the figure from its left edge (the legend sits right of the axes, so a title centred over the
    # axes ran off the left side), wrapped to the figure's width at ~14 characters per inch of 8-point text
    lines = textwrap.wrap(title, max(30, int(14 * fig.get_figwidth())))
    fig.suptitle("\n".join(lines), fontsize=8, x=0.01, ha="left")
    fig.tight_layout()
    meta = {"Date": None} if path.suffix.lower() == ".svg" else {"Software": None}
    try:
        fig.savefig(path, metadata=meta)
    except OSError as e:
        raise PlanInputError(f"--plot {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
