"""``plan3d validate``: the step-time model against published, measured training runs.

Each row of the dataset (``planner/data/published_runs_dev.yaml``, the development rows of
``/work/shared/data/published_runs.yaml`` with their sources) is turned into a model, a cluster, a training job and
a parallel configuration; ``cost_models.step_time.estimate_step`` predicts the step, and the prediction is compared
with the row's own measured number, like with like:

* ``tokens_per_s_per_gpu`` (or ``step_time_s``) when the row has one: free of FLOP conventions;
* otherwise ``tflops_per_gpu`` in the row's own FLOP convention (``setup.flops_convention``, chosen from the row's
  ``metric_definition``; where a row has both tokens/s and TFLOP/s the implied FLOPs per token confirm the choice,
  see ``published_rows.implied_flops_per_token``);
* otherwise ``mfu`` (model FLOPs over the dense 16-bit peak).

What a row needs beyond its published columns, and what each row means as plan3d's inputs, is
``planner/published_rows.py`` (the row's ``setup`` block: ``planner/row_options.py``); nothing here or there is
keyed on a source's name. A row that states the GPU count and the batch but no layout is a tuned run, compared
through plan3d's best plan in the group ``tuned_runs`` (``planner/tuned_runs.py``). Rows that cannot be evaluated
at all (no layer shapes and no model of that name, no GPU count or batch, no cluster spec for the GPU) are listed
as skipped, with the reason.

The error of a row is ``predicted / measured - 1``; MAPE is the mean of ``|error|`` (in percent) over the
evaluated rows, overall and per ``source.group``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.step_time import StepEstimate, estimate_step
from model_zoo.spec import ModelSpec

from .errors import PlanInputError
# the dataset and what a row means
from .published_rows import (build_inputs, default_dataset, load_rows, row_convention, row_flops_per_token,
                             row_step_options)

#: Project thresholds (issue "Step-time and MFU model ..."): overall MAPE and per source group with >= 3 rows.
DEFAULT_MAX_MAPE = 7.0
DEFAULT_MAX_GROUP_MAPE = 10.0
MIN_GROUP_ROWS = 3


@dataclass
class RowResult:
    """One dataset row: its inputs, the measured and predicted metric, the signed error, or why it was skipped."""

    id: str
    group: str
    gpu: str
    num_gpus: int | None
    config: str = ""
    metric: str = ""
    convention: str = ""
    measured: float | None = None
    predicted: float | None = None
    error: float | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    measured_tokens_per_s_per_gpu: float | None = None
    predicted_tflops_per_gpu: float | None = None
    measured_tflops_per_gpu: float | None = None
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None
    #: the row's ``source.group`` (``group`` is ``tuned_runs`` for a tuned run) and whether it is one
    source_group: str = ""
    tuned: bool = False
    step: StepEstimate | None = None
    #: constraint violations ``planner.checks`` finds for this published (hence feasible) configuration
    violations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("id", "group", "source_group", "tuned", "gpu", "num_gpus", "config",
                                           "metric", "convention",
                                           "measured", "predicted", "error", "predicted_tokens_per_s_per_gpu",
                                           "measured_tokens_per_s_per_gpu", "predicted_tflops_per_gpu",
                                           "measured_tflops_per_gpu", "assumptions", "skipped", "violations")}
        if self.step is not None:
            d["breakdown"] = {"step_s": self.step.step_s, "compute_s": self.step.compute_s,
                              "bubble_s": self.step.bubble_s, "optimizer_s": self.step.optimizer_s,
                              "exposed_comm_s": dict(sorted(self.step.exposed_comm_s.items()))}
        return _round(d)


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


@dataclass
class ValidationReport:
    rows: list[RowResult]
    #: leave-one-source-group-out errors (``planner.calibration.CrossValidation``), when asked for
    cross_validation: Any = None

    @property
    def evaluated(self) -> list[RowResult]:
        return [r for r in self.rows if r.error is not None]

    @property
    def infeasible(self) -> list[RowResult]:
        """Evaluated published rows that ``planner.checks`` calls infeasible (they all ran, so each is a model gap)."""
        return [r for r in self.evaluated if r.violations]

    @property
    def mape(self) -> float:
        ev = self.evaluated
        return 100.0 * sum(abs(r.error) for r in ev) / len(ev) if ev else float("nan")

    def group_mape(self) -> dict[str, tuple[int, float]]:
        out: dict[str, list[float]] = {}
        for r in self.evaluated:
            out.setdefault(r.group, []).append(abs(r.error))
        return {g: (len(v), 100.0 * sum(v) / len(v)) for g, v in sorted(out.items())}

    def failures(self, max_mape: float, max_group_mape: float, min_group_rows: int = MIN_GROUP_ROWS) -> list[str]:
        msgs = []
        if not self.evaluated:
            return ["no row could be evaluated"]
        if self.mape > max_mape:
            msgs.append(f"overall MAPE {self.mape:.2f}% > --max-mape {max_mape:g}%")
        for g, (n, m) in self.group_mape().items():
            if n >= min_group_rows and m > max_group_mape:
                msgs.append(f"group {g} MAPE {m:.2f}% > --max-group-mape {max_group_mape:g}%")
        if self.cross_validation is not None:
            msgs += self.cross_validation.failures(max_mape, max_group_mape, min_group_rows)
        return msgs

    def to_dict(self) -> dict[str, Any]:
        d = {
            "mape_percent": self.mape if self.evaluated else None,  # strict JSON has no NaN
            "evaluated": len(self.evaluated),
            "skipped": len(self.rows) - len(self.evaluated),
            "predicted_infeasible": [r.id for r in self.infeasible],
            "groups": {g: {"rows": n, "mape_percent": m} for g, (n, m) in self.group_mape().items()},
            "rows": [r.to_dict() for r in self.rows],
        }
        if self.cross_validation is not None:
            self.cross_validation.annotate(d)
        return _round(d)


def validate_row(row: dict[str, Any], check_feasibility: bool = True) -> RowResult:
    """One row: predicted vs measured throughput, or why it was skipped. A row that states no layout but the GPUs
    and the batch is a tuned run (``planner.tuned_runs``): compared through plan3d's best plan, group
    ``TUNED_GROUP``."""
    from .tuned_runs import TUNED_GROUP, best_tuned_plan, is_tuned_run, tuned_run_inputs

    group = str((row.get("source") or {}).get("group", ""))
    hw = row.get("hardware") or {}
    res = RowResult(id=str(row["id"]), group=group, gpu=str(hw.get("gpu") or "?").split(" (")[0],
                    num_gpus=hw.get("num_gpus"), source_group=group)
    built = build_inputs(row)
    if isinstance(built, str) and is_tuned_run(row):
        res.group, res.tuned, notes = TUNED_GROUP, True, []
        t = tuned_run_inputs(row, notes)
        plan = best_tuned_plan(row, t, notes) if not isinstance(t, str) else t
        if isinstance(plan, str):
            res.skipped = plan
            return res
        par, job, st = plan
        model, cluster, fw = t.model, t.cluster, t.framework
    elif isinstance(built, str):
        res.skipped = built
        return res
    else:
        model, cluster, job, par, fw, notes = built
        fw, opts = row_step_options(row, fw, notes)
        st = estimate_step(model, cluster, job, par, framework=fw, **opts)
    res.assumptions = notes
    res.config = (f"tp{par.tp} pp{par.pp} dp{par.dp} cp{par.cp} ep{par.ep} v{par.vpp} mbs{par.micro_batch_size} "
                  f"gbs{job.global_batch_size} s{job.seq_length} {job.precision} rc={par.recompute}")
    res.step = st
    if not _compare(res, row, model, cluster, job, par, st):
        return res
    if check_feasibility:
        from .evaluation import evaluate
        ev = evaluate(model, cluster, job, par, par.world_size, memory_headroom=0.0,
                      framework={"torchtitan": "torchtitan", "deepspeed": "deepspeed"}.get(fw.split("_")[0], "megatron"))
        res.violations = [v.message for v in ev.violations]
    return res


def _compare(res: RowResult, row: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, job: TrainingJob,
             par: ParallelConfig, st: StepEstimate) -> bool:
    """Fill the row's metric, measured and predicted values and the signed error, like with like (module
    docstring); False (with ``res.skipped``) when the row has no measured throughput."""
    conv = row_convention(row)
    res.convention = conv
    tok_gpu = st.tokens_per_s / par.world_size
    fpt = row_flops_per_token(model, job, par, conv)
    res.predicted_tokens_per_s_per_gpu = tok_gpu
    res.predicted_tflops_per_gpu = tok_gpu * fpt / 1e12
    m = row.get("measured") or {}
    res.measured_tokens_per_s_per_gpu = m.get("tokens_per_sec_per_gpu")
    res.measured_tflops_per_gpu = m.get("tflops_per_gpu")
    if m.get("tokens_per_sec_per_gpu"):
        res.metric, res.measured, res.predicted = "tokens/s/GPU", float(m["tokens_per_sec_per_gpu"]), tok_gpu
    elif m.get("step_time_s"):
        res.metric, res.measured, res.predicted = "step s", float(m["step_time_s"]), st.step_s
        res.error = float(m["step_time_s"]) / st.step_s - 1  # throughput error: measured time / predicted time
    elif m.get("tflops_per_gpu"):
        res.metric, res.measured, res.predicted = f"TFLOP/s ({conv})", float(m["tflops_per_gpu"]), \
            res.predicted_tflops_per_gpu
    elif m.get("mfu"):
        peak = cluster.gpu.peak_flops.get("bf16", 0.0)
        res.metric, res.measured, res.predicted = "MFU", float(m["mfu"]), res.predicted_tflops_per_gpu * 1e12 / peak
    else:
        res.skipped = "no measured throughput"
        return False
    if res.error is None:
        res.error = res.predicted / res.measured - 1
    return True


def run_validation(path: str | Path | None = None) -> ValidationReport:
    """Validate every row of ``path`` (default: the packaged dev rows).

    Raises:
        PlanInputError: the file is missing or malformed, or a row holds a value of the wrong type or an
            impossible one (the message names the file and the row).
    """
    name = Path(path).name if path is not None else default_dataset().name
    out = []
    for r in load_rows(path):
        try:
            res = validate_row(r)
        except PlanInputError as exc:
            if str(exc).startswith("--dataset"):
                raise
            raise PlanInputError(f"--dataset: {name}: {exc}") from None
        except (ArithmeticError, ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if isinstance(exc, ValidationError):
                e = exc.errors()[0]
                msg = f"{exc.title}.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}, got {e.get('input')!r}"
            raise PlanInputError(f"--dataset: {name}: row {r.get('id')!r}: invalid value ({msg})") from None
        m = res.measured
        if res.skipped is None and (m is None or not math.isfinite(m) or m <= 0):
            raise PlanInputError(f"--dataset: {name}: row {r.get('id')!r}: measured {res.metric} must be a "
                                 f"positive number, got {m!r}")
        out.append(res)
    return ValidationReport(out)


def report_json(rep: ValidationReport) -> str:
    """The report as strict JSON (a non-finite number is a ``PlanInternalError`` naming the field)."""
    from .document import dumps_finite
    return dumps_finite(rep.to_dict(), "validate report", indent=2, sort_keys=False)
