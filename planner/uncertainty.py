"""How far a step-time prediction can be trusted: an interval from the cross-validated residuals of its class.

Each published run of the dev rows was predicted by constants fitted without its source group
(``planner.calibration.cross_validate``, leave-one-source-group-out); its residual is
``log(measured step time / predicted step time)``. Runs are grouped in classes by what changes the model's error
most: GPU generation (Ampere, Hopper, Blackwell), number format (16-bit, FP8), dense or MoE, and scale (GPUs:
up to 64, up to 1024, more). A prediction's interval is ``step_s x exp(+-q)`` with ``q`` the ``INTERVAL_QUANTILE``
quantile of ``|residual|`` in the most specific class that holds at least ``MIN_CLASS_ROWS`` runs (backing off by
dropping scale, then format, then generation, down to all runs). The residuals ship as data
(``planner/data/step_time_residuals.json``, written by ``benchmarks/fit_step_time.py --write-residuals``), so no
fit runs when planning.

Two plans are effectively tied when each one's step time lies inside the other's interval.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from cluster_specs.spec import ClusterSpec
from cost_models.config import TrainingJob
from model_zoo.spec import ModelSpec

#: Share of the class's cross-validated runs whose error the interval covers (central 80%).
INTERVAL_QUANTILE = 0.8
#: Fewest runs a class needs for its own quantile; smaller classes back off to a coarser one.
MIN_CLASS_ROWS = 5
#: Class dimensions, most specific first; backing off drops them from the end.
CLASS_KEYS = ("arch", "gpu", "precision", "scale")
#: GPU generation by GPU name prefix (cluster ``gpu.name``).
GENERATIONS = (("GB", "blackwell"), ("B", "blackwell"), ("H", "hopper"), ("A", "ampere"), ("MI", "cdna"))


def _residuals_path() -> Path:
    return Path(str(resources.files("planner") / "data" / "step_time_residuals.json"))


def step_class(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int) -> dict[str, str]:
    """The residual class of a prediction: ``arch`` (dense / moe), ``gpu`` (generation), ``precision`` (16-bit /
    fp8) and ``scale`` (le64 / le1024 / gt1024 GPUs)."""
    name = cluster.gpu.name.upper()
    gen = next((g for p, g in sorted(GENERATIONS, key=lambda x: -len(x[0])) if name.startswith(p)), "other")
    scale = "le64" if num_gpus <= 64 else ("le1024" if num_gpus <= 1024 else "gt1024")
    return {"arch": "moe" if model.moe is not None else "dense", "gpu": gen,
            "precision": "fp8" if job.precision == "fp8" else "16-bit", "scale": scale}


def class_key(cls: dict[str, str], depth: int) -> str:
    """``arch/gpu/...`` over the first ``depth`` class dimensions (``"all"`` for none)."""
    return "/".join(cls[k] for k in CLASS_KEYS[:depth]) or "all"


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of ``values`` (numpy's default method)."""
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (pos - lo)


def class_table(classes: Sequence[dict[str, str]], residuals: Sequence[float]) -> dict[str, dict[str, Any]]:
    """``{class key: {rows, abs_quantile, mean}}`` at every back-off depth, from per-run classes and residuals."""
    out: dict[str, dict[str, Any]] = {}
    for depth in range(len(CLASS_KEYS) + 1):
        by: dict[str, list[float]] = {}
        for c, r in zip(classes, residuals):
            by.setdefault(class_key(c, depth), []).append(r)
        for k, rs in by.items():
            out[k] = {"rows": len(rs), "abs_quantile": _quantile([abs(r) for r in rs], INTERVAL_QUANTILE),
                      "mean": sum(rs) / len(rs)}
    return dict(sorted(out.items()))


@lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    return json.loads(_residuals_path().read_text(encoding="utf-8"))["classes"]


@dataclass(frozen=True)
class Interval:
    """``low`` <= step seconds <= ``high`` (the ``INTERVAL_QUANTILE`` share of cross-validated runs of ``cls``
    fell within ``x exp(+-half_width)``), from ``rows`` runs."""

    low: float
    high: float
    half_width: float
    cls: str
    rows: int

    @property
    def percent(self) -> float:
        """Half-width as a percentage of the step time (the upper side: ``exp(q) - 1``)."""
        return 100.0 * (math.exp(self.half_width) - 1.0)


