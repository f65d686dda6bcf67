"""MoE work that is neither a GEMM nor a collective, per MoE layer on one GPU (seconds per micro-batch): the routing
bookkeeping (the fused router kernel, the token permutation's HBM traffic at the share of the bandwidth its kernels
were measured to reach, and a fitted remainder per routed copy), and the host time of the per-expert work that the GPU
cannot hide.

Host-bound expert blocks. Dropless routing copies the per-expert token counts to the host and synchronises before
the expert computation (Megatron-LM ``megatron/core/transformer/moe/token_dispatcher.py``,
``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize``, commit 8c1a3f5df0cb, Sept 2025), so the CPU cannot
run ahead of the GPU into a MoE layer's experts. Transformer Engine's ``GroupedLinear``
(``transformer_engine/pytorch/module/grouped_linear.py``, commit 7022d50fe1e9, Oct 2025: the TE 2.8 generation the
2025 recipes ran) then issues the expert work *per local expert*: ``general_grouped_gemm`` loops over the experts
(one cuBLAS GEMM each for fc1 and fc2 forward, dgrad + wgrad backward), and under FP8 ``tex.split_quantize``
quantizes each expert's GEMM input (forward) and output gradient (backward) separately: MXFP8 / blockwise one cast
kernel per tensor, per-tensor current scaling three (amax, scale, cast; ``Float8CurrentScalingQuantizer``).

The host issues these operations one after the other and the GPU runs each as it arrives: an operation costs
``max(host time, GPU time)``. So the block exposes ``max(0, host - GPU)`` per operation on top of the GPU work the
other terms charge: for a GEMM call (``HOST_GEMM_S``) nothing when the expert has many tokens, at most the call's
host time for tiny ones; a quantized tensor (``HOST_QUANTIZE_S``: allocation, quantizer conversion, the tensor
object and the launches of one expert's slice, whose cast is microseconds of HBM traffic) is charged in full, so it
grows with the local experts only as far as the source issues per-expert quantizations (TE 2.8; later TE versions
quantize all experts in one ``group_quantize`` call). A
full-iteration CUDA graph replays the launches without the host.

Drop-and-pad routing has no such sync: with ``--moe-pad-expert-input-to-capacity`` every expert's token count is the
capacity, known on the host, and ``_maybe_dtoh_and_synchronize`` returns without waiting (``token_dispatcher.py``
at the same commit: ``if not self.drop_and_pad``). The host then runs ahead of the GPU, and a layer's per-expert
host work is exposed only where it outlasts the GPU work of the layer it is issued during: ``max(0, host - GPU)``
for the whole block. The Megatron-Bridge archive (``docs/performance-summary-archive.md``) shows both sides: the
25.09 token-drop runs of Qwen3-30B-A3B are 1.9-2x faster than the 25.11 dropless runs of the same layouts at
micro-batch 1-2 (8 B200, 16 H100), and no faster at micro-batch 4 (8 GB200), where the GPU work per layer
already covers the host's.
"""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .config import ParallelConfig, TrainingJob, compute_bytes
from .fit_range import FitRange
from .gemm import expert_gemms_s

