"""GEMM time: the weight matmuls of a decoder layer and of the output layer, on one GPU (seconds).

Each weight GEMM of ``M`` tokens, input width ``K`` and output width ``N`` (after TP/EP sharding) takes
``2MKN / (peak x gemm_efficiency) + KAPPA x bytes(MK + KN + MN) / HBM``: the large-GEMM rate measured by MAMF
(cluster calibration ``gemm_efficiency``) plus ``KAPPA`` times the time to stream its operands, so small per-GPU
GEMMs (high TP, small hidden sizes, fine-grained experts) run at a lower fraction of peak (roofline; Williams et
al. 2009). FP8 GEMMs use the FP8 rate and 1-byte operands. The backward runs two GEMMs of each forward GEMM's shape
(input and weight gradients; Narayanan et al. SC21 Sec. 5.1), timed by ``layer_gemms_s`` at the MAMF-based rate; on
Hopper the forward FP8 GEMMs run faster than that (``FP8_FAST_ACCUM_SPEEDUP``).
"""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import ParallelConfig, TrainingJob, compute_bytes
from .fp8_recipe import PER_TENSOR_RECIPES, job_fp8_recipe
from .flops import layer_gemm_shapes

#: GEMM operand-streaming weight (dimensionless): a GEMM costs its MAMF-rate compute time plus ``KAPPA`` times the time
#: to read A and B and write C once from HBM (a GEMM at the roofline ridge point runs at 1/3 of its MAMF rate). Fitted
#: on the dev rows (plan3d validate): it sets how much slower small per-GPU GEMMs (Qwen3-30B-A3B's 768-wide experts,
#: h=2048 at TP 8) run than large ones. It is an in-training figure, not a kernel one: OpenXLA's published per-shape
#: H100 GEMM table implies a median of 0.63 for GEMMs run alone (14 shapes with every dimension >= 1024; below 1.2 for
#: all but the two smallest; ``benchmarks/gemm_published.py``), so the fitted value also carries what slows a GEMM
#: inside a training step. GEMMs plan3d measured alone on an H200 (210 BF16 shapes, 2026-12-04,
#: ``benchmarks/gemm_measured.py``) imply a median of 1.40 against the MAMF rate and 0.33 against that board's own
#: sustained large-GEMM rate (661 TFLOP/s, power-bound at 700 W): there, a GEMM's time is mostly the compute rate its
#: clock holds at the board's power limit, and streaming adds little. 1.99 since the Megatron-LM Llama example rows
#: state their 16-bit gradient reduction and FP8 parameter gather (2026-12-04); 2.03 since the FP8 forward GEMMs run at
#: the fast-accumulation rate and current scaling's amax pass is charged (2026-12-04); 1.96 since DeepEP's measured
#: internode throughput is charged (2026-12-04, ``collectives.flex_internode_s``); 2.10 since the MoE routing kernels
#: are measured (2026-12-04: counted permutation bytes at their measured HBM share, ``moe_overhead``); 1.99 when the fit
#: first resolved 1/96 of each range; 2.25 on the 1/24 grid before. Pinned at 0.5 with the rest refitted (2026-12,
#: before the H100 attention generations), the dev rows' in-sample MAPE went from 5.08% to 7.78% (LOGO 6.46% -> 9.87%).
KAPPA = 1.99479

