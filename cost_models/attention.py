"""Attention core time (``softmax(QK^T)V``, the part without weights) of one layer, on one GPU (seconds).

Fused flash attention: causal FLOPs (the kernel skips the masked half) at the kernel's measured rate
(``attention.yaml``) for the sequence length, brought to the occupancy of the call: the rate falls when the call has
few thread blocks per SM (micro-batch x heads per GPU x query tiles, ``attention_work_units``; e.g. 8 heads of a
70B model at TP 8 and 4k tokens: 256 blocks on 132 SMs, 0.67 of the saturated rate), as plan3d measured on an H200;
backward ``ATTN_BWD_FACTOR`` x the forward FLOPs (FlashAttention-2's backward runs 5 matmuls to the forward's 2,
Dao 2023 Sec. 3.1). Unfused attention (SC21 / BLOOM era, ``TrainingJob.flash_attention`` False) runs the two
batched GEMMs at the GEMM rate and streams the ``s x s`` scores ``UNFUSED_SCORE_PASSES`` times through HBM, plus
``DROPOUT_SCORE_PASSES`` with attention dropout (``TrainingJob.dropout``). Fused attention with dropout generates the
mask inside the kernel: ``FUSED_DROPOUT_SLOWDOWN``.
"""
from __future__ import annotations

import math

from cluster_specs.efficiency import (attention_kernels, attention_non_causal_ratio, attention_query_tile,
                                      attention_tflops, attention_window_tflops)
from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import ParallelConfig, TrainingJob, compute_bytes
from .flops import attention_core_flops_per_token, attention_widths
from .gemm import clock_fraction, gemm_rate, half_dtype, hbm_rate, mamf_rate, peak_dtype

#: Backward / forward time of the fused attention kernel (FlashAttention-2: 5 backward matmuls vs 2 forward,
#: Dao 2023 Sec. 3.1, i.e. 2.5x the FLOPs at a similar rate).
ATTN_BWD_FACTOR = 2.5
#: Key length (tokens) at which a fused attention kernel reaches half its long-sequence rate, for GPUs without a
#: series in ``attention.yaml`` (the ``eff_inf x s / (s + ATTN_HALF_SEQ)`` fallback): H100 cuDNN runs 315 of 539
#: TFLOP/s at 512 keys, FlashAttention-2 191 of 335 (FA3 paper Fig. 5), i.e. half rate at ~360-390 keys.
ATTN_HALF_SEQ = 384.0
#: Fallback attention efficiency (fraction of the 16-bit dense peak) when the cluster has none calibrated
#: (A100, MI300X): FlashAttention-2 reaches 50-73% of A100 peak forward and somewhat less backward (Dao 2023,
#: Sec. 4.1); 0.5 is the low end.
DEFAULT_ATTENTION_EFFICIENCY = 0.5
#: HBM passes of the s x s score tensor per unfused attention forward without dropout: QK^T written (1), Megatron's
#: fused scale-mask-softmax reading and writing it (2), the scores x V GEMM reading it (1) = 4 by kernel count (each
#: kernel streaming it once); fitted on the SC21 / BLOOM rows (which ran attention dropout: ``DROPOUT_SCORE_PASSES`` on
#: top), inside ``FIT_RANGES``: 6.42 (since the Megatron-LM Llama example rows state their 16-bit gradient reduction
#: and FP8 parameter gather, 2026-12-04; 6.37 since the FP8 forward GEMMs run at the fast-accumulation rate and current
#: scaling's amax pass is charged, 2026-12-04; 6.46 since DeepEP's internode throughput is charged, 2026-12-04; 6.29
#: with the MoE routing kernels measured; 6.42 before them; 6 on the coarser grid before that).
UNFUSED_SCORE_PASSES = 6.41663
#: Extra HBM passes of the scores (in 16-bit tensors) with attention dropout, counted: the dropout kernel reads the
#: softmax output (1) and writes the dropped output (1) and its 1-byte mask (0.5), and the scores x V GEMM reads the
#: dropped output in place of the softmax output (Megatron-LM ``CoreAttention``: ``attention_dropout`` after
#: ``FusedScaleMaskSoftmax``, separate kernels; the mask as PyTorch's ``native_dropout`` keeps it, one byte per element;
#: Korthikanti et al. 2022 Sec. 4.1 count the same tensors: 2 a s^2 softmax output, a s^2 mask, 2 a s^2 dropout output).
DROPOUT_SCORE_PASSES = 2.5
#: Time of a fused (flash) attention kernel with attention dropout over the same kernel without: the kernel draws the
#: Philox mask in registers, no extra HBM traffic. FlashAttention-2 with dropout 0.1: 0.695 -> 0.728 ms (+4.7%) on
#: GB200 (NVIDIA/TransformerEngine PR 3313, comment of 2026-08-05); xformers' CUTLASS flash kernel, backward at dropout
#: 0.3 vs 0: +3-7% on A100 (facebookresearch/xformers PR 587). Not covered: cuDNN's packed-sequence (THD) dropout on
#: Blackwell, 5-7x slower in the same PR 3313 (Transformer Engine then prefers FlashAttention-2), and FlashAttention-4
#: on GB200, 20-40% (Dao-AILab/flash-attention PR 2597). No H100 cuDNN measurement was found.
FUSED_DROPOUT_SLOWDOWN = 1.05