#: Quantized tensors per local expert per MoE layer (fc1 + fc2), forward and backward: the two GEMM inputs forward,
#: the two output gradients backward (``tex.split_quantize``); none in 16-bit.
QUANTIZED_TENSORS_PER_EXPERT = 2
#: Host seconds per expert GEMM call (``general_grouped_gemm``'s C++ loop: one cublasLtMatmul per expert). Measured,
#: not fitted: a loop of one eager PyTorch ``F.linear`` per expert, issued from Python, costs 14.7-25.4 us per call
#: where the GPU work is shorter (median 16.5 us over 27 such cases: four MoE models' expert shapes, 4 and 16 experts,
#: 128-2048 tokens each), on the host of an H200 machine, 2026-12-04 (``benchmarks/gemm_measured.py``, data in
#: ``benchmarks/data/measured_h200_20261204.json``); the loop takes max(host, GPU) time, not their sum, as this module
#: charges it. TE's C++ loop makes the same cuBLAS call with a tensor-wrapper setup in place of Python dispatch, so the
#: eager figure is taken as its host time per call. Fitted before (2026-12: 20 us, the top of its 3-20 us range); with
#: the measured value the held-out MoE recipes went from 13.40% to 12.23% and the Bridge rows from 9.21% to 8.81%.
HOST_GEMM_S = 16.5e-6
#: Host seconds per quantized expert tensor, by FP8 recipe (``split_quantize`` in TE 2.8, ``csrc/extensions/
#: cast.cpp``). ``mx`` (MXFP8 / blockwise): the outputs of all experts are bulk-allocated at once and each split gets a
#: light ``*TensorStorage`` object and one cast launch (the block scales come out of the cast kernel). ``cs``
#: (per-tensor current scaling): each expert's output is allocated on its own (data, transpose, scale) as a
#: ``Float8Tensor`` (a ``torch.Tensor`` subclass) and quantized by three launches: amax, scale, cast. Fitted (71 / 271
#: us since the FP8 forward GEMMs run at the fast-accumulation rate and current scaling's amax pass is charged,
#: 2026-12-04; 71 / 280 us since DeepEP's internode throughput is charged, 2026-12-04; 71 / 277 us since HybridEP's
#: default SM count was corrected; 71 / 280 us since the MoE routing kernels are measured; 78 / 294 us before; 74 / 277
#: us on the coarser grid before that); ``cs`` sits near the top of its range, held there by one row (Bridge H100
#: Qwen3-30B-A3B FP8-CS, pp 2 x vpp 24).
HOST_QUANTIZE_S = {"mx": 70.7293e-6, "cs": 270.834e-6}
#: Share of the datasheet HBM bandwidth that the token permutation kernels reach, counting the bytes they must move
#: (``permute_passes``). Measured, not fitted: Transformer Engine 2.8's Triton kernels (``--moe-permute-fusion``:
#: ``make_row_id_map``, ``permute_with_mask_map``, ``sort_chunks_by_map``, ``unpermute_with_mask_map``, forward and
#: backward) on one H200, 2026-12-04, for the routing shapes of Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and
#: Mixtral 8x7B at 2,048-16,384 tokens: 0.56-0.74 of 4.8 TB/s, median 0.676 over the 21 shapes with 4,096 tokens or
#: more per GPU (training micro-batches; 0.674 over all 27) (a plain copy of the same bytes: 0.76-0.89)
#: (``benchmarks/moe_routing_device.py``, data ``benchmarks/data/measured_h200_20261204_moe_routing.json``,
#: ``benchmarks/moe_routing_measured.py``). Taken as the kernels' share on every GPU (one GPU measured). Before: 4 HBM
#: passes at the datasheet rate in the memory-bound term and a fitted 11.5 ns per routed copy on top.
PERMUTE_HBM_FRACTION = 0.676
#: GPU seconds of one fused router kernel (``--moe-router-fusion``: Transformer Engine's
#: ``fused_topk_with_score_function``, one kernel forward and one backward) over ``[tokens, experts]`` logits:
#: ``a + per_token x tokens + per_score x tokens x experts``. Not measured directly (TE's CUDA kernels were not on the
#: measuring machine): ``torch.topk`` over the same logits, the kernel's dominant step, measured on one H200,
#: 2026-12-04 (same run as ``PERMUTE_HBM_FRACTION``), least squares over 16 shapes (max error 14%): 10.0 us + 1.14 ns
#: per token + 41 ps per token-expert score. Megatron-LM's unfused router (PyTorch top-k, softmax / sigmoid, scatter,
#: load-balancing loss, autograd: ~25 kernels) took 92-606 us forward + backward on the same shapes; the MoE recipes
#: all set ``moe_router_fusion: true``. Taken as the kernel's time on every GPU (one GPU measured; a launch-bound
#: fixed part and a small per-token part, which other GPUs change little).
ROUTER_KERNEL_S = (10.04e-6, 1.143e-9, 41.31e-12)
#: Seconds per routed token copy per MoE layer (forward + backward, 1/3 and 2/3) of routing work in a multi-GPU training
#: step beyond the router and permutation kernels measured alone (``ROUTER_KERNEL_S``, ``PERMUTE_HBM_FRACTION``). Fitted
#: on the dev rows' MoE runs: 16.7 ns (2026-12-04, with HybridEP's default SM count corrected to DeepEP's 32; 14.1 ns
#: before). It is larger than what the measured kernels themselves cost per copy
#: under the flex dispatchers the MoE recipes run (Qwen3-30B-A3B, 4,096 tokens: 8.8 ns forward + backward measured, 7.9
#: ns as this module charges them), so it carries something the kernels alone do not show: the permutation sharing the
#: GPU with the dispatcher's communication kernels, or the host synchronisation of dropless routing (not measured on one
#: GPU). Before the kernels were measured it was 11.5 ns on top of 4 forward HBM passes at the datasheet rate
#: (``benchmarks/moe_routing_measured.py`` prints both against the measurement).
MOE_TOKEN_COPY_S = 1.66666e-8

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them).
FIT_RANGES = {
    "HOST_QUANTIZE_S.mx": FitRange(10e-6, 120e-6, "s per quantized expert tensor",
                                   ">= 10 us: one C++ cast launch and its share of a bulk allocation; <= 120 us: "
                                   "with quantizer conversion and a Python storage object per split (eager "
                                   "PyTorch-level overheads of 10-60 us each)"),
    "HOST_QUANTIZE_S.cs": FitRange(20e-6, 300e-6, "s per quantized expert tensor",
                                   ">= 20 us: three C++ launches (amax, scale, cast) and their allocations; <= 300 "
                                   "us: with a torch.Tensor-subclass Float8Tensor built per expert (wrapper-subclass "
                                   "creation, 3 allocations, quantizer conversion: up to ~5 eager-op overheads of "
                                   "up to 60 us)"),
    "MOE_TOKEN_COPY_S": FitRange(0.0, 5.0e-8, "s per routed token copy per layer",
                                 "0: the router and permutation kernels measured alone are the whole cost; 50 ns: "
                                 "the same work again several times over (the measured kernels cost 8-58 ns per "
                                 "copy forward + backward at hidden 2,048-7,168)"),
}