#: Share of the board power at the TDP that does not scale with the SM clock under a power limit (HBM, NVLink
#: SerDes, board and leakage): ~100 W of the H100 SXM's 700 W (its idle draw is 70-120 W in nvidia-smi reports).
#: Counted, not fitted.
UNCORE_POWER_FRACTION = 100.0 / 700.0
#: Exponent ``n`` of the SM clock in the dynamic power under sustained dense GEMMs, ``P_dyn ~ f^n``: 1 at a fixed
#: voltage, up to 3 when the voltage tracks the clock (``P ~ C V^2 f``). Sets the sustained clock under a board power
#: limit below the TDP (``clock_fraction``). Fitted on the power-capped rows (torchtitan on Grand Teton H100s at 500 W;
#: the H200 rows of the same recipes at 700 W are the uncapped reference): 2.29 since the Megatron-LM Llama example rows
#: state their 16-bit gradient reduction and FP8 parameter gather (2026-12-04); 2.37 since the FP8 forward GEMMs run at
#: the fast-accumulation rate and current scaling's amax pass is charged (2026-12-04); 2.12 since DeepEP's measured
#: internode throughput is charged (2026-12-04); 2.25 since the MoE routing kernels are measured (2026-12-04); 2.19 when
#: the fit first resolved 1/96 of each range (``planner/calibration.py``; the 1/24 grid before stopped at 2.33); 2.33
#: since the attention tables carry the causal backward (measured ratio, 2026-12; 2.17 before, with the non-causal
#: figure); 2.17-2.33 since each kernel is throttled by its own switching activity (attention, below the cap, runs at
#: the full clock) and torchtitan's loss is costed as it ran (eager in 2024-12, compiled in 2025); 3, the range's edge,
#: while attention was throttled like a GEMM. Measured beside it (one H200 at its 700 W limit, 2026-12-04,
#: ``benchmarks/measure_device.py``): back-to-back 8192^3 GEMMs hold the board at 690 W with the SM clock at 1,470-1,530
#: MHz in BF16 and 1,335-1,365 MHz in FP8, of 1,980 MHz, so a dense GEMM is power-bound even at the TDP. Every framework
#: runs its weight GEMMs at the same cuBLAS rate: torchtitan's once fitted "framework compute share" went to 1 once its
#: per-op recompute, its elementwise kernels and the power cap were modelled, and was removed.
POWER_CLOCK_EXPONENT = 2.29166

#: FP8 GEMM rate with the tensor cores' fast accumulation over the rate with the split accumulator (partial sums
#: promoted to FP32 on the CUDA cores every few MMAs; cuBLASLt ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` 1 / 0), on Hopper.
#: Transformer Engine runs its FP8 forward GEMMs with fast accumulation and the input- and weight-gradient GEMMs with
#: the split accumulator (``transformer_engine/pytorch/module/base.py``: ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD =
#: True``, ``_2X_ACC_WGRAD = True``), and so does torchao's ``Float8Linear`` (torchtitan's float8:
#: ``Float8LinearConfig`` ``gemm_config_output = Float8GemmConfig(use_fast_accum=True)``, the two gradient GEMMs default
#: ``False``). The FP8 MAMF of the cluster YAMLs is the split rate: ``mamf-finder.py`` calls ``torch._scaled_mm(A, B,
#: scale, scale, out=C)``, whose ``use_fast_accum`` defaults to False (stas00/ml-engineering). Measured by plan3d on one
#: H200 (2026-12-04, ``benchmarks/measure_device.py`` section ``fp8_accumulation``,
#: ``benchmarks/data/measured_h200_20261204_fp8_accumulation.json``): split / fast time ratio median 0.955 over the 32
#: Llama / Qwen layer shapes with every dimension >= 2048 (0.87-0.99; the two modes alternated shape by shape at the
#: board's 700 W limit), so 1 / 0.955. Applied to the compute term of the forward FP8 GEMMs under a per-tensor recipe on
#: GPUs with FP8 but no block-scaled (FP4) tensor cores (``fprop_rate_factor``); not measured for the block-scaled
#: recipes or on Blackwell, which keep the MAMF rate.
FP8_FAST_ACCUM_SPEEDUP = 1.0 / 0.955

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them).
FIT_RANGES = {
    "POWER_CLOCK_EXPONENT": FitRange(1.0, 3.0, "exponent of the SM clock in the dynamic board power",
                                     "CMOS dynamic power C V^2 f: 1 at a fixed voltage, 3 with the voltage scaling "
                                     "with the clock (DVFS); at 500 of 700 W with UNCORE_POWER_FRACTION that is a "
                                     "sustained clock of 0.67-0.87 of the TDP clock"),
    "KAPPA": FitRange(0.5, 4.0, "HBM passes over the GEMM operands",
                      "roofline (Williams et al. 2009): >= 0.5, the operands streamed once and half of it hidden under "
                      "the tensor-core pipeline; <= 4, A and B re-read from HBM for every 128-256-wide output tile "
                      "row/column that misses L2 (cuBLAS/CUTLASS tile sizes)"),
}


def half_dtype(cluster: ClusterSpec) -> str:
    """The GPU's 16-bit training dtype: ``bf16``, or ``fp16`` on GPUs without bf16."""
    return "bf16" if "bf16" in cluster.gpu.peak_flops else "fp16"


def peak_dtype(cluster: ClusterSpec, precision: str) -> str:
    """The tensor-core dtype whose dense peak a job's MFU (and its attention and 16-bit work) is measured against:
    ``tf32`` for fp32 training (its GEMMs run on the TF32 tensor cores: ``TrainingJob``), else the 16-bit one
    (also for FP8 runs, as the published FP8 summaries report MFU)."""
    return "tf32" if precision == "fp32" and "tf32" in cluster.gpu.peak_flops else half_dtype(cluster)


