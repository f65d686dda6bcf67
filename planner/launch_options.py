"""What plan3d's launches switch on where it differs from the framework's own default, so that the step time of a
plan charges what its launch runs (one place for the emitters and the evaluation).

The data-parallel reduction overlap (``overlap_dp`` of ``cost_models.step_time.estimate_step``):

* Megatron-LM: off by default (``--overlap-grad-reduce`` / ``--overlap-param-gather`` are opt-in,
  ``megatron/training/arguments.py``); plan3d's Megatron launch passes both whenever the plan has a data-parallel
  (dp x cp) group (``planner.emit.megatron``), as NVIDIA's own recipes do.
* DeepSpeed: ``overlap_comm`` (the emitted ZeRO config sets it) overlaps the reduction without pipeline
  parallelism; the ``PipelineEngine`` reduces after the whole schedule (``runtime/pipe/schedule.py`` ``ReduceGrads``).
* torchtitan: FSDP2 / DDP overlap the reduction with the backward by construction.
"""
from __future__ import annotations

from cost_models.step_time import default_overlap_dp


def megatron_overlaps_dp(dp: int, cp: int) -> bool:
    """Whether plan3d's Megatron launch passes ``--overlap-grad-reduce`` (and ``--overlap-param-gather`` with the
    distributed optimizer): whenever the dp x cp gradient group has more than one rank."""
    return dp * cp > 1


def launched_overlap_dp(framework: str, dp: int, cp: int, pp: int) -> bool:
    """``overlap_dp`` of the plan's launch (module docstring) for ``framework`` at data-parallel size ``dp``,
    context-parallel size ``cp`` and pipeline size ``pp``: Megatron's as its launch sets it, every other framework's
    its own default (``cost_models.step_time.default_overlap_dp``), which its launch keeps."""
    if framework.split("_")[0] == "megatron":
        return megatron_overlaps_dp(dp, cp)
    return default_overlap_dp(framework, pp)