def quantize_host_s(job: TrainingJob, fp8_recipe: str) -> float:
    """Host seconds to quantize one expert tensor: ``HOST_QUANTIZE_S`` of the FP8 recipe; 0 in 16-bit.

    Raises:
        ValueError: ``fp8_recipe`` is neither ``mx`` nor ``cs`` for an FP8 job.
    """
    if job.precision != "fp8":
        return 0.0
    if fp8_recipe not in HOST_QUANTIZE_S:
        raise ValueError(f"fp8_recipe {fp8_recipe!r}: allowed mx, cs")
    return HOST_QUANTIZE_S[fp8_recipe]


def permute_passes(top_k: int, chunk_sort: bool) -> float:
    """HBM passes over the routed copies (``top_k x tokens x hidden`` elements) of one direction (forward or
    backward) of a MoE layer's token permutation, counted from Megatron-LM's token dispatchers with
    ``--moe-permute-fusion`` (``megatron/core/transformer/moe/token_dispatcher.py``, ``moe_utils.py`` at d98e8a64dd;
    TE 2.8 ``pytorch/permutation.py``): the permutation reads each token once and writes its ``top_k`` copies
    (``1 + 1/top_k``), the un-permutation reads the copies and writes the token (``1 + 1/top_k``); the ``alltoall``
    dispatcher with several local experts also sorts the received chunks by local expert after the dispatch and back
    before the combine (``sort_chunks_by_idxs``: read + write, twice: 4). The backward moves the same bytes."""
    return 2.0 + 2.0 / top_k + (4.0 if chunk_sort else 0.0)