def step_interval(step_s: float, cls: dict[str, str]) -> Interval:
    """The interval of a predicted ``step_s`` of class ``cls`` (``step_class``)."""
    table = _table()
    for depth in range(len(CLASS_KEYS), -1, -1):
        entry = table.get(class_key(cls, depth))
        if entry is not None and entry["rows"] >= MIN_CLASS_ROWS:
            q = float(entry["abs_quantile"])
            return Interval(step_s * math.exp(-q), step_s * math.exp(q), q, class_key(cls, depth), entry["rows"])
    raise LookupError("step_time_residuals.json has no class with enough rows")  # pragma: no cover


def tied_with_best(plans: Sequence[tuple[float, float, float]]) -> int:
    """How many of the leading plans (best first; each ``(step_s, low, high)``) lie within each other's interval
    with the best one: plans ``j`` with ``step_j <= high_1`` and ``step_1 >= low_j``, counted until the first that
    does not (1 = no tie; 0 for no plan)."""
    if not plans:
        return 0
    s1, _, h1 = plans[0]
    n = 1
    for s, lo, _ in plans[1:]:
        if not (s <= h1 and s1 >= lo):
            break
        n += 1
    return n


def step_cell(tim: Any) -> str:
    """A plan table's step cell: step seconds with the half-width of its uncertainty interval
    (``time.step_s_high``, a plan document's ``TimeInfo``), e.g. ``24.176 ±14%``; ``-`` without a time."""
    if tim is None:
        return "-"
    if not tim.step_s_high or not tim.step_s:
        return f"{tim.step_s:.3f}"
    return f"{tim.step_s:.3f} ±{100 * (tim.step_s_high / tim.step_s - 1):.0f}%"


def tie_note(plans: Sequence[Any]) -> str | None:
    """The line under a plans table (``plan``, ``plan`` over pools) when its top plans lie within each other's
    uncertainty interval (``tied_with_best`` over the feasible plans with an interval, best first); None otherwise."""
    spans = [(p.time.step_s, p.time.step_s_low, p.time.step_s_high) for p in plans
             if p.feasible and p.time is not None and p.time.step_s_low is not None]
    n = tied_with_best(spans)
    if n < 2:
        return None
    return (f"plans 1-{n} are effectively tied: their step times lie within each other's ± interval (the "
            f"cross-validated error of 80% of published runs like these)")


def write_residuals(cv: Any, rows: Sequence[dict[str, Any]], path: Path | None = None) -> Path:
    """Write the cross-validated residuals (``planner.calibration.CrossValidation`` of ``rows``) and their class
    table to ``path`` (default: the packaged ``step_time_residuals.json``). Deterministic output."""
    from .published_rows import build_inputs
    by_id = {str(r["id"]): r for r in rows}
    runs, classes, residuals = [], [], []
    for rid, err in zip(cv.ids, cv.logo):
        model, cluster, job, par, _, _ = build_inputs(by_id[rid])
        c = step_class(model, cluster, job, par.world_size)
        r = math.log(1.0 + err)  # error = predicted / measured throughput - 1 = measured / predicted step - 1
        classes.append(c)
        residuals.append(r)
        runs.append({"id": rid, "class": class_key(c, len(CLASS_KEYS)), "residual": float(f"{r:.6g}")})
    table = {k: {"rows": v["rows"], "abs_quantile": float(f"{v['abs_quantile']:.6g}"),
                 "mean": float(f"{v['mean']:.6g}")} for k, v in class_table(classes, residuals).items()}
    doc = {
        "generated_by": "benchmarks/fit_step_time.py --write-residuals (planner.calibration.cross_validate)",
        "dataset": "planner/data/published_runs_dev.yaml",
        "residual": "log(measured step time / predicted step time), each run predicted by the step-time constants "
                    "fitted without its source group (leave-one-source-group-out)",
        "interval": f"step_s x exp(+-abs_quantile): the {INTERVAL_QUANTILE:g} quantile of |residual| in the most "
                    f"specific class ({'/'.join(CLASS_KEYS)}) with >= {MIN_CLASS_ROWS} runs",
        "cross_validated_mape_percent": float(f"{cv.logo_mape:.6g}"),
        "in_sample_mape_percent": float(f"{cv.in_sample_mape:.6g}"),
        "classes": table,
        "runs": sorted(runs, key=lambda x: x["id"]),
    }
    out = path or _residuals_path()
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    _table.cache_clear()
    return out