def clock_fraction(cluster: ClusterSpec, activity: float = 1.0) -> float:
    """Sustained tensor-core clock under the cluster's board power limit over the clock at the TDP (at which the
    MAMF GEMM and attention kernel rates were measured); 1 without a power cap.

    Dense GEMMs run power-bound: the part ``UNCORE_POWER_FRACTION`` of the TDP does not scale, the rest scales as
    ``activity x f^POWER_CLOCK_EXPONENT`` (CMOS dynamic power: switching activity x V^2 f, the voltage tracking the
    clock), so ``f = ((r - u) / ((1 - u) x activity))^(1/n)`` with ``r = power_limit_w / tdp_w``, at most 1.
    ``activity``: the kernel's switching activity relative to a dense GEMM's, read as its tensor-core FLOP rate over
    the MAMF GEMM rate at the TDP clock (1 for GEMMs): a kernel that draws less than the cap at the full clock runs
    at it (FlashAttention-2 at 335 of H100's ~795 TFLOP/s MAMF draws ~0.50 of the TDP, under a 500 W cap's 0.71).
    A measured ``calibration.power_limit_clock_fraction`` (under GEMMs) stands for ``(r - u) / (1 - u)`` in it.
    """
    measured = cluster.calibration.power_limit_clock_fraction
    n = POWER_CLOCK_EXPONENT
    if measured is not None:
        headroom = measured ** n
    else:
        r = cluster.power_limit_ratio
        if r >= 1.0:
            return 1.0
        u = UNCORE_POWER_FRACTION
        headroom = max(0.0, (r - u) / (1.0 - u))
    return min(1.0, (headroom / max(activity, 1e-9)) ** (1.0 / n))


def mamf_rate(cluster: ClusterSpec, dtype: str) -> float:
    """Large-GEMM FLOP/s of a tensor-core dtype at the TDP clock: dense peak x the cluster's MAMF efficiency."""
    cal = cluster.calibration.gemm_efficiency
    half = half_dtype(cluster)
    p = dtype if dtype in cluster.gpu.peak_flops else half
    return cluster.gpu.peak_flops[p] * cal.get(p, cal.get(half, 0.7))


def gemm_rate(cluster: ClusterSpec, precision: str) -> float:
    """Large-GEMM FLOP/s of ``precision`` on one GPU: dense peak x the MAMF efficiency of the cluster YAML x the
    sustained clock under the board power limit (``clock_fraction``, 1 without a power cap). fp32 training runs its
    GEMMs at the TF32 peak with the 16-bit MAMF efficiency (same tensor cores; no TF32 MAMF measurement in
    hardware.yaml)."""
    if precision == "fp32":
        precision = peak_dtype(cluster, precision)
    return mamf_rate(cluster, precision) * clock_fraction(cluster)


def fprop_rate_factor(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                      framework: str = "megatron") -> float:
    """Forward GEMM rate over the MAMF-based ``gemm_rate`` (the backward GEMMs' rate): ``FP8_FAST_ACCUM_SPEEDUP``
    for FP8 on an NVIDIA GPU with FP8 but no FP4 tensor cores (Hopper) under a per-tensor recipe
    (``fp8_recipe.job_fp8_recipe`` ``delayed`` / ``tensorwise``), else 1."""
    peak = cluster.gpu.peak_flops
    if job.precision == "fp8" and cluster.gpu.vendor == "nvidia" and "fp8" in peak and "fp4" not in peak \
            and job_fp8_recipe(job, cluster, model, par, framework) in PER_TENSOR_RECIPES:
        return FP8_FAST_ACCUM_SPEEDUP
    return 1.0


def weight_gemm_rates(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                      framework: str) -> tuple[float, float, float, float]:
    """(forward FLOP/s, backward FLOP/s, HBM bytes/s, operand bytes) of a job's weight GEMMs: the backward at
    ``gemm_rate``, the forward at that rate times ``fprop_rate_factor``; ``gemm_time``'s last three arguments."""
    rate = gemm_rate(cluster, job.precision)
    return (rate * fprop_rate_factor(model, cluster, job, par, framework), rate, hbm_rate(cluster),
            operand_bytes(job.precision))