def router_kernel_s(tokens: float, experts: int) -> float:
    """GPU seconds of one fused router kernel over ``[tokens, experts]`` logits (``ROUTER_KERNEL_S``)."""
    a, per_token, per_score = ROUTER_KERNEL_S
    return a + per_token * tokens + per_score * tokens * experts


def moe_routing_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                  dispatcher: str) -> tuple[float, float]:
    """(forward, backward) seconds of one MoE layer's routing bookkeeping for one micro-batch: the fused router
    kernel (``router_kernel_s``, each way), the token permutation, ``permute_passes`` over the routed copies in the
    activation dtype at ``PERMUTE_HBM_FRACTION`` of the datasheet HBM bandwidth, and ``MOE_TOKEN_COPY_S`` per routed
    copy (1/3 forward, 2/3 backward). The chunk sort runs under ``dispatcher`` ``alltoall`` with more than one local
    expert (``collectives.moe_token_dispatcher``); the flex dispatchers (DeepEP, HybridEP) permute the received tokens
    once each way. Tokens per GPU: micro-batch x sequence / CP, / TP under sequence parallelism (without it every TP
    rank routes every token); drop-and-pad routing permutes every padded slot (``routed_token_factor``). (0, 0)
    for dense layers."""
    if model.moe is None or not model.is_moe_layer(layer):
        return 0.0, 0.0
    tok = par.micro_batch_size * job.seq_length / par.cp / (par.tp if par.sequence_parallel else 1)
    local = model.moe.num_experts / par.ep
    chunk_sort = dispatcher == "alltoall" and local > 1
    copies = tok * model.moe.top_k * job.routed_token_factor
    rate = cluster.gpu.hbm_bandwidth_bytes_per_s * PERMUTE_HBM_FRACTION
    permute = permute_passes(model.moe.top_k, chunk_sort) * copies * model.hidden_size * compute_bytes(job.precision)
    one_way = router_kernel_s(tok, model.moe.num_experts) + permute / rate
    rest = MOE_TOKEN_COPY_S * copies
    return one_way + rest / 3, one_way + 2 * rest / 3


def moe_host_exposed_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                       framework: str, fp8_recipe: str, full_cuda_graph: bool,
                       gpu_s: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """(forward, backward) seconds one MoE layer's host-issued per-expert operations add to its GPU time for one
    micro-batch (module docstring). Dropless routing (host sync before the experts): per local expert,
    ``max(0, HOST_GEMM_S - GEMM time)`` for each expert GEMM (fc1 and fc2 forward; their dgrad and wgrad backward,
    each of the forward GEMM's shape: ``gemm.expert_gemms_s``) and ``quantize_host_s`` for each quantized tensor.
    Drop-and-pad routing (``job.moe_expert_capacity_factor`` set; no sync): the block's whole host time less
    ``gpu_s``, the layer's (forward, backward) GPU seconds it runs ahead during, floored at 0. (0, 0) for dense layers
    and under a full CUDA graph."""
    if model.moe is None or not model.is_moe_layer(layer) or full_cuda_graph:
        return 0.0, 0.0
    quant = QUANTIZED_TENSORS_PER_EXPERT * quantize_host_s(job, fp8_recipe)
    local = model.moe.num_experts / par.ep
    if job.moe_expert_capacity_factor is not None:
        return (max(0.0, local * (2 * HOST_GEMM_S + quant) - gpu_s[0]),
                max(0.0, local * (4 * HOST_GEMM_S + quant) - gpu_s[1]))
    f1, f2, b1, b2 = expert_gemms_s(model, cluster, job, par, framework)
    forward = max(0.0, HOST_GEMM_S - f1) + max(0.0, HOST_GEMM_S - f2)
    backward = 2 * (max(0.0, HOST_GEMM_S - b1) + max(0.0, HOST_GEMM_S - b2))
    return local * (forward + quant), local * (backward + quant)
