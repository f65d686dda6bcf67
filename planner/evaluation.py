"""Evaluate one configuration: memory, step time and every constraint."""
from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from cost_models.layout import LayoutError
from cost_models.memory import MemoryEstimate, estimate_memory
from cost_models.step_time import StepEstimate, estimate_step
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM, Violation, check_config
from .launch_options import launched_overlap_dp


@dataclass
class Evaluation:
    """A configuration with its memory and time estimates and its violations (empty = feasible)."""

    parallel: ParallelConfig
    memory: MemoryEstimate | None
    step: StepEstimate | None
    violations: list[Violation] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.violations


def evaluate(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, num_gpus: int,
             memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str = "megatron",
             convention: FlopsConvention = "megatron", time_infeasible: bool = True) -> Evaluation:
    """Full evaluation of ``par``; never raises for an invalid config (it is reported as violations).

    ``framework`` decides both the rules checked and the model-state bytes of the memory model
    (``job.framework`` is overridden by it, so the two can never disagree). ``time_infeasible`` False: a
    configuration that breaks a rule or does not fit in memory is returned without its step time (``step`` None),
    which the search's re-scoring does not need and which costs most of an evaluation.
    """
    if job.framework != framework:
        job = job.model_copy(update={"framework": framework})
    structural = check_config(model, cluster, job, par, num_gpus, framework=framework)
    # without these the cost models have no layout to estimate (the schedule rules: its op order cannot be built)
    hard = {"layers_pp", "world_size", "precision", "schedule_v_chunks", "schedule_v_split", "schedule_dualpipe_pp",
            "schedule_microbatches", "schedule_combined_vpp"}
    if any(v.name in hard for v in structural) or par.num_microbatches(job.global_batch_size) < 1:
        return Evaluation(par, None, None, structural)
    try:
        mem = estimate_memory(model, cluster, job, par)
        violations = check_config(model, cluster, job, par, num_gpus, memory=mem, memory_headroom=memory_headroom,
                                  framework=framework)
        if violations and not time_infeasible:
            return Evaluation(par, mem, None, violations)
        # costed as the plan is launched: the data-parallel overlap the emitter switches on (launch_options)
        step = estimate_step(model, cluster, job, par, convention,
                             overlap_dp=launched_overlap_dp(framework, par.dp, par.cp, par.pp))
    except LayoutError as e:  # pragma: no cover - check_config reports it first
        return Evaluation(par, None, None, structural + [Violation("layers_pp", str(e))])
    return Evaluation(par, mem, step, violations)
