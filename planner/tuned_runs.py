"""Tuned runs: published rows that state no layout, compared through plan3d's own search.

Many published throughput figures give the model, the GPUs, the batch and the measured tokens/s or TFLOP/s, but not
the parallel layout the authors tuned (issue 9 item 5). Such a row is still comparable: the authors ran the best
layout they found, and ``plan3d plan`` proposes the best layout it finds, so the row is compared with plan3d's best
plan for the same job. ``tuned_run_inputs`` pins whatever the row states (tp, pp, cp, ep, vpp, micro-batch, ZeRO
stage, recompute, sequence parallel; dp by filtering) and ``evaluate_tuned_run`` runs ``planner.search.run_search``
(CP-SAT, the planner's default memory headroom, the row's framework rules) for the rest. Its top ``TOP_K`` plans are
re-estimated with the row's own settings (framework kernel set, overlaps, recipe options: the ``setup`` block) and
the fastest is the prediction.

These rows form their own validation group, ``TUNED_GROUP``: their error mixes the step-time model's error with the
search's (a planner that finds a faster layout than the authors reads as a too-fast prediction), so they are reported
apart from the rows whose layout is stated; each keeps its source group in ``RowResult.source_group``.

A row qualifies when it states the GPU count and the global batch but not both tp and pp; rows missing the GPU
count or the batch stay skipped, with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .space import SearchSpace

#: Validation group of the rows compared through the search.
TUNED_GROUP = "tuned_runs"
#: Plans taken from the search and re-estimated with the row's own settings (the search ranks with the planner's
#: framework defaults; the row's overlaps and recipe options can reorder the first few).
TOP_K = 5
#: Planner framework whose rules and memory model the search uses, by the row's framework (NeMo and
#: Megatron-Bridge recipes run Megatron-LM).
_PLANNER_FRAMEWORK = {"megatron": "megatron", "nemo": "megatron", "deepspeed": "deepspeed",
                      "torchtitan": "torchtitan"}


def is_tuned_run(row: dict[str, Any]) -> bool:
    """The row states the GPU count and the global batch but not its full layout (tp and pp)."""
    p = row.get("parallel") or {}
    hw = row.get("hardware") or {}
    return bool(hw.get("num_gpus")) and p.get("global_batch_size") is not None and (
        p.get("tp") is None or p.get("pp") is None)


def _pin(value: Any) -> tuple[int, ...] | None:
    return (int(value),) if value is not None else None


@dataclass(frozen=True)
class TunedInputs:
    """What the search gets for one tuned-run row: the job, the pinned space, the GPU count and the stated dp."""

    model: ModelSpec
    cluster: ClusterSpec
    job: TrainingJob
    space: SearchSpace
    num_gpus: int
    framework: str
    dp: int | None
    pinned: tuple[str, ...]


def tuned_run_inputs(row: dict[str, Any], notes: list[str]) -> TunedInputs | str:
    """The model, cluster, job and pinned search space of a tuned-run row, or why it cannot be built."""
    from .row_options import row_setup
    from .published_rows import row_framework, row_model_cluster_seq, row_precision

    fw = row_framework(row)
    p = row.get("parallel") or {}
    hw = row.get("hardware") or {}
    built = row_model_cluster_seq(row, fw, notes)
    if isinstance(built, str):
        return built
    model, cluster, seq = built
    setup = row_setup(row)
    job_extra = {k: getattr(setup, k) for k in ("cross_entropy_fusion_impl", "cross_entropy_loss_fusion")
                 if getattr(setup, k) is not None}
    job = TrainingJob(global_batch_size=int(p["global_batch_size"]), seq_length=int(seq),
                      precision=row_precision(p.get("precision"), notes),
                      flash_attention=setup.flash_attention is not False, **job_extra)
    zero = p.get("zero_stage")
    if zero is None and p.get("distributed_optimizer") is not None:
        zero = 1 if p["distributed_optimizer"] else 0
    rc = str(p.get("recompute") or setup.recompute or "").lower().split(" ")[0] or None
    sp = p.get("sequence_parallel")
    space = SearchSpace(
        tp=_pin(p.get("tp")), pp=_pin(p.get("pp")), cp=_pin(p.get("cp")), ep=_pin(p.get("ep")),
        vpp=_pin(p.get("virtual_pipeline")),
        **({"micro_batch_size": (int(p["micro_batch_size"]),)} if p.get("micro_batch_size") else {}),
        **({"zero_stage": (int(zero),)} if zero is not None else {}),
        **({"recompute": (rc,)} if rc in ("none", "selective", "full") else {}),
        **({"sequence_parallel": (bool(sp),)} if sp is not None else {}))
    pinned = tuple(k for k, v in (("tp", p.get("tp")), ("pp", p.get("pp")), ("cp", p.get("cp")), ("ep", p.get("ep")),
                                  ("vpp", p.get("virtual_pipeline")), ("micro_batch_size", p.get("micro_batch_size")),
                                  ("zero_stage", zero), ("recompute", rc), ("sequence_parallel", sp),
                                  ("dp", p.get("dp"))) if v is not None)
    return TunedInputs(model, cluster, job, space, int(hw["num_gpus"]), fw,
                       int(p["dp"]) if p.get("dp") else None, pinned)


def best_tuned_plan(row: dict[str, Any], t: TunedInputs, notes: list[str]) -> tuple[ParallelConfig, TrainingJob, Any] | str:
    """The fastest of the search's top plans, re-estimated with the row's settings: (config, job, StepEstimate),
    or why there is none."""
    from cost_models.step_time import estimate_step

    from .row_options import row_options
    from .search import run_search
    from .published_rows import row_step_options

    planner_fw = _PLANNER_FRAMEWORK[t.framework]
    res = run_search(t.model, t.cluster, t.job, t.num_gpus, top_k=TOP_K if t.dp is None else 4 * TOP_K,
                     space=t.space, framework=planner_fw)
    plans = [e.parallel for e in res.plans if t.dp is None or e.parallel.dp == t.dp][:TOP_K]
    if not plans:
        return (f"tuned run: no feasible plan for {t.num_gpus} GPUs with the stated "
                f"{', '.join(t.pinned) or 'job'} ({res.num_candidates} candidates)")
    opts = row_options(row, t.framework)
    job = TrainingJob(**{**t.job.model_dump(), **opts.job}) if opts.job else t.job
    fw, step_opts = row_step_options(row, t.framework)
    best = None
    for par in plans:
        # recipe settings (setup block); the ZeRO stage and recompute are the plan's (pinned when stated)
        extra = {k: v for k, v in opts.parallel.items() if k not in ("zero_stage", "recompute", "recompute_modules")
                 or (k == "recompute_modules" and par.recompute == "selective")}
        par = ParallelConfig(**{**par.model_dump(), **extra}) if extra else par
        st = estimate_step(t.model, t.cluster, job, par, framework=fw, **step_opts)
        if best is None or st.step_s < best[2].step_s:
            best = (par, job, st)
    notes.append(f"tuned run: layout planned by plan3d (best of the search's top {len(plans)} re-estimated with the "
                 f"row's settings; {res.num_candidates} candidates), pinned: {', '.join(t.pinned) or 'nothing'}")
    notes.extend(opts.notes)
    return best