#: Sliding-window kernel rate over the causal kernel's rate at a key length of twice the window, for a GPU whose
#: kernel has no measured ``sliding_window`` series in ``attention.yaml``: the two published measurements give 0.78
#: (H200 cuDNN 9.19, window 1024: 336 TFLOP/s forward at 4k tokens against 484 x 0.89 at 2048 causal, head dim 64)
#: and 0.63 (GB200 cuDNN 9.22, window 128: 161 against the 512-token causal rate extrapolated to 256, 408 x 0.70 x
#: 0.89); their mean.
WINDOWED_RATE_SHARE = 0.71

#: Fused-attention kernel each framework runs (``cluster_specs/data/efficiency/attention.yaml``): Megatron-LM / NeMo
#: through Transformer Engine's ``FusedAttention`` (cuDNN), torchtitan and DeepSpeed through PyTorch SDPA's flash
#: backend (FlashAttention-2). A GPU without that kernel's series uses the one it has.
ATTENTION_KERNEL = {"megatron": "cudnn", "nemo": "cudnn", "torchtitan": "flash2", "deepspeed": "flash2"}
#: Achieved fraction of the kernel's benchmark rate (``attention.yaml``, brought to the call's occupancy) inside a
#: training step, beyond the clock its power cap allows (``gemm.clock_fraction``, applied separately). Measured on one
#: H200 (2026-12-04, ``benchmarks/measure_device.py`` section ``layer_step``: 4-layer stacks, eager PyTorch):
#: FlashAttention-2 in a Llama 3 8B stack at 8k tokens took 1.92 ms forward and 5.41 ms backward per layer inside the
#: step against 1.74 / 4.83 ms for the same call alone (0.91 / 0.89; 0.90 / 0.86 in an earlier run), and in one TP-8
#: rank's share of a Llama 3 70B stack at 4k tokens (8 heads: 256 thread blocks) 0.22 / 0.52 ms against 0.20 / 0.48
#: (0.91 / 0.93): the occupancy loss stays inside the step. Fitted on the dev rows (0.59 since DeepEP's internode
#: throughput is charged, 2026-12-04; 0.60 with the MoE routing kernels measured; 0.59 before them; 0.6 on the
#: coarser grid before that): the rows' attention also loses what plan3d does not model (kernel releases between
#: the published series, context parallelism's per-step output corrections, communication kernels sharing the SMs).
ATTENTION_TRAINING_SHARE = 0.59375

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them).
FIT_RANGES = {
    "ATTENTION_TRAINING_SHARE": FitRange(0.4, 1.0, "fraction of the kernel benchmark's TFLOP/s",
                                         "1: the isolated benchmark rate at the call's occupancy; 0.86-0.93: "
                                         "measured inside a one-GPU training step (H200, clocks included); 0.4: "
                                         "with communication kernels sharing the SMs and older kernel releases"),
    "UNFUSED_SCORE_PASSES": FitRange(4.0, 8.0, "HBM passes over the s x s scores without dropout",
                                     "count of the unfused kernels: QK^T write, softmax read + write, scores x V "
                                     "read = 4, each streaming the scores once; <= 8: each pass twice (the batched "
                                     "GEMMs' K = head_dim is below the ridge point, A100 156 FLOP/byte, so their "
                                     "operand re-reads and epilogue run at HBM speed too)"),
}


