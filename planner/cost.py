"""The whole-run cost of plans: ``--train-tokens`` and its options, and the ``cost`` block of each plan.

``CostOptions`` gathers what the cost needs beyond the plan (tokens, price, checkpointing mode, overrides of the
cluster's reliability and power figures); ``plan_cost`` turns one evaluated plan into the document's ``CostInfo``
through ``cost_models.training_cost`` (every formula and source is there); ``attach_costs`` fills a document.

Prices: ``--gpu-hour-price`` is one number for every cluster or ``NAME=USD`` pairs (``dgx-h100=2.5,dgx-h200=3.1``);
without it a cluster's own dated price (``operations.price``) is used, and the document says its date and source.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from cost_models.config import TrainingJob
from cost_models.training_cost import SECONDS_PER_DAY, checkpoint_bytes, training_cost
from model_zoo.spec import ModelSpec

from .document import CostInfo, PlanDocument
from .document import _r as _round6
from .errors import PlanInputError
from .evaluation import Evaluation

#: largest --train-tokens accepted (1e16: 600x Llama 3's 15.6T; a typo such as 15.6e21 is refused)
MAX_TRAIN_TOKENS = 1e16
#: largest --gpu-hour-price accepted, USD: 100x the on-demand list prices of 2025-2026 (about 2-12 USD per H100 /
#: B200 GPU-hour, cluster_specs operations.price); a typo such as 2.5e3 or 1e308 is refused
MAX_GPU_HOUR_PRICE = 1000.0
#: smallest goodput (useful share of wall time) a cost is given for: below it the expected run is over 100x its
#: failure-free time, interrupted faster than it checkpoints and restarts; the plan is refused with the figures
MIN_GOODPUT = 0.01


@dataclass(frozen=True)
class CostOptions:
    """What the cost of a plan needs besides the plan. ``gpu_hour_price``: USD per GPU-hour for every cluster, a
    mapping cluster name -> USD, or None (each cluster's own dated price, if it has one)."""

    train_tokens: float
    gpu_hour_price: float | dict[str, float] | None = None
    async_checkpoint: bool = False
    interruptions_per_gpu_hour: float | None = None
    restart_s: float | None = None
    pue: float | None = None

    def price_for(self, cluster: ClusterSpec) -> tuple[float | None, str | None, str | None]:
        """(USD per GPU-hour, date, source) for ``cluster``: the option's price (no date), else the cluster's own."""
        p = self.gpu_hour_price
        if isinstance(p, dict):
            p = p.get(cluster.name)
        if p is not None:
            return float(p), None, "--gpu-hour-price"
        own = cluster.operations.price
        if own is None:
            return None, None, None
        return own.usd_per_gpu_hour, own.date.isoformat(), own.source


def _positive(field: str, v, upper: float | None = None, lower_inclusive: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise PlanInputError(f"--{field} {v!r}: must be a finite number")
    if lower_inclusive is not None:
        if v < lower_inclusive:
            raise PlanInputError(f"--{field} {v:g}: must be >= {lower_inclusive:g}")
    elif not v > 0:
        raise PlanInputError(f"--{field} {v:g}: must be a positive number")
    if upper is not None and v > upper:
        raise PlanInputError(f"--{field} {v:g}: must be <= {upper:g}")
    return float(v)


def parse_price(text: str | float | dict | None) -> float | dict[str, float] | None:
    """``--gpu-hour-price``: a number (USD per GPU-hour, every cluster) or ``NAME=USD[,NAME=USD...]``. Raises
    ``PlanInputError`` naming the bad entry."""
    if text is None or isinstance(text, dict):
        return None if text is None else {k: _positive("gpu-hour-price", v, MAX_GPU_HOUR_PRICE)
                                          for k, v in text.items()}
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _positive("gpu-hour-price", text, MAX_GPU_HOUR_PRICE)
    s = str(text).strip()
    if "=" not in s:
        return _positive("gpu-hour-price", _number(s, "give USD per GPU-hour (2.5) or NAME=USD pairs "
                                                     "(dgx-h100=2.5,dgx-h200=3.1)"), MAX_GPU_HOUR_PRICE)
    out: dict[str, float] = {}
    for item in s.split(","):
        name, _, usd = item.partition("=")
        if not name.strip():
            raise PlanInputError(f"--gpu-hour-price {item!r}: each entry is NAME=USD, e.g. dgx-h100=2.5")
        if name.strip() in out:
            raise PlanInputError(f"--gpu-hour-price {item!r}: {name.strip()} is priced twice; give each cluster once")
        out[name.strip()] = _positive("gpu-hour-price", _number(usd, "each entry is NAME=USD, e.g. dgx-h100=2.5",
                                                                item), MAX_GPU_HOUR_PRICE)
    return out


def check_price_names(price: float | dict[str, float] | None, clusters: list[str]) -> None:
    """``--gpu-hour-price NAME=USD`` prices the clusters being planned (``clusters``, their spec names): an entry
    naming another cluster would be ignored (a typo, or a price for a cluster left out, silently costed at the
    cluster's own price), so it is refused, naming the clusters. One number prices every cluster."""
    if not isinstance(price, dict):
        return
    unknown = [k for k in price if k not in clusters]
    if unknown:
        bad = ",".join(f"{k}={price[k]:g}" for k in unknown)
        raise PlanInputError(f"--gpu-hour-price {bad}: not a cluster being planned; NAME is one of "
                             f"{', '.join(clusters)} (or give one USD for every cluster)")


def _number(text: str, hint: str, shown: str | None = None) -> float:
    try:
        return float(text)
    except ValueError:
        raise PlanInputError(f"--gpu-hour-price {shown if shown is not None else text!r}: {hint}") from None


def cost_options(train_tokens: float | None, *, gpu_hour_price=None, async_checkpoint: bool = False,
                 interruptions_per_gpu_hour: float | None = None, restart_s: float | None = None,
                 pue: float | None = None) -> CostOptions | None:
    """Checked ``CostOptions`` (None without ``train_tokens``). Raises ``PlanInputError`` for a value out of range,
    or a cost option given without ``--train-tokens``."""
    if train_tokens is None:
        given = [f for f, v in (("gpu-hour-price", gpu_hour_price), ("interruption-rate", interruptions_per_gpu_hour),
                                ("restart-s", restart_s), ("pue", pue)) if v is not None]
        if async_checkpoint:
            given.append("async-checkpoint")
        if given:
            raise PlanInputError(f"--{given[0]} applies to the cost of training: give --train-tokens too")
        return None
    tokens = _positive("train-tokens", train_tokens, MAX_TRAIN_TOKENS)
    return CostOptions(
        train_tokens=tokens, gpu_hour_price=parse_price(gpu_hour_price), async_checkpoint=bool(async_checkpoint),
        interruptions_per_gpu_hour=None if interruptions_per_gpu_hour is None else _positive(
            "interruption-rate", interruptions_per_gpu_hour, 0.1),
        restart_s=None if restart_s is None else _positive("restart-s", restart_s, 86400.0, lower_inclusive=0.0),
        pue=None if pue is None else _positive("pue", pue, 3.0, lower_inclusive=1.0))


def _r(x: float | None) -> float | None:
    """6 significant digits, as the rest of the document (None stays None)."""
    return None if x is None else _round6(x)


def plan_cost(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, ev: Evaluation, num_gpus: int,
              opts: CostOptions) -> CostInfo | None:
    """The ``cost`` block of one evaluated plan (None when it has no step estimate)."""
    if ev.step is None:
        return None
    usd, date, source = opts.price_for(cluster)
    t = training_cost(
        train_tokens=opts.train_tokens, tokens_per_s=ev.step.tokens_per_s, step_s=ev.step.step_s,
        tokens_per_step=job.tokens_per_step, num_gpus=num_gpus, gpus_per_node=cluster.node.gpus_per_node,
        ckpt_bytes=checkpoint_bytes(model, job.framework, ev.parallel), ops=cluster.operations,
        async_checkpoint=opts.async_checkpoint, interruptions_per_gpu_hour=opts.interruptions_per_gpu_hour,
        restart_s=opts.restart_s, pue=opts.pue, usd_per_gpu_hour=usd)
    if t.goodput_fraction < MIN_GOODPUT:
        from .errors import NoFeasiblePlan
        raise NoFeasiblePlan(f"the run never finishes: a {num_gpus}-GPU job is interrupted every {t.mtbf_s:.3g} s on "
                             f"average, restarts take {t.restart_s:.3g} s and checkpoints every "
                             f"{t.checkpoint_interval_s:.3g} s: goodput {t.goodput_fraction:.2g} (< {MIN_GOODPUT:g}); "
                             f"lower --interruption-rate or --restart-s, or use fewer GPUs")
    return CostInfo(
        train_tokens=_r(t.train_tokens), steps=t.steps, wall_clock_days=_r(t.failure_free_s / SECONDS_PER_DAY),
        effective_days=_r(t.effective_s / SECONDS_PER_DAY), gpu_hours=_r(t.gpu_hours),
        goodput_fraction=_r(t.goodput_fraction), checkpoint_bytes=round(t.checkpoint_bytes),
        checkpoint_write_s=_r(t.checkpoint_write_s), checkpoint_blocking_s=_r(t.checkpoint_blocking_s),
        checkpoint_interval_s=_r(t.checkpoint_interval_s), checkpoint_interval_steps=t.checkpoint_interval_steps,
        async_checkpoint=t.async_checkpoint, mtbf_s=_r(t.mtbf_s), restart_s=_r(t.restart_s),
        expected_interruptions=_r(t.expected_interruptions),
        it_power_kw=None if t.it_power_w is None else _r(t.it_power_w / 1e3), pue=_r(t.pue),
        energy_mwh=_r(t.energy_mwh), energy_scope=t.energy_scope, usd=_r(t.usd), usd_per_gpu_hour=_r(usd),
        price_date=date, price_source=source)


def attach_costs(doc: PlanDocument, evaluations: list[Evaluation], model: ModelSpec, cluster: ClusterSpec,
                 job: TrainingJob, num_gpus: int, opts: CostOptions | None) -> PlanDocument:
    """Fill ``plans[i].cost`` of ``doc`` (built from ``evaluations`` in the same order); a no-op without options."""
    if opts is not None:
        for info, ev in zip(doc.plans, evaluations):
            info.cost = plan_cost(model, cluster, job, ev, num_gpus, opts)
    return doc
