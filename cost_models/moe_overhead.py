"""MoE work that is neither a GEMM, an HBM stream nor a collective, per MoE layer on one GPU (seconds per
micro-batch): routing bookkeeping per routed token copy and host time per local expert (dropless routing syncs
with the host), unless the step is CUDA-graphed.
"""
from __future__ import annotations

from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import ParallelConfig, TrainingJob

#: Seconds per *local* expert per MoE layer per micro-batch (forward + backward; 1/3 forward) on top of the
#: GPU work, unless the step is captured in a CUDA graph, by the expert GEMMs' number format. Dropless routing syncs
#: the per-expert token counts to the host before the expert GEMMs, so the GPU waits while the CPU issues the
#: per-expert work: in BF16 one grouped GEMM per fc1/fc2 (nothing per expert); in FP8 Transformer Engine
#: quantizes each expert's input and weight separately and, on the grouped path, issues per-expert GEMMs
#: (``mx``: MXFP8 / blockwise, scales computed inside the cast kernel); per-tensor scaling (``cs``: current
#: scaling, or delayed scaling) adds an amax reduction per expert tensor before each cast. Fitted on the dev rows
#: (benchmarks/fit_step_time.py), constrained by: ``bf16`` 0 by the Megatron MoE recipe Qwen3-30B-A3B H100 BF16
#: row (234 TFLOP/s at micro-batch 1: the GPU work alone explains it, -6.9% with no host time); ``mx`` 0.4 ms
#: by the Megatron-Bridge 25.11 Qwen3-30B-A3B B200 (micro-batch 1: ~9.2 ms per layer per micro-batch measured,
#: ~3 ms of GPU work) and GB200 (micro-batch 4) rows and the DeepSeek-V3 MXFP8 rows; ``cs`` 1.2 ms by the two H100
#: FP8 rows of Megatron-Bridge (Qwen3-30B-A3B FP8-CS, 121 TFLOP/s, and DeepSeek-V3 25.09, per-tensor FP8: the
#: row's note gives the blockwise variant as the alternative). Per-tensor FP8 on Hopper is thus ~3x the MXFP8
#: host cost per expert, the largest single calibration uncertainty here (two rows).
MOE_EXPERT_HOST_S = {"bf16": 0.0, "mx": 0.4e-3, "cs": 1.2e-3}
#: Seconds per routed token copy per MoE layer (forward + backward) of routing bookkeeping that is neither GEMM
#: nor HBM-bandwidth bound (top-k, sort by expert, index computation, scatter). Fitted on the dev rows.
MOE_TOKEN_COPY_S = 2.0e-8

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them).
FIT_RANGES = {
    "MOE_EXPERT_HOST_S.bf16": FitRange(0.0, 0.4e-3, "s per local expert per layer per micro-batch",
                                       "0: one grouped GEMM per fc1/fc2; 0.4 ms: ~40 host-issued ops per expert at "
                                       "~10 us each"),
    "MOE_EXPERT_HOST_S.mx": FitRange(0.0, 1.0e-3, "s per local expert per layer per micro-batch",
                                     "per-expert quantize + GEMM launches (fwd + bwd ~20-60 ops at 5-15 us each)"),
    "MOE_EXPERT_HOST_S.cs": FitRange(0.0, 2.0e-3, "s per local expert per layer per micro-batch",
                                     "as mx plus an amax reduction per expert tensor"),
    "MOE_TOKEN_COPY_S": FitRange(0.0, 5.0e-8, "s per routed token copy per layer",
                                 "top-k, sort and scatter kernels: a few ns to tens of ns per copy at HBM speed"),
}


def expert_host_s(job: TrainingJob, fp8_recipe: str) -> float:
    """``MOE_EXPERT_HOST_S`` of the job's expert GEMM format (16-bit: ``bf16``; FP8: ``fp8_recipe``).

    Raises:
        ValueError: ``fp8_recipe`` is neither ``mx`` nor ``cs`` for an FP8 job.
    """
    if job.precision == "fp8" and fp8_recipe not in MOE_EXPERT_HOST_S:
        raise ValueError(f"fp8_recipe {fp8_recipe!r}: allowed mx, cs")
    key = "bf16" if job.precision != "fp8" else fp8_recipe
    return MOE_EXPERT_HOST_S[key]


def moe_overhead_s(model: ModelSpec, job: TrainingJob, par: ParallelConfig, layer: int, fp8_recipe: str,
                   full_cuda_graph: bool) -> tuple[float, float]:
    """(routing bookkeeping, host time) of one MoE layer, forward + backward seconds per micro-batch (1/3 of each
    in forward, 2/3 in backward); (0, 0) for dense layers. Routing: ``MOE_TOKEN_COPY_S`` per routed token copy
    (top-k, sort by expert, index/scatter kernels); host: ``expert_host_s`` per local expert (dropless routing
    syncs the token counts to the host, which then issues the per-expert kernels while the GPU waits), none under
    a full CUDA graph."""
    if model.moe is None or not model.is_moe_layer(layer):
        return 0.0, 0.0
    tok = par.micro_batch_size * job.seq_length / par.cp
    routing = MOE_TOKEN_COPY_S * tok * model.moe.top_k / par.tp
    host = 0.0 if full_cuda_graph else expert_host_s(job, fp8_recipe) * model.moe.num_experts / par.ep
    return routing, host