def attention_efficiency(cluster: ClusterSpec) -> float:
    """Asymptotic fused-attention efficiency of the cluster (calibration ``attention_efficiency`` of the 16-bit
    dtype), else ``DEFAULT_ATTENTION_EFFICIENCY``, times the sustained clock under the board power limit
    (``gemm.clock_fraction``)."""
    ae = cluster.calibration.attention_efficiency or {}
    eff = ae.get(half_dtype(cluster), DEFAULT_ATTENTION_EFFICIENCY)
    half = half_dtype(cluster)
    return eff * clock_fraction(cluster, eff * cluster.gpu.peak_flops[half] / mamf_rate(cluster, half))


def attention_core_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                     framework: str, layer: int | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of decoder layer ``layer``'s attention core for one micro-batch on one GPU
    (``a/tp`` heads, ``b·s/cp`` query tokens); ``layer`` None: a full-attention layer.

    Flash attention: the kernel's rate rises with the key length it streams per query block (fixed per-block
    setup, tail tiles of the causal triangle): the measured series of ``attention.yaml``, else
    ``eff(s) = eff_inf x s / (s + ATTN_HALF_SEQ)``. Under context parallelism each kernel call sees only one ring
    step's keys and the rank's queries (the sequence is split into 2 cp chunks for causal load balance and each rank
    holds two of them: Megatron-LM ``docs/source/api-guide/context_parallel.rst``): one causal call over the rank's
    ``s / cp`` tokens and unmasked calls over half of its keys or half of its queries (``ring_attention_calls``),
    unmasked at the measured ``efficiency.attention_non_causal_ratio``. A measured series is read at each call's
    occupancy (``attention_work_units``: micro-batch x heads per GPU x query tiles of the call's queries;
    ``efficiency.attention_occupancy``); the fallback curve (a GPU without a series) has neither.

    Sliding-window layers (``ModelSpec.attention_window``) shorter than the sequence: the fused kernel skips the
    key blocks outside the window (FlashAttention-2 ``window_size``; cuDNN's sliding-window band through Transformer
    Engine ``window_size``), so it does the window's FLOPs (``flops.attention_core_flops_per_token``) at the
    kernel's measured sliding-window rate (``efficiency.attention_window_tflops``: a few key tiles per query tile run
    far below the causal rate); a GPU without one runs ``WINDOWED_RATE_SHARE`` of the causal rate at a key length
    of twice the window; never above the causal kernel over the whole sequence (a window just below it skips
    almost no key block). Unfused attention computes and masks the whole ``s x s`` matrix whatever the window.
    """
    b, s = par.micro_batch_size, job.seq_length
    tok = b * s / par.cp
    heads_frac = 1.0 / par.tp
    if job.flash_attention:
        window = model.attention_window(layer) if layer is not None else None
        full = _fused_s(model, cluster, job, par, framework, None)
        if window is None or window >= s:
            return full
        # the band is the causal mask with a left bound: a window just below the sequence skips almost no key
        # block and runs as the causal kernel, never slower (window >= s is the causal kernel itself)
        banded = _fused_s(model, cluster, job, par, framework, window)
        return min(banded[0], full[0]), min(banded[1], full[1])
    fl = attention_core_flops_per_token(model, s, causal_halved=False) * tok * heads_frac
    ab = compute_bytes(job.precision)  # 4-byte scores in fp32 training
    scores = ab * b * model.num_attention_heads * heads_frac * s * s / par.cp
    passes = UNFUSED_SCORE_PASSES + (DROPOUT_SCORE_PASSES if job.dropout else 0.0)
    fwd = fl / gemm_rate(cluster, "fp32" if job.precision == "fp32" else half_dtype(cluster)) + \
        passes * scores / hbm_rate(cluster)
    return fwd, 2.0 * fwd


def _fused_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, framework: str,
             window: int | None) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch's fused-attention kernels on one GPU, causal over the whole
    sequence (``window`` None) or over a ``window``-key band (``window`` < sequence length); see
    ``attention_core_s``. Under context parallelism the causal work is that of the ring's calls
    (``ring_attention_calls``)."""
    s = job.seq_length
    tok = par.micro_batch_size * s / par.cp
    fl = attention_core_flops_per_token(model, s, causal_halved=True, window=window) * tok / par.tp
    s_key = s / par.cp if window is None else 2.0 * window
    # fp32 training (PyTorch SDPA's memory-efficient kernel in fp32): the 16-bit kernel's time scaled by the
    # 16-bit over the TF32 peak (the same tensor cores at the TF32 rate)
    slow = (cluster.gpu.peak_flops[half_dtype(cluster)] / cluster.gpu.peak_flops[peak_dtype(cluster, job.precision)]
            if job.precision == "fp32" else 1.0)
    slow *= FUSED_DROPOUT_SLOWDOWN if job.dropout else 1.0
    calls = (ring_attention_calls(s, par.cp) if window is None else
             ((1.0, s_key, s / par.cp, True),))
    per_flop = [_seconds_per_flop(model, cluster, job, par, framework, window, key, query, causal)
                for _, key, query, causal in calls]
    if all(pf is not None for pf in per_flop):
        fwd = sum(w * pf[0] for (w, *_), pf in zip(calls, per_flop))
        bwd = sum(w * pf[1] for (w, *_), pf in zip(calls, per_flop))
        return slow * fl * fwd, slow * ATTN_BWD_FACTOR * fl * bwd
    eff = attention_efficiency(cluster) * s_key / (s_key + ATTN_HALF_SEQ)
    eff *= WINDOWED_RATE_SHARE if window is not None else 1.0
    fwd = fl / (cluster.gpu.peak_flops[peak_dtype(cluster, job.precision)] * eff)  # TF32 peak in fp32
    fwd *= FUSED_DROPOUT_SLOWDOWN if job.dropout else 1.0
    return fwd, ATTN_BWD_FACTOR * fwd


