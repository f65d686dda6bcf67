"""Attention core time (``softmax(QK^T)V``, the part without weights) of one layer, on one GPU (seconds).

Fused flash attention: causal FLOPs (the kernel skips the masked half) at ``attention_efficiency`` x the 16-bit
peak; backward ``ATTN_BWD_FACTOR`` x the forward (FlashAttention-2's backward runs 5 matmuls to the forward's 2,
Dao 2023 Sec. 3.1). Unfused attention (SC21 / BLOOM era, ``TrainingJob.flash_attention`` False) runs the two
batched GEMMs at the GEMM rate and streams the ``s x s`` scores ``UNFUSED_SCORE_PASSES`` times through HBM.
"""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import BYTES_16BIT, ParallelConfig, TrainingJob
from .flops import attention_core_flops_per_token
from .gemm import framework_compute_efficiency, gemm_rate, half_dtype, hbm_rate

#: Backward / forward time of the fused attention kernel (FlashAttention-2: 5 backward matmuls vs 2 forward,
#: Dao 2023 Sec. 3.1, i.e. 2.5x the FLOPs at a similar rate).
ATTN_BWD_FACTOR = 2.5
#: Key length (tokens) at which the fused attention kernel reaches half its asymptotic efficiency. Fitted on the
#: dev rows (the NeMo long-sequence rows run 16k to 1M tokens).
ATTN_HALF_SEQ = 512.0
#: Fallback attention efficiency (fraction of the 16-bit dense peak) when the cluster has none calibrated
#: (A100, MI300X): FlashAttention-2 reaches 50-73% of A100 peak forward and somewhat less backward (Dao 2023,
#: Sec. 4.1); 0.5 is the low end.
DEFAULT_ATTENTION_EFFICIENCY = 0.5
#: HBM passes of the s x s score tensor per unfused attention forward (QK^T write, scale/mask/softmax read + write,
#: dropout mask write + apply, score x V read), ~4-8 depending on dropout (Korthikanti et al. 2022 Sec. 4.1 counts
#: 5·a·s² bytes of stored scores per layer with dropout). Fitted (8) on the SC21 rows, which ran attention dropout.
UNFUSED_SCORE_PASSES = 8.0

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them).
FIT_RANGES = {
    "ATTN_HALF_SEQ": FitRange(128.0, 2048.0, "key tokens",
                              "FlashAttention-2/3 and cuDNN forward/backward TFLOP/s against sequence length (Dao 2023 "
                              "Fig. 4-6; Shah et al. 2024 Fig. 5-6, head dim 64-256): half of the 16k rate is reached "
                              "between 256 and 1k keys"),
    "UNFUSED_SCORE_PASSES": FitRange(4.0, 10.0, "HBM passes over the s x s scores",
                                     "count of the unfused kernels: QK^T write, softmax read + write, dropout mask "
                                     "write + apply (read + write), scores x V read = 4 without dropout, 7-8 with "
                                     "(Korthikanti et al. 2022 Sec. 4.1: 5 a s^2 bytes stored per layer with dropout)"),
}


def attention_efficiency(cluster: ClusterSpec) -> float:
    """Asymptotic fused-attention efficiency of the cluster (calibration ``attention_efficiency`` of the 16-bit
    dtype), else ``DEFAULT_ATTENTION_EFFICIENCY``."""
    ae = cluster.calibration.attention_efficiency or {}
    return ae.get(half_dtype(cluster), DEFAULT_ATTENTION_EFFICIENCY)


def attention_core_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                     framework: str) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core for one micro-batch on one GPU (``a/tp`` heads,
    ``b·s/cp`` query tokens).

    Flash attention: the kernel's rate rises with the key length it streams per query block (fixed per-block
    setup, tail tiles of the causal triangle): ``eff(s) = eff_inf x s / (s + ATTN_HALF_SEQ)``. Under context
    parallelism each kernel call sees only one ring step's keys, ``s / cp`` (the sequence is split into 2 cp chunks
    for causal load balance and each rank holds two of them: Megatron-LM ``docs/source/api-guide/
    context_parallel.rst``; Transformer Engine ``AttnFuncWithCPAndKVP2P`` runs one flash-attention call per ring
    step and chunk half).
    """
    fe = framework_compute_efficiency(framework)
    b, s = par.micro_batch_size, job.seq_length
    tok = b * s / par.cp
    heads_frac = 1.0 / par.tp
    if job.flash_attention:
        fl = attention_core_flops_per_token(model, s, causal_halved=True) * tok * heads_frac
        s_key = s / par.cp
        eff = attention_efficiency(cluster) * s_key / (s_key + ATTN_HALF_SEQ)
        fwd = fl / (cluster.gpu.peak_flops[half_dtype(cluster)] * fe * eff)
        return fwd, ATTN_BWD_FACTOR * fwd
    fl = attention_core_flops_per_token(model, s, causal_halved=False) * tok * heads_frac
    scores = BYTES_16BIT * b * model.num_attention_heads * heads_frac * s * s / par.cp
    fwd = fl / (fe * gemm_rate(cluster, half_dtype(cluster))) + UNFUSED_SCORE_PASSES * scores / hbm_rate(cluster)
    return fwd, 2.0 * fwd
