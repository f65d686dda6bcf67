"""Optimizer step time on one GPU (seconds): memory-bound fused Adam over the local parameters."""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec

from .config import ParallelConfig
from .gemm import hbm_rate
from .memory import StageParams

#: HBM bytes moved per local parameter by one fused Adam step (4+4+4+4 read, 4+4+4 write, 2 write = 30, plus
#: the fp32 gradient zeroing 4): derived from the mixed-precision Adam state layout (ZeRO paper Sec. 3.1).
ADAM_HBM_BYTES_PER_PARAM = 34


def local_params(par: ParallelConfig, stage: StageParams) -> float:
    """Parameters of ``stage`` whose optimizer state this rank updates: ZeRO >= 1 shards dense parameters over
    dp x cp and expert parameters over expert-dp."""
    shard = par.dp * par.cp
    return stage.dense / (shard if par.zero_stage >= 1 else 1) + \
        stage.expert / (par.expert_dp if par.zero_stage >= 1 else 1)


def optimizer_step_s(cluster: ClusterSpec, par: ParallelConfig, stage: StageParams) -> float:
    """Seconds of one Adam step over ``stage``'s local parameters (``local_params``): ``ADAM_HBM_BYTES_PER_PARAM``
    per parameter at the HBM bandwidth."""
    return ADAM_HBM_BYTES_PER_PARAM * local_params(par, stage) / hbm_rate(cluster)
