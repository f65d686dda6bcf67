"""Step time, throughput, MFU and HFU of one parallel configuration: ``estimate_step`` composes the cost terms.

Per micro-batch and per pipeline (virtual) stage, on one GPU (seconds), one module per term:

* **GEMMs** (``gemm.py``): weight GEMMs at the MAMF rate plus operand streaming (roofline); backward 2x.
* **Attention core** (``attention.py``): fused flash attention at a sequence-length-dependent efficiency, or the
  unfused batched GEMMs + score passes of the SC21/BLOOM era.
* **Memory-bound work** (``elementwise.py``): norms, residuals, activations, FP8 casts, the
  cross-entropy over the logits and the embedding gather, at the HBM bandwidth.
* **MoE overhead** (``moe_overhead.py``): routing bookkeeping (router kernel, token permutation, a fitted remainder
  per routed copy), host time per local expert.
* **Recompute** (``layer_cost.py``): full recompute re-runs the forward (compute and its TP / EP collectives) of
  each recomputed layer before its backward: every layer, or with ``recompute_num_layers`` N the first N layers
  of each model chunk (Megatron ``--recompute-method block``; ``flops.recomputed_layers``, the same layers HFU
  counts); selective recompute re-runs the modules it names (Korthikanti et al. 2022 Sec. 5), or under torchtitan
  its per-op policy: every other weight GEMM, all memory-bound work and the TP all-gathers.
* **TP / CP / EP collectives** (``collectives.py``): per layer, exposed unless the framework overlaps them.
* **Pipeline** (``pipeline.py``): the schedule is simulated op by op with these per-stage times (GPipe, 1F1B,
  interleaved, ZB-H1), P2P activation sends on the critical path; the bubble is the idle time of the busiest rank.
* **Data parallel** (``data_parallel.py``): gradient reduction and parameter gathers (ZeRO 0-3, HSDP), exposed as
  far as the framework's schedule leaves them.
* **Optimizer step** (``optimizer_step.py``): memory-bound Adam.

MFU = model FLOPs per step / (step seconds x GPUs x dense peak of the 16-bit dtype); HFU adds recompute
(PaLM App. B). The peak used is named in ``StepEstimate.peak_flops_per_gpu``.

Calibration. Data, with their sources: per GPU in the cluster YAMLs (``gemm_efficiency``: the MAMF large-GEMM rate;
NCCL bus efficiencies and per-hop latencies; HBM bandwidth), and per operation in
``cluster_specs/data/efficiency/`` (``attention.yaml``: fused-attention kernel TFLOP/s against sequence length).
Counted from the frameworks' source, not fitted: the elementwise passes of Megatron / NeMo (10, + 2 with rotary
embeddings, + 2 over the FFN width for an activation megatron-core does not fuse) and of torchtitan (eager and compiled, kernel by kernel), the cross-entropy's bytes per logit of each
implementation (``elementwise.CE_BYTES_PER_LOGIT``), which backward TP collectives run under the column-parallel
GEMMs (``collectives.tp_backward_shares``), the per-expert host operations of TE 2.8's grouped GEMMs, the recompute
(torchtitan's per-op policy included), ZeRO and pipeline schedules.
Fitted: the constants listed in each module's ``FIT_RANGES`` (a physical quantity, its plausible range and why),
inside those ranges, by ``planner/calibration.py`` on the dev rows of ``planner/data/published_runs_dev.yaml``
(``benchmarks/fit_step_time.py`` prints them with their ranges and the leave-one-source-group-out errors):

===========================================  ========  ==========  ==============================================
constant (module)                            value     range       mainly constrained by
===========================================  ========  ==========  ==============================================
``KAPPA`` (gemm)                             1.99      0.5-4       small GEMMs: SC21 1.7-18B, H100 weak scaling
``POWER_CLOCK_EXPONENT`` (gemm)              2.29      1-3         torchtitan on 500 W H100s vs 700 W H200s
``ATTENTION_TRAINING_SHARE`` (attention)     0.59      0.4-1       long-sequence CP rows, 8k Llama rows
``UNFUSED_SCORE_PASSES`` (attention)         6.42      4-8         SC21, BLOOM (unfused softmax; their dropout apart)
``ELEMENTWISE_PASSES`` deepspeed             40        8-40        BLOOM rows (edge)
``TP_OVERLAP_EXPOSED`` megatron / torchtitan 0 / 0.63  0-0.5/0-0.7 NeMo recipes / torchtitan async TP
``EP_OVERLAP_EXPOSED`` (collectives)         0.47      0-1         MoE rows with EP overlap
``HOST_QUANTIZE_S`` mx / cs                  71/271 us 10-120/     FP8 MoE rows; cs near its range's top (one row)
                                                       20-300 us
``MOE_TOKEN_COPY_S`` (moe_overhead)          16.7 ns   0-50 ns     MoE rows: routing beyond the measured kernels
===========================================  ========  ==========  ==============================================

``OVERLAP_COMPUTE_SLOWDOWN`` (0.189) is not fitted: Lee et al. 2025 (arXiv 2507.03114) average measured slowdown of
compute under overlapped NCCL collectives (FSDP / ZeRO layer-wise traffic and the overlapped gradient reduction and
parameter gather alike). Measured, not fitted: NCCL over Jean Zay's Omni-Path reaches 0.40 of a 100 Gb/s port (cluster
YAML jean-zay-a100, BigScience's all-reduce benchmark on that partition); the host time of one expert GEMM call, 16.5
us (``moe_overhead.HOST_GEMM_S``: eager GEMM calls timed on an H200 machine, ``benchmarks/gemm_measured.py``); the
share of its saturated rate a fused-attention call reaches against its thread blocks per SM (``attention.yaml``
``occupancy``) and an unmasked call's rate over a causal one's (``non_causal_ratio``), both timed on an H200
(``benchmarks/measure_device.py``); the MoE token permutation's share of the HBM bandwidth and the router kernel's
time (``moe_overhead.PERMUTE_HBM_FRACTION``, ``ROUTER_KERNEL_S``: Transformer Engine's Triton permutation kernels and
``torch.topk`` timed on an H200, ``benchmarks/moe_routing_device.py``). Counted: dropout's extra score passes and masks
(``attention.DROPOUT_SCORE_PASSES``, ``elementwise.DROPOUT_MASK_BYTES``), FSDP2's copy-out of each gathered layer
(``FSDP2_COPY_OUT_PASSES``), the share of the board power that does not follow the clock under a power cap
(``gemm.UNCORE_POWER_FRACTION``). Read from the rows'
recipes (each row's ``setup`` block, ``planner/row_options.py``): DeepSeek-V3 node-limited routing in the EP
all-to-all (``ep_domain_copies``), Megatron pipeline layouts and the Megatron-Bridge DeepSeek-V3 presets (EP overlap,
full-iteration CUDA graph).

Result on the dev rows (``plan3d validate --cross-validate``, 91 evaluated rows): MAPE 5.06% in-sample, 6.35%
leave-one-source-group-out, each fold fitted from the middle of the ranges, every group within 10% held out (the
highest: the Megatron-LM Llama example, 9.40%, and the MoE recipes, 9.07%);
Korthikanti et al. 2022 Table 5 (held out, ``tests/test_korthikanti_table5.py``): 1.71% mean, 2.98% max.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .attention import (ATTN_BWD_FACTOR, ATTN_HALF_SEQ, DEFAULT_ATTENTION_EFFICIENCY,  # noqa: F401 (re-exported)
                        UNFUSED_SCORE_PASSES, attention_efficiency)
from .collectives import (EP_OVERLAP_EXPOSED, TP_OVERLAP_EXPOSED, ep_domain_copies,  # noqa: F401 (re-exported)
                          ep_exposed_share, pipeline_p2p_s, tp_backward_shares, tp_exposed_share)
from .activation_offload import offloaded_bytes, transfer_exposed_s
from .config import FlopsConvention, ParallelConfig, TrainingJob
from .data_parallel import (FSDP_REDUCE_EVERY_MICROBATCH, OVERLAP_COMPUTE_SLOWDOWN,  # noqa: F401 (re-exported)
                            dp_exposed_s, dp_sync_s, fsdp_exposed_s, reduced_gradient_bytes)
from .elementwise import (CE_BYTES_PER_LOGIT, ELEMENTWISE_PASSES, cross_entropy_bytes,  # noqa: F401 (re-exported)
                          cross_entropy_s, embedding_s)
from .flops import recomputed_layers, step_hardware_flops, step_model_flops
from .fp8_recipe import job_host_cost_class
from .gemm import (KAPPA, gemm_rate, gemm_time, hbm_rate, peak_dtype,  # noqa: F401 (re-exported)
                   logits_gemm_s, mtp_projection_s)
from .layer_cost import (OP_SAC_TP_SHARE, LayerCost, layer_cost, recompute_breakdown_s, selective_recompute_s,
                         uses_op_sac)
from .layout import (GroupPlacement, LayoutError, group_placement, rank_chunks, rank_stages,  # noqa: F401
                     virtual_stage)
from .activations import activation_terms_per_layer
from .memory import stage_params
from .moe_overhead import moe_host_exposed_s, moe_routing_s  # noqa: F401 (re-exported)
from .optimizer_offload import offloaded_optimizer_step
from .optimizer_step import ADAM_HBM_BYTES_PER_PARAM, local_params, optimizer_step_s  # noqa: F401 (re-exported)
from .pipeline import PAIRING_SCHEDULES, chunks_per_rank, simulate

# Names other modules use (planner/solver.py reads the per-layer costs for its lower bounds).
_LayerCost = LayerCost
_layer_cost = layer_cost
_gemm_rate = gemm_rate
_hbm = hbm_rate
_attn_eff = attention_efficiency


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
    #: number format whose dense peak is ``peak_flops_per_gpu`` (the MFU / HFU denominator): the 16-bit one (bf16,
    #: or fp16 on GPUs without bf16) also for FP8 runs, as the published FP8 summaries report it (NeMo 24.07 perf
    #: summary, Megatron-LM Llama recipes, torchtitan)
    mfu_peak_dtype: str = "bf16"
    flops_convention: str = "megatron"
    #: per-rank forward / backward seconds of one micro-batch (virtual stages in pipeline order, length
    #: pp * pipeline.chunks_per_rank)
    stage_forward_s: list[float] = field(default_factory=list)
    stage_backward_s: list[float] = field(default_factory=list)
    #: the weight-gradient part of each backward (zero-bubble and DualPipe schedules split it out), and the
    #: communication of each forward / backward that an overlapped partner op hides (DualPipe, DualPipeV, combined
    #: 1F1B), seconds per virtual stage
    stage_wgrad_s: list[float] = field(default_factory=list)
    stage_hide_forward_s: list[float] = field(default_factory=list)
    stage_hide_backward_s: list[float] = field(default_factory=list)
    p2p_s: float = 0.0
    pp: int = 1
    schedule: str = "1f1b"
    framework: str = "megatron"
    #: seconds per step of each compute kind on the busiest rank (gemm, attention, memory_bound)
    compute_breakdown_s: dict[str, float] = field(default_factory=dict)


def _default_framework_options(framework: str, model: ModelSpec, cluster: ClusterSpec, job: TrainingJob,
                               par: ParallelConfig, fp8_recipe: str | None, tp_comm_overlap: bool | None,
                               overlap_dp: bool | None) -> tuple[str, bool, bool]:
    """(fp8 host-cost class, TP overlap, DP overlap) with the framework defaults filled in (see ``estimate_step``):
    the host-cost class of ``job.fp8_recipe`` when the job names one."""
    fw_base = framework.split("_")[0]
    if fp8_recipe is None:
        fp8_recipe = job_host_cost_class(job, cluster, model, par, framework)
    if tp_comm_overlap is None:
        tp_comm_overlap = fw_base in ("nemo",)
    if overlap_dp is None:
        overlap_dp = default_overlap_dp(framework, par.pp)
    return fp8_recipe, tp_comm_overlap, overlap_dp


def default_overlap_dp(framework: str, pp: int) -> bool:
    """Whether ``framework`` overlaps the data-parallel reduction with the backward by default (``estimate_step``'s
    ``overlap_dp`` None): Megatron-LM no (``--overlap-grad-reduce`` is opt-in); NeMo and torchtitan yes; DeepSpeed
    without pipeline parallelism (``overlap_comm``), not with it (its ``PipelineEngine`` reduces after the whole
    schedule, ``runtime/pipe/schedule.py`` ``ReduceGrads``)."""
    fw_base = framework.split("_")[0]
    return fw_base in ("nemo", "torchtitan") or (fw_base == "deepspeed" and pp == 1)


@dataclass
class _Stages:
    """Per virtual stage (pipeline order, ``layout.virtual_stage``) forward / backward seconds of one micro-batch,
    the weight-gradient part of each backward and the EP communication a paired partner op hides, and per rank the
    exposed TP / CP / EP seconds of one micro-batch's forward + backward (+ recompute)."""

    fwd: list[float]
    bwd: list[float]
    wgt: list[float]
    hide_f: list[float]
    hide_b: list[float]
    exposed: dict[str, list[float]]