def ring_attention_calls(seq_length: float, cp: int) -> tuple[tuple[float, float, float, bool], ...]:
    """The fused-attention calls of one causal layer on one context-parallel rank, as (share of the rank's causal
    attention FLOPs, key tokens, query tokens, causal mask): the load-balanced ring of Transformer Engine
    (``AttnFuncWithCPAndKVP2P``, ``cp_p2p_fwd_prepare_qkv`` in ``attention/dot_product_attention/
    context_parallel.py``, v2.8) and of PyTorch (``_templated_ring_attention`` in ``torch/distributed/tensor/
    experimental/_context_parallel/_attention.py``): each rank holds two of the sequence's ``2 cp`` chunks; step 0
    runs its ``s / cp`` queries against its own keys under the causal mask ("diagonal"); of the other ``cp - 1``
    steps, those from a lower rank run all its queries against the first chunk of keys (``s / 2cp``) and those from a
    higher rank its second chunk of queries against all the keys, both unmasked. Each call has the same FLOPs, so
    over the ranks the diagonal holds ``1 / cp`` of the work and the two kinds ``(cp - 1) / 2cp`` each. ``cp`` 1:
    one causal call."""
    local = seq_length / cp
    if cp == 1:
        return ((1.0, local, local, True),)
    side = (cp - 1) / (2.0 * cp)
    return ((1.0 / cp, local, local, True), (side, local / 2.0, local, False), (side, local, local / 2.0, False))