def hbm_rate(cluster: ClusterSpec) -> float:
    """Achievable HBM bytes/s: the datasheet bandwidth x the calibrated ``hbm_efficiency`` (1 when unset)."""
    return cluster.gpu.hbm_bandwidth_bytes_per_s * (cluster.calibration.hbm_efficiency or 1.0)


def operand_bytes(precision: str) -> float:
    """Bytes per GEMM operand element: 1 under FP8, 4 in fp32 training (``config.compute_bytes``), else the 16-bit
    dtype's 2."""
    return 1.0 if precision == "fp8" else float(compute_bytes(precision))


def gemm_time(m: float, k: float, n: float, rate: float, hbm: float, bytes_per_el: float) -> float:
    """Seconds of one ``m x k`` by ``k x n`` GEMM: compute at ``rate`` plus ``KAPPA`` x operand streaming."""
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    return 2.0 * m * k * n / rate + KAPPA * bytes_per_el * (m * k + k * n + m * n) / hbm


def _local_gemms(model: ModelSpec, par: ParallelConfig, job: TrainingJob, layer: int) -> list[tuple[float, ...]]:
    """Decoder layer ``layer``'s weight GEMMs on one GPU, in ``flops.layer_gemm_shapes`` order: ``(m, k, n, count)``
    after TP / EP sharding. TP splits the attention and dense MLP GEMMs; routed experts (``etp``) are ``E/ep`` local
    GEMMs, each receiving ``top_k/E`` of the tokens of all ``ep`` ranks (balanced routing; times the capacity
    factor under drop-and-pad routing, ``TrainingJob.routed_token_factor``)."""
    tok = par.micro_batch_size * job.seq_length / par.cp  # tokens through this rank's layer (sequence split by CP)
    etp = par.expert_tp
    out = []
    for k, n, share, shard, count in layer_gemm_shapes(model, layer):
        if shard == "tp":
            out.append((tok, k, n / par.tp, count))
        elif shard == "etp":
            out.append((tok * share * job.routed_token_factor * par.ep * etp / par.tp, k, n / etp, count / par.ep))
        else:
            out.append((tok, k, n, count))
    return out


def layer_gemms_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                  framework: str) -> tuple[float, float, float, float, float]:
    """Seconds of decoder layer ``layer``'s weight GEMMs for one micro-batch on one GPU: (all forward GEMMs, the MLP
    / MoE block's share of them, MLA's up-projections' share, all backward GEMMs, the MLP / MoE block's share of
    those). The backward runs two GEMMs of the forward's shape per forward GEMM (input and weight gradients, SC21
    Sec. 5.1) at the MAMF-based rate; the forward at that rate times ``fprop_rate_factor``. Shapes:
    ``flops.layer_gemm_shapes``."""
    fwd_rate, rate, hbm, el = weight_gemm_rates(model, cluster, job, par, framework)
    if model.mla is not None:
        n_attn = (1 if model.mla.q_lora_rank is None else 2) + 3
        up_idx = {n_attn - 2} | ({1} if model.mla.q_lora_rank is not None else set())
    else:
        n_attn, up_idx = 2, set()
    total = mlp = up = backward = backward_mlp = 0.0
    for idx, (m, k, n, cnt) in enumerate(_local_gemms(model, par, job, layer)):
        g = cnt * gemm_time(m, k, n, fwd_rate, hbm, el)
        gb = 2 * cnt * gemm_time(m, k, n, rate, hbm, el)
        backward += gb
        total += g
        if idx >= n_attn:
            mlp += g
            backward_mlp += gb
        elif idx in up_idx:
            up += g
    return total, mlp, up, backward, backward_mlp


