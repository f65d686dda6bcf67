"""Step time, throughput, MFU and HFU of one parallel configuration.

Model (every term below is seconds per optimizer step on the slowest pipeline stage):

* compute: per-stage forward GEMM FLOPs / (tp x cp) at ``peak x gemm_efficiency`` (cluster calibration) for the
  job's precision (FP8 GEMMs at the FP8 rate), attention core at the 16-bit rate; backward = 2 x forward
  (Narayanan et al. SC21 Sec. 5.1); recompute adds its forward FLOPs (K22 Sec. 5).
* tensor parallel: 4 all-reduces (or all-gather + reduce-scatter pairs under SP, same bytes) of ``2*b*s*h``
  bytes per layer per micro-batch (2 forward, 2 backward; formulas.md Sec. 6), not overlapped.
* context parallel: ring attention passes K and V ``(cp-1)`` times forward and twice that backward
  (formulas.md Sec. 6); exposed only where it exceeds the attention compute it overlaps.
* expert parallel: dispatch + combine all-to-all per MoE layer, forward and backward, not overlapped.
* pipeline: the bubble, ``bubble_ratio x`` ideal compute (``cost_models.pipeline``), plus the point-to-point
  activation transfers on the warm-up/cool-down critical path.
* data parallel: gradient all-reduce (ZeRO 0) or reduce-scatter + parameter all-gather (ZeRO >= 1, Megatron's
  distributed optimizer), fp32 gradients; overlapped with the last micro-batch's backward (Megatron
  ``--overlap-grad-reduce``), so only the excess is exposed. ZeRO-3 also all-gathers parameters in forward and
  backward of every micro-batch.
* optimizer step: memory-bound Adam, ~34 bytes of HBM traffic per local parameter (read fp32 grad, master, m,
  v; write master, m, v and the 16-bit weight) at the GPU's HBM bandwidth.

MFU = model FLOPs per step / (step seconds x GPUs x dense peak of the 16-bit dtype); HFU adds recompute
(PaLM App. B). The peak used is named in ``StepEstimate.peak_flops_per_gpu``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .comm import collective_time
from .config import BYTES_16BIT, BYTES_FP32, FlopsConvention, ParallelConfig, TrainingJob
from .flops import (attention_core_flops_per_token, layer_gemm_flops_per_token, logits_flops_per_token,
                    step_hardware_flops, step_model_flops)
from .layout import GroupPlacement, group_placement, stage_layer_ranges
from .memory import stage_params
from .pipeline import bubble_fraction, bubble_ratio

#: HBM bytes moved per local parameter by one fused Adam step (4+4+4+4 read, 4+4+4 write, 2 write = 30, plus
#: the fp32 gradient zeroing 4): derived from the mixed-precision Adam state layout (ZeRO paper Sec. 3.1).
ADAM_HBM_BYTES_PER_PARAM = 34


@dataclass
class StepEstimate:
    """Breakdown of one optimizer step (seconds) and the derived throughput figures."""

    step_s: float
    compute_s: float
    bubble_s: float
    optimizer_s: float
    exposed_comm_s: dict[str, float] = field(default_factory=dict)
    bubble_fraction: float = 0.0
    num_microbatches: int = 1
    tokens_per_s: float = 0.0
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    tflops_per_gpu: float = 0.0
    mfu: float = 0.0
    hfu: float = 0.0
    peak_flops_per_gpu: float = 0.0
    flops_convention: str = "megatron"


def _rates(cluster: ClusterSpec, precision: str) -> tuple[float, float]:
    cal = cluster.calibration.gemm_efficiency
    half = "bf16" if "bf16" in cluster.gpu.peak_flops else "fp16"
    half_rate = cluster.gpu.peak_flops[half] * cal.get(half, min(cal.values()))
    if precision == "fp8":
        gemm = cluster.gpu.peak_flops["fp8"] * cal.get("fp8", cal.get(half, 0.5))
    else:
        gemm = cluster.gpu.peak_flops[precision] * cal.get(precision, cal.get(half, 0.5))
    return gemm, half_rate


def estimate_step(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                  convention: FlopsConvention = "megatron") -> StepEstimate:
    """Step time of ``par`` on ``cluster`` (see module docstring). Raises ``LayoutError`` on an impossible split."""
    gemm_rate, half_rate = _rates(cluster, job.precision)
    b, s, h = par.micro_batch_size, job.seq_length, model.hidden_size
    tokens_mb = b * s  # tokens of one micro-batch (whole sequence, before CP split)
    m = max(1, par.num_microbatches(job.global_batch_size))
    dom = cluster.node.nvlink_domain_size
    tp_g = group_placement("tp", par, dom)
    cp_g = group_placement("cp", par, dom)
    ep_g = group_placement("ep", par, dom)
    dp_g = group_placement("dp", par, dom)
    pp_g = group_placement("pp", par, dom)
    vocab = model.padded_vocab_size(par.tp)
    attn_fwd = attention_core_flops_per_token(model, s, causal_halved=True)

    act_bytes = BYTES_16BIT * tokens_mb * h / par.cp  # one layer's hidden states for one micro-batch on a rank
    tp_per_layer = 4 * collective_time("all_reduce", act_bytes, tp_g, cluster) if par.tp > 1 else 0.0
    kv_w = (model.num_kv_heads * model.head_dim if model.mla is None
            else model.num_attention_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim))
    cp_per_layer = 0.0
    if par.cp > 1:
        kv_bytes = 2 * BYTES_16BIT * tokens_mb / par.cp * kv_w / par.tp
        cp_comm = 3 * (par.cp - 1) * collective_time("p2p", kv_bytes, cp_g, cluster)
        cp_attn = 3 * attn_fwd * tokens_mb / par.cp / par.tp / half_rate
        cp_per_layer = max(0.0, cp_comm - cp_attn)

    ranges = stage_layer_ranges(model.num_layers, par)
    stage_times = []
    tp_exposed = cp_exposed = ep_exposed = 0.0
    for stage, layers in enumerate(ranges):
        gemm = sum(layer_gemm_flops_per_token(model, i) for i in layers) * tokens_mb / (par.tp * par.cp)
        # experts are spread over EP ranks but each rank sees ep x its share of tokens: no change per rank
        attn = len(layers) * attn_fwd * tokens_mb / (par.tp * par.cp)
        if stage == par.pp - 1:
            gemm += logits_flops_per_token(model, vocab) * tokens_mb / (par.tp * par.cp)
        fwd = gemm / gemm_rate + attn / half_rate
        rc = 0.0
        if par.recompute == "selective":
            rc = attn / half_rate
        elif par.recompute == "full":
            n = len(layers) if par.recompute_num_layers is None else min(len(layers), par.recompute_num_layers)
            rc = fwd * n / max(1, len(layers))
        tp_t = len(layers) * tp_per_layer
        cp_t = len(layers) * cp_per_layer
        ep_t = 0.0
        if par.ep > 1 and model.moe is not None:
            n_moe = sum(1 for i in layers if model.is_moe_layer(i))
            a2a = BYTES_16BIT * tokens_mb / par.cp * model.moe.top_k * h / par.tp
            ep_t = n_moe * 4 * collective_time("all_to_all", a2a, ep_g, cluster)
        t = 3 * fwd + rc + tp_t + cp_t + ep_t
        stage_times.append(t)
        if t >= max(stage_times):
            tp_exposed, cp_exposed, ep_exposed = tp_t, cp_t, ep_t
    t_mb = max(stage_times)
    sched = par.pipeline_schedule
    compute_total = m * t_mb
    bubble = bubble_ratio(sched, par.pp, m, par.vpp) * compute_total
    p2p = 0.0
    if par.pp > 1:
        p2p_bytes = act_bytes / (par.tp if par.sequence_parallel else 1)
        p2p = 2 * (par.pp - 1) * par.vpp * collective_time("p2p", p2p_bytes, pp_g, cluster)

    # data-parallel gradient reduction (per GPU local params of the most loaded stage)
    sp_max = max((stage_params(model, par, st, lay, vocab) for st, lay in enumerate(ranges)),
                 key=lambda x: x.total)
    shard = par.dp * par.cp
    dp_group = GroupPlacement(shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
        if shard > 1 else GroupPlacement(1, 1)
    dp_time = 0.0
    if shard > 1:
        grad_bytes = BYTES_FP32 * sp_max.dense
        if par.zero_stage == 0:
            dp_time = collective_time("all_reduce", grad_bytes, dp_group, cluster)
        else:
            dp_time = collective_time("reduce_scatter", grad_bytes, dp_group, cluster)
            dp_time += collective_time("all_gather", BYTES_16BIT * sp_max.dense, dp_group, cluster)
    if par.expert_dp > 1 and sp_max.expert > 0:
        edp = GroupPlacement(par.expert_dp, max(1, min(par.expert_dp, dom // (par.expert_tp * par.ep))))
        dp_time += collective_time("reduce_scatter" if par.zero_stage else "all_reduce",
                                   BYTES_FP32 * sp_max.expert, edp, cluster)
    zero3 = 0.0
    if par.zero_stage >= 3 and shard > 1:
        # parameters gathered in forward and again in backward for every micro-batch
        zero3 = m * 2 * collective_time("all_gather", BYTES_16BIT * sp_max.dense, dp_group, cluster)
        zero3 = max(0.0, zero3 - compute_total)  # prefetch overlaps with compute
    last_bwd = 2 * t_mb / 3
    dp_exposed = max(dp_time / max(1, len(ranges[0])), dp_time - last_bwd)

    local_params = sp_max.dense / (shard if par.zero_stage >= 1 else 1) + \
        sp_max.expert / (par.expert_dp if par.zero_stage >= 1 else 1)
    optimizer = ADAM_HBM_BYTES_PER_PARAM * local_params / cluster.gpu.hbm_bandwidth_bytes_per_s

    exposed = {"tp": m * tp_exposed, "cp": m * cp_exposed, "ep": m * ep_exposed, "pp": p2p,
               "dp": dp_exposed + zero3}
    step = compute_total + bubble + p2p + dp_exposed + zero3 + optimizer
    n_gpus = par.world_size
    mf = step_model_flops(model, job, convention)
    hf = step_hardware_flops(model, job, par)
    peak = cluster.gpu.peak_flops.get("bf16", cluster.gpu.peak_flops.get("fp16"))
    return StepEstimate(
        step_s=step, compute_s=compute_total - m * (tp_exposed + cp_exposed + ep_exposed), bubble_s=bubble,
        optimizer_s=optimizer, exposed_comm_s=exposed,
        bubble_fraction=bubble_fraction(sched, par.pp, m, par.vpp), num_microbatches=m,
        tokens_per_s=job.tokens_per_step / step, model_flops=mf, hardware_flops=hf,
        tflops_per_gpu=mf / step / n_gpus / 1e12, mfu=mf / (step * n_gpus * peak),
        hfu=hf / (step * n_gpus * peak), peak_flops_per_gpu=peak, flops_convention=convention)