def _seconds_per_flop(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, framework: str,
                      window: int | None, key_tokens: float, query_tokens: float,
                      causal: bool) -> tuple[float, float] | None:
    """(forward, backward) seconds per forward FLOP of one fused-attention call with ``key_tokens`` keys and
    ``query_tokens`` queries per sequence: the kernel's measured rate (``_kernel_tflops`` / ``_window_tflops``) at the
    call's occupancy, unmasked calls at ``efficiency.attention_non_causal_ratio`` of the causal rate, times
    ``ATTENTION_TRAINING_SHARE`` and the clock the call's own activity allows under a power cap; None when the GPU
    has no series."""
    units = attention_work_units(model, par, query_tokens)
    rates = (_kernel_tflops(model, cluster, framework, key_tokens, job.software_date, units) if window is None else
             _window_tflops(model, cluster, framework, window, query_tokens, job.software_date, units))
    if rates is None:
        return None
    if not causal:
        ratio = attention_non_causal_ratio(_kernel_choice(model, cluster, framework)[0], key_tokens)
        rates = (rates[0] * ratio[0], rates[1] * ratio[1])
    # the benchmarks ran at the TDP clock; under a power cap each kernel runs at the clock its own switching
    # activity allows (gemm.clock_fraction: its FLOP rate over the GEMM's)
    gemm = mamf_rate(cluster, half_dtype(cluster))
    share_f = ATTENTION_TRAINING_SHARE * clock_fraction(cluster, rates[0] * 1e12 / gemm)
    share_b = ATTENTION_TRAINING_SHARE * clock_fraction(cluster, rates[1] * 1e12 / gemm)
    return 1.0 / (rates[0] * 1e12 * share_f), 1.0 / (rates[1] * 1e12 * share_b)


def _kernel_choice(model: ModelSpec, cluster: ClusterSpec, framework: str) -> tuple[str, float] | None:
    """(kernel with a series on the cluster's GPU: the framework's own, else the first listed; the model's head
    size, the mean of its query/key and value head dims); None when the GPU has no series."""
    kernels = attention_kernels(cluster.gpu.name)
    if not kernels:
        return None
    want = ATTENTION_KERNEL.get(framework.split("_")[0], "cudnn")
    qk, v = attention_widths(model)
    return (want if want in kernels else kernels[0]), (qk + v) / 2 / model.num_attention_heads


def attention_work_units(model: ModelSpec, par: ParallelConfig, query_tokens: float) -> int:
    """Thread blocks one fused-attention call runs in parallel on one GPU: micro-batch x query heads per GPU
    (``ceil(a / tp)``) x query tiles (``ceil(query_tokens / query_tile)``, ``attention.yaml`` ``occupancy``). Under
    context parallelism ``query_tokens`` is the rank's ``s / cp`` (each ring step's call)."""
    heads = math.ceil(model.num_attention_heads / par.tp)
    return par.micro_batch_size * heads * math.ceil(query_tokens / attention_query_tile())


def _window_tflops(model: ModelSpec, cluster: ClusterSpec, framework: str, window: int, s_query: float,
                   software_date: str | None = None, units: float | None = None) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s over the window's FLOPs of the framework's kernel with a ``window``-key sliding
    window at ``s_query`` query tokens: the measured sliding-window series (``efficiency.attention_window_tflops``),
    else ``WINDOWED_RATE_SHARE`` x the causal rate at ``2 x window`` keys; None when the GPU has no series.
    ``units``: the call's work units (``attention_work_units``; None: the benchmark's shape)."""
    choice = _kernel_choice(model, cluster, framework)
    if choice is None:
        return None
    kernel, head_dim = choice
    got = attention_window_tflops(cluster.gpu.name, kernel, window, s_query, head_dim, software_date,
                                  half_rate_tokens=ATTN_HALF_SEQ, units=units)
    if got is not None:
        return got
    causal = attention_tflops(cluster.gpu.name, kernel, 2.0 * window, head_dim, software_date,
                              half_rate_tokens=ATTN_HALF_SEQ, units=units)
    return None if causal is None else (WINDOWED_RATE_SHARE * causal[0], WINDOWED_RATE_SHARE * causal[1])


def _kernel_tflops(model: ModelSpec, cluster: ClusterSpec, framework: str, s_key: float,
                   software_date: str | None = None, units: float | None = None) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s of the framework's fused-attention kernel on the cluster's GPU at key length
    ``s_key`` and the model's head size (mean of the query/key and value head dims), from
    ``cluster_specs/data/efficiency/attention.yaml``, in the kernel library's generation of ``software_date``
    (``YYYY-MM``; None = the newest), at the occupancy of a call with ``units`` work units (``attention_work_units``;
    None: the benchmark's shape); None when the GPU has no series."""
    choice = _kernel_choice(model, cluster, framework)
    if choice is None:
        return None
    kernel, head_dim = choice
    return attention_tflops(cluster.gpu.name, kernel, s_key, head_dim, software_date, half_rate_tokens=ATTN_HALF_SEQ,
                            units=units)