def op_sac_recomputed_gemms_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                              layer: int, framework: str) -> float:
    """Forward GEMM seconds of decoder layer ``layer`` (one micro-batch, one GPU) that torchtitan's per-op selective
    activation checkpointing re-runs in backward: its policy saves the output of every ``aten.mm`` except every
    second one in execution order (``_save_list`` / ``_custom_policy`` in ``parallelize_llama.py``, torchtitan
    9dec370 (2024-12) and 820504e (2025-06): "Saves output of all compute ops, except every second mm").

    torchtitan's linears are separate modules, so the fused shapes of ``flops.layer_gemm_shapes`` are split back:
    QKV into ``wq, wk, wv`` (by width), a gated MLP's up-projection into ``w1, w3``; in a Llama layer the
    recomputed ones are ``wk``, ``wo`` and ``w3`` (~37% of the forward GEMM FLOPs of Llama 3 8B). Float8 linears
    count the same (the checkpoint's dispatch mode sees ``aten.mm`` on the float8 tensor subclass)."""
    rate, _, hbm, el = weight_gemm_rates(model, cluster, job, par, framework)  # recomputed forwards: forward rate
    mms: list[tuple[float, float, float, float]] = []  # (m, k, n, count) per aten.mm, execution order
    shapes = _local_gemms(model, par, job, layer)
    for idx, (m, k, n, cnt) in enumerate(shapes):
        if idx == 0 and model.mla is None:  # fused QKV -> wq, wk, wv
            q, kv = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
            mms += [(m, k, n * w / (q + 2 * kv), cnt) for w in (q, kv, kv)]
        elif model.gated_mlp and idx == len(shapes) - 2 and idx > 1:  # fused w1 | w3 -> w1, w3
            mms += [(m, k, n / 2, cnt), (m, k, n / 2, cnt)]
        else:
            mms.append((m, k, n, cnt))
    return sum(cnt * gemm_time(m, k, n, rate, hbm, el) for j, (m, k, n, cnt) in enumerate(mms) if j % 2 == 1)


def expert_gemms_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                   framework: str) -> tuple[float, float, float, float]:
    """Seconds of one local expert's fc1 and fc2 GEMMs for one micro-batch (balanced routing: each expert receives
    ``top_k / E`` of the tokens of the ``ep`` ranks, times the capacity factor under drop-and-pad), as
    ``layer_gemms_s`` charges them: (fc1 forward, fc2 forward, fc1 dgrad or wgrad, fc2 dgrad or wgrad). The forward
    at the rate times ``fprop_rate_factor``; each backward GEMM has the forward's shape, at the MAMF-based rate.
    (0, 0, 0, 0) for a dense model."""
    if model.moe is None:
        return 0.0, 0.0, 0.0, 0.0
    fwd_rate, rate, hbm, el = weight_gemm_rates(model, cluster, job, par, framework)
    tok = par.micro_batch_size * job.seq_length / par.cp
    moe, etp, h = model.moe, par.expert_tp, model.hidden_size
    m = tok * moe.top_k / moe.num_experts * job.routed_token_factor * par.ep * etp / par.tp
    up = 2 if model.gated_mlp else 1
    shapes = ((m, h, up * moe.expert_ffn_hidden_size / etp), (m, moe.expert_ffn_hidden_size, h / etp))
    fwd = [gemm_time(*s, fwd_rate, hbm, el) for s in shapes]
    bwd = [gemm_time(*s, rate, hbm, el) for s in shapes]
    return fwd[0], fwd[1], bwd[0], bwd[1]


def logits_gemm_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                  framework: str) -> float:
    """Forward seconds of the output layer's logits GEMM (``tokens x h`` by ``h x V/tp``) for one micro-batch.

    Always in the 16-bit dtype, FP8 training included: Megatron-LM's output layer is a plain
    ``tensor_parallel.ColumnParallelLinear``, outside Transformer Engine's ``fp8_autocast`` modules
    (``megatron/core/models/gpt/gpt_model.py``), and torchtitan's float8 conversion skips the ``output`` linear
    (``torchtitan/float8.py`` at 9dec370: ``module_filter_fn=lambda mod, fqn: fqn != "output"``)."""
    half = "fp32" if job.precision == "fp32" else half_dtype(cluster)  # fp32 training: TF32 GEMM, fp32 operands
    rate = gemm_rate(cluster, half)
    tok = par.micro_batch_size * job.seq_length / par.cp
    return gemm_time(tok, model.hidden_size, model.padded_vocab_size(par.tp) / par.tp, rate, hbm_rate(cluster),
                     operand_bytes(half))


def mtp_projection_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                     framework: str) -> tuple[float, float]:
    """Seconds of one multi-token-prediction module's input projection ``2h -> h`` (DeepSeek-V3 Sec. 2.2),
    TP-sharded on the output, for one micro-batch: (forward at the rate times ``fprop_rate_factor``, backward: its
    input- and weight-gradient GEMMs at the MAMF-based rate)."""
    fwd_rate, rate, hbm, el = weight_gemm_rates(model, cluster, job, par, framework)
    tok = par.micro_batch_size * job.seq_length / par.cp
    h = model.hidden_size
    return (gemm_time(tok, 2 * h, h / par.tp, fwd_rate, hbm, el),
            2 * gemm_time(tok, 2 * h, h / par.tp, rate, hbm, el))