def _stage_times(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, framework: str,
                 chunks: list[list[list[int]]], lc, tp_exp: float, tp_b: tuple[float, float], ep_exp: float,
                 ep_hide: float, fp8_recipe: str, full_cuda_graph: bool) -> _Stages:
    """Sum the layer costs over each model chunk: forward, backward (+ recompute), the output layer and MTP
    modules on the last virtual stage, the embedding on the first. ``ep_hide``: share of each layer's EP all-to-all
    a paired forward/backward hides behind the partner's compute (DualPipe, DualPipeV, combined 1F1B)."""
    v = len(chunks[0])
    n = par.pp * v
    out = _Stages([0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n,
                  {"tp": [0.0] * par.pp, "cp": [0.0] * par.pp, "ep": [0.0] * par.pp, "host": [0.0] * par.pp})
    rc_layers = set(recomputed_layers(model, par))  # decoder layers that full recompute re-runs
    sac = uses_op_sac(framework)
    # activation offloading: bytes each layer copies to the host in forward and back before backward
    # (cost_models/activation_offload.py), over the cluster's host link; per layer kind (dense, MoE)
    off_mods = getattr(par, "offload_modules", None)
    fw_base = framework.split("_")[0]
    off_kind = {k: offloaded_bytes(activation_terms_per_layer(model, job, par, i, fw_base), off_mods)
                for k, i in ((False, 0), (True, next((j for j in range(model.num_layers)
                                                       if model.is_moe_layer(j)), None))) if i is not None} \
        if off_mods else {}
    link = cluster.host_link_bytes_per_s
    for r in range(par.pp):
        for c, chunk in enumerate(chunks[r]):
            k = virtual_stage(par, r, c)
            f = bw = 0.0
            for i in chunk:
                x = lc(i)
                full_i = i in rc_layers
                fwd_i, bwd_i = layer_pass_s(model, cluster, job, par, i, x, framework, tp_exp, ep_exp, fp8_recipe,
                                            full_cuda_graph, full_i, tp_b)
                off = 0.0 if full_i else off_kind.get(model.moe is not None and model.is_moe_layer(i), 0.0)
                if off:
                    # the copy runs under the layer's forward compute (D2H) and its backward (H2D reload)
                    off = transfer_exposed_s(off, x.compute_forward_s(), link) + \
                        transfer_exposed_s(off, bwd_i - x.comm_backward_s(tp_b, ep_exp), link)
                    out.exposed["host"][r] += off
                    bwd_i += off
                # TP share that recompute re-runs (``layer_pass_s``)
                rc_tp = 1.0 if full_i else (OP_SAC_TP_SHARE if par.recompute == "selective" and sac else 0.0)
                f += fwd_i
                bw += bwd_i
                out.wgt[k] += x.gemm_backward / 2  # the weight-gradient GEMMs: one of the backward's two
                out.hide_f[k] += ep_hide * x.ep
                out.hide_b[k] += ep_hide * x.ep
                out.exposed["tp"][r] += (1 + rc_tp) * x.tp * tp_exp + x.tp_backward_s(tp_b)
                out.exposed["cp"][r] += 3 * x.cp
                out.exposed["ep"][r] += ep_exp * (2 * x.ep + (x.ep if full_i else 0))
            if k == n - 1:
                lf, lb, lw = output_layer_s(model, cluster, job, par, framework, lc, tp_exp, ep_exp, tp_b,
                                            fp8_recipe, full_cuda_graph)
                f += lf
                bw += lb
                out.wgt[k] += lw
                if model.num_mtp_layers:  # the MTP layers' TP / CP / EP communication ``output_layer_s`` charged
                    xm = lc(model.num_layers - 1)
                    rc_tp = OP_SAC_TP_SHARE if par.recompute == "selective" and sac else 0.0
                    out.exposed["tp"][r] += model.num_mtp_layers * ((1 + rc_tp) * xm.tp * tp_exp
                                                                    + xm.tp_backward_s(tp_b))
                    out.exposed["cp"][r] += model.num_mtp_layers * 3 * xm.cp
                    out.exposed["ep"][r] += model.num_mtp_layers * 2 * ep_exp * xm.ep
            if k == 0:
                emb = embedding_s(model, cluster, job, par)
                f += emb
                bw += 2 * emb
            out.fwd[k] = f
            out.bwd[k] = bw
    return out


def layer_pass_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                 x: LayerCost, framework: str, tp_exp: float, ep_exp: float, fp8_recipe: str, full_cuda_graph: bool,
                 full_recompute: bool, tp_b: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward + recompute) seconds of decoder layer ``layer`` (costs ``x``, ``layer_cost.layer_cost``)
    for one micro-batch on one GPU: compute, the exposed TP / CP / EP communication (``tp_exp`` / ``ep_exp``: the
    forward shares not overlapped; ``tp_b``: the backward's TP shares, ``collectives.tp_backward_shares``), MoE
    routing bookkeeping and the host time of the per-expert work the GPU cannot hide, and what recompute re-runs
    before the backward: the whole forward under full recompute of the layer, else selective recompute's modules
    (with the TP all-gathers of torchtitan's per-op policy)."""
    host_f, host_b = moe_host_exposed_s(model, cluster, job, par, layer, framework, fp8_recipe, full_cuda_graph,
                                        (x.compute_forward_s(), x.compute_backward_s()))
    fwd = x.compute_forward_s() + x.routing_f + host_f + x.comm_forward_s(tp_exp, ep_exp)
    bwd = x.compute_backward_s() + x.routing_b + host_b + x.comm_backward_s(tp_b, ep_exp)
    if full_recompute:
        return fwd, bwd + fwd
    if par.recompute != "selective":
        return fwd, bwd
    rc_tp = OP_SAC_TP_SHARE if uses_op_sac(framework) else 0.0
    return fwd, bwd + selective_recompute_s(x, par, framework) + rc_tp * x.tp * tp_exp


def output_layer_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, framework: str,
                   lc, tp_exp: float, ep_exp: float, tp_b: tuple[float, float], fp8_recipe: str,
                   full_cuda_graph: bool) -> tuple[float, float, float]:
    """(forward, backward, the backward's logits weight-gradient GEMMs) seconds of the output layer (logits GEMM +
    cross-entropy over the ``V/tp`` logits, ``elementwise.cross_entropy_s``) and of each multi-token-prediction
    module (DeepSeek-V3 Sec. 2.2: projection 2h -> h, one more decoder layer, its own logits), which run on the last
    stage (Megatron-LM ``mtp_num_layers``). The MTP decoder layer is a layer of the last layer's kind, costed as one
    (``layer_pass_s``: its MoE routing and host time included; not recomputed). ``tp_b``, ``fp8_recipe``,
    ``full_cuda_graph``: as in ``layer_pass_s``."""
    lg = logits_gemm_s(model, cluster, job, par, framework)
    ce_f, ce_b = cross_entropy_s(model, cluster, job, par, framework)
    n_heads = 1 + model.num_mtp_layers
    f = n_heads * (lg + ce_f)
    bw = n_heads * (2 * lg + ce_b)
    last = model.num_layers - 1
    for _ in range(model.num_mtp_layers):
        proj_f, proj_b = mtp_projection_s(model, cluster, job, par, framework)
        lf, lb = layer_pass_s(model, cluster, job, par, last, lc(last), framework, tp_exp, ep_exp, fp8_recipe,
                              full_cuda_graph, False, tp_b)
        f += lf + proj_f
        bw += lb + proj_b
    return f, bw, n_heads * lg


def _compute_breakdown_s(model: ModelSpec, par: ParallelConfig, layers, lc, m: int,
                         framework: str) -> dict[str, float]:
    """Seconds per step of each compute kind (gemm, attention, memory_bound: MoE routing bookkeeping included) on
    the rank holding ``layers``, recompute included."""
    kinds = {"gemm": 0.0, "attention": 0.0, "memory_bound": 0.0}
    rc_layers = set(recomputed_layers(model, par))
    for i in layers:
        x = lc(i)
        rcg, rca, rcm = recompute_breakdown_s(x, par, i in rc_layers, framework)
        kinds["gemm"] += m * (x.gemm + x.gemm_backward + rcg)
        kinds["attention"] += m * (x.attn_f + x.attn_b + rca)
        kinds["memory_bound"] += m * (3 * x.mem + x.routing_f + x.routing_b + rcm)  # MoE routing with it
    return kinds


def other_compute_s(compute_s: float, kinds_s) -> float:
    """Compute seconds outside the named kinds (GEMMs, attention, memory-bound): ``compute_s`` less their sum, 0 where
    that is below a relative 1e-9 (floating-point residue of summing the same terms in another order)."""
    other = compute_s - sum(kinds_s)
    return other if other > 1e-9 * compute_s else 0.0


def estimate_step(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                  convention: FlopsConvention = "megatron", framework: str | None = None,
                  tp_comm_overlap: bool | None = None, overlap_dp: bool | None = None,
                  ep_overlap: bool = False, full_cuda_graph: bool = False,
                  fp8_recipe: str | None = None, stages: frozenset[int] | None = None,
                  async_tp_backward: bool | None = None) -> StepEstimate:
    """Step time of ``par`` on ``cluster`` (see module docstring). Raises ``LayoutError`` on an impossible split.

    ``framework`` selects the kernel set (``elementwise.layer_passes``: megatron, nemo, deepspeed, torchtitan,
    torchtitan_compile) and the ZeRO-2/3 communication schedule; None = ``job.framework``. ``tp_comm_overlap`` /
    ``overlap_dp``: None = the framework default (Megatron-LM: off / off, NeMo and torchtitan: on / on; DeepSpeed:
    off / on without pipeline parallelism, off with it: its ``PipelineEngine`` reduces gradients after the whole
    schedule, ``runtime/pipe/schedule.py`` ``ReduceGrads``). ``ep_overlap``: EP all-to-all overlapped with another
    micro-batch's compute. ``full_cuda_graph``: the whole step is captured in CUDA graphs (Megatron
    ``--cuda-graph-scope full``), removing the host time of the per-expert work
    (``moe_overhead.moe_host_exposed_s``). ``fp8_recipe``:
    host-cost class of the FP8 expert quantization, ``mx`` (MXFP8 / blockwise) or ``cs`` (per-tensor current or
    delayed scaling), selecting ``moe_overhead.HOST_QUANTIZE_S``; None = the class of the recipe the job runs
    (``fp8_recipe.job_fp8_recipe``: ``job.fp8_recipe``, else torchtitan's tensorwise, else ``default_fp8_recipe``:
    MXFP8 on Blackwell, blockwise for MoE models on Hopper, else per-tensor).
    ``par.pipeline_layout`` (Megatron ``--pipeline-model-parallel-layout``) places the layers per model chunk instead
    of the even / first-last split; the embedding sits on the first chunk, the output layer and MTP on the last.
    ``stages``: the pipeline ranks whose per-rank terms are reported (busiest rank, exposed TP/CP/EP, data-parallel
    reduction of the largest stage, optimizer step); None = all. ``async_tp_backward``: the column-parallel linears'
    backward TP collectives run under their backward GEMMs (``collectives.tp_backward_shares``); None = the
    framework's default (Megatron-LM since 2021-09 and NeMo: yes). A pipeline whose stages sit on pools of different
    GPUs and networks (``cost_models.pools``) times each pool's ranks on that pool's cluster.
    """
    framework = framework or getattr(job, "framework", None) or "megatron"
    fw_base = framework.split("_")[0]
    fp8_recipe, tp_comm_overlap, overlap_dp = _default_framework_options(
        framework, model, cluster, job, par, fp8_recipe, tp_comm_overlap, overlap_dp)
    m = max(1, par.num_microbatches(job.global_batch_size))
    groups = {d: group_placement(d, par, cluster.node.nvlink_domain_size) for d in ("tp", "cp", "ep", "dp", "pp")}
    cache: dict[tuple, LayerCost] = {}

    def lc(i: int) -> LayerCost:
        key = model.layer_kind(i)  # (MoE, attention window): the costs depend on the layer only through it
        if key not in cache:
            cache[key] = layer_cost(model, cluster, job, par, i, framework, groups)
        return cache[key]

    tp_exp, ep_exp = tp_exposed_share(fw_base, tp_comm_overlap), ep_exposed_share(ep_overlap)
    tp_b = tp_backward_shares(fw_base, tp_comm_overlap, par.sequence_parallel, async_tp_backward)
    # schedules that pair a forward with another micro-batch's backward hide the EP all-to-all of each behind the
    # other's compute, leaving EP_OVERLAP_EXPOSED of it (``pipeline_ops.fb_seconds``); not twice with ``ep_overlap``
    ep_hide = 0.0 if ep_overlap or par.pipeline_schedule not in PAIRING_SCHEDULES else 1.0 - EP_OVERLAP_EXPOSED
    v = chunks_per_rank(par.pipeline_schedule, par.vpp)
    ranges, chunks = rank_chunks(model.num_layers, par, v)
    st_times = _stage_times(model, cluster, job, par, framework, chunks, lc, tp_exp, tp_b, ep_exp, ep_hide,
                            fp8_recipe, full_cuda_graph)
    fwd_v, bwd_v = st_times.fwd, st_times.bwd
    own = (lambda r: True) if stages is None else stages.__contains__  # the ranks whose terms are reported

    def rank_s(r: int, per_stage: list[float]) -> float:
        return sum(per_stage[virtual_stage(par, r, c)] for c in range(v))

    busiest = max((r for r in range(par.pp) if own(r)), key=lambda r: rank_s(r, fwd_v) + rank_s(r, bwd_v))
    kinds = _compute_breakdown_s(model, par, ranges[busiest], lc, m, framework)

    p2p = pipeline_p2p_s(model, cluster, job, par, groups)
    sim = simulate(par.pipeline_schedule, par.pp, m, fwd_v, bwd_v, vpp=v, p2p_s=p2p, wgt_s=st_times.wgt,
                   hide_f_s=st_times.hide_f, hide_b_s=st_times.hide_b)
    pipeline_s = sim.makespan
    busy = max(sim.busy)
    bubble = max(0.0, pipeline_s - busy)

    # data-parallel gradient reduction / parameter gather and the optimizer step on the most loaded stage
    vocab = model.padded_vocab_size(par.tp)
    # parameters each rank holds: its layers (by the layout's chunks when one is given), both stages under DualPipe
    held = [[i for s in rank_stages(par, r) for i in ranges[s]] for r in range(par.pp)]
    sp_max = max((stage_params(model, par, st, lay, vocab) for st, lay in enumerate(held) if own(st)),
                 key=lambda x: x.total)
    sync = dp_sync_s(model, cluster, job, par, sp_max, groups, fw_base)
    dp_exposed = dp_exposed_s(sync, par, fw_base, overlap_dp, m, first_fwd_s=rank_s(busiest, fwd_v),
                              last_bwd_s=rank_s(busiest, bwd_v),
                              units=max(1, len(ranges[busiest])))  # FSDP units: decoder layers on the busiest rank
    optimizer = optimizer_step_s(cluster, par, sp_max)
    offload_f = getattr(par, "optimizer_cpu_offload_fraction", 0.0)
    if offload_f > 0:
        # (part of) the optimizer in host memory: gradient and parameter copies and CPU Adam
        # (cost_models/optimizer_offload.py); gradients copied at the reduction's width
        grad_b = reduced_gradient_bytes(par, job.precision, fw_base)
        optimizer = offloaded_optimizer_step(cluster, fw_base, local_params(par, sp_max), offload_f, optimizer,
                                             grad_bytes=grad_b, num_microbatches=m,
                                             backward_s=rank_s(busiest, bwd_v)).exposed_s

    exposed = {k: m * st_times.exposed[k][busiest] for k in ("tp", "cp", "ep")}
    # the EP all-to-all a paired schedule hid behind the partner op's compute (``pipeline.simulate``)
    exposed["ep"] = max(0.0, exposed["ep"] - (sim.hidden or [0.0] * par.pp)[busiest])
    # P2P sends on the warm-up / cool-down critical path (the steady state overlaps them with compute)
    exposed["pp"] = min(bubble, 2 * (par.pp - 1) * v * p2p) if par.pp > 1 else 0.0
    exposed["dp"] = dp_exposed
    if getattr(par, "offload_modules", None):
        exposed["host"] = m * st_times.exposed["host"][busiest]
    step = pipeline_s + dp_exposed + optimizer
    compute = busy - exposed["tp"] - exposed["cp"] - exposed["ep"] - exposed.get("host", 0.0)
    # embedding, output layer, cross-entropy, MTP and host-bound time are the rest of the busiest rank's compute
    kinds["other"] = other_compute_s(compute, kinds.values())
    n_gpus = par.world_size
    done = par.processed_share(job.global_batch_size)  # 1 unless the layout breaks the batch rule
    mf = done * step_model_flops(model, job, convention)
    # HFU in the same convention: model FLOPs plus what recompute re-executes (PaLM App. B)
    hf = mf + done * (step_hardware_flops(model, job, par) - step_model_flops(model, job, "megatron"))
    mfu_dtype = peak_dtype(cluster, job.precision)  # the TF32 peak for fp32 training
    peak = cluster.gpu.peak_flops[mfu_dtype]
    return StepEstimate(
        step_s=step, compute_s=compute, bubble_s=bubble, optimizer_s=optimizer, exposed_comm_s=exposed,
        bubble_fraction=bubble / step if step > 0 else 0.0, num_microbatches=m,
        tokens_per_s=done * job.tokens_per_step / step, model_flops=mf, hardware_flops=hf,
        tflops_per_gpu=mf / step / n_gpus / 1e12, mfu=mf / (step * n_gpus * peak),
        hfu=hf / (step * n_gpus * peak), peak_flops_per_gpu=peak, mfu_peak_dtype=mfu_dtype,
        flops_convention=convention,
        stage_forward_s=fwd_v, stage_backward_s=bwd_v, stage_wgrad_s=st_times.wgt,
        stage_hide_forward_s=st_times.hide_f, stage_hide_backward_s=st_times.hide_b, p2p_s=p2p, pp=par.pp,
        schedule=par.pipeline_schedule,
        framework=framework, compute_breakdown_s=kinds)
