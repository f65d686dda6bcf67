"""Step time, throughput, MFU and HFU of one parallel configuration.

Per micro-batch and per pipeline (virtual) stage, on one GPU (seconds):

* **GEMMs** (``flops.layer_gemm_shapes``): each weight GEMM of ``M`` tokens, input width ``K`` and output width
  ``N`` (after TP/EP sharding) takes ``2MKN / (peak x gemm_efficiency) + kappa x bytes(MK + KN + MN) / HBM`` —
  the large-GEMM rate measured by MAMF (cluster calibration ``gemm_efficiency``) plus ``kappa`` times the time to
  stream its operands, so small per-GPU GEMMs (high TP, small hidden sizes, fine-grained experts) run at a lower
  fraction of peak (roofline; Williams et al. 2009). FP8 GEMMs use the FP8 rate and 1-byte operands.
  Backward = 2 x forward GEMM work (Narayanan et al. SC21 Sec. 5.1).
* **Attention core**: causal FLOPs (the kernel skips the masked half) at ``attention_efficiency`` x the 16-bit
  peak (fused flash attention; forward, and ``ATTN_BWD_FACTOR`` x that in backward: FlashAttention-2's backward
  runs 5 matmuls to the forward's 2, Dao 2023 Sec. 3.1). Unfused attention (SC21/BLOOM era) runs the two batched
  GEMMs at the GEMM rate and streams the ``s x s`` scores ``UNFUSED_SCORE_PASSES`` times through HBM.
* **Memory-bound work** (norms, residual adds, activation functions, rotary, dropout, MoE permutation): HBM
  traffic ``ELEMENTWISE_PASSES`` x 2 bytes x hidden state (divided by TP only under sequence parallelism, else
  replicated on every TP rank), plus the MLP activation over the TP-sharded FFN width, at the HBM bandwidth
  (x ``hbm_efficiency``); backward = 2 x forward. Output layer: the logits GEMM and the fused cross-entropy's
  passes over the ``V/tp`` logits.
* **Recompute**: full recompute re-runs the forward (compute and its TP / EP collectives) of each recomputed
  layer before its backward: every layer, or with ``recompute_num_layers`` N the first N layers of each model
  chunk (Megatron ``--recompute-method block``; ``flops.recomputed_layers``, the same layers HFU counts);
  selective recompute re-runs the attention core (Korthikanti et al. 2022 Sec. 5).
* **Tensor parallel**: 2 all-reduces (or all-gather + reduce-scatter pairs under SP, same bytes) of the hidden
  state per layer in forward and 2 in backward (formulas.md Sec. 6), on the rank placement of
  ``layout.group_placement``; with TP communication overlap (``tp_comm_overlap``) only ``TP_OVERLAP_EXPOSED`` of
  it is exposed.
* **Context parallel**: ring attention passes K/V ``cp-1`` times forward and K/V + their gradients backward,
  overlapped with the attention of each ring step; only the excess is exposed. Each flash-attention call sees only
  one ring step's keys (``s / cp``), so it runs at the lower efficiency of that key length (``ATTN_HALF_SEQ``):
  at equal tokens per GPU, CP costs a few percent at 4k tokens and next to nothing at 64k+.
* **Expert parallel**: dispatch (FP8 when the GEMMs are FP8) + combine all-to-all per MoE layer forward and
  backward; a token routed to several experts of one NVLink domain crosses the network once. With EP overlap
  (``ep_overlap``) ``EP_OVERLAP_EXPOSED`` of it is exposed. MoE layers also pay routing bookkeeping per token copy
  and host time per local expert (dropless routing syncs with the host), unless the step is CUDA-graphed.
* **Pipeline**: the schedule is simulated op by op with these per-stage times (``pipeline.simulate``: GPipe, 1F1B,
  interleaved, ZB-H1), P2P activation sends on the critical path; the bubble is the idle time of the busiest rank.
* **Data parallel**: gradient reduce-scatter (fp32 gradient buffers, Megatron's default for bf16) + parameter
  all-gather (distributed optimizer / ZeRO-1) or all-reduce (ZeRO-0); overlapped with the last micro-batch's
  backward / first forward when the framework overlaps them (``overlap_dp``), otherwise exposed. ZeRO-3/FSDP
  all-gathers the 16-bit parameters layer by layer in forward and again in backward of *every* micro-batch
  (resharded after forward; Rajbhandari et al. SC20 Sec. 7: 1.5x the data-parallel volume at one micro-batch),
  and reduce-scatters the gradients in every micro-batch's backward (DeepSpeed, torchtitan FSDP2 and
  Megatron-FSDP alike: each rank keeps only its gradient shard; ``FSDP_REDUCE_EVERY_MICROBATCH``). Prefetch
  hides layer i+1's gather under layer i's compute (``fsdp_exposed_s``): the first gather and the last
  reduce-scatter of each pass are exposed, and so is whatever a layer's communication takes beyond its compute.
  DeepSpeed ZeRO-2 and Megatron-FSDP ``optim_grads`` (plan3d's Megatron ZeRO-2) reduce-scatter in every
  micro-batch's backward too (overlapped the same way) and all-gather the updated weights after the optimizer step. HSDP (``hsdp_shard_size``) keeps the gathers in the
  shard group and all-reduces the reduced shard across replicas; ``grad_reduce_in_bf16`` halves gradient bytes.
* **Optimizer step**: memory-bound Adam, ``ADAM_HBM_BYTES_PER_PARAM`` per local parameter at the HBM bandwidth.

MFU = model FLOPs per step / (step seconds x GPUs x dense peak of the 16-bit dtype); HFU adds recompute
(PaLM App. B). The peak used is named in ``StepEstimate.peak_flops_per_gpu``.

Calibration. Measured, per GPU (cluster YAML): ``gemm_efficiency`` (MAMF large-GEMM rate), NCCL bus
efficiencies, HBM bandwidth. Fitted on the dev rows of ``planner/data/published_runs_dev.yaml`` by
``benchmarks/fit_step_time.py`` (coordinate descent on mean group MAPE + half the overall MAPE; 87 rows, 9 source
groups, A100/H100/H200/B200/GB200), each a physical quantity shared by all rows it applies to:

=============================  =======  ===========================================================================
parameter                      value    mainly constrained by
=============================  =======  ===========================================================================
``KAPPA``                      2.0      small models / high TP (SC21 1.7-18B, H100 weak scaling 1.7-16B)
``ELEMENTWISE_PASSES``         12 / 24  Megatron+NeMo / DeepSpeed (BLOOM); torchtitan eager 64, compiled 4
``attention_efficiency``       0.30     H100/H200 (cluster YAML; NeMo long-sequence CP rows, 4k-1M tokens)
                               0.38     B200/GB200 (NeMo long-sequence B200 rows, Megatron-Bridge Llama 3 8B)
``ATTN_HALF_SEQ``              512      short vs long sequences on the same GPU
``UNFUSED_SCORE_PASSES``       8        SC21 (A100, 2021, unfused softmax + attention dropout)
``TP_OVERLAP_EXPOSED``         0 / .15  NeMo recipes, Megatron --tp-comm-overlap / torchtitan async TP
``EP_OVERLAP_EXPOSED``         0.6      MoE rows with EP overlap (Megatron MoE recipes, Bridge 26.08 DeepSeek-V3)
``MOE_EXPERT_HOST_S``          0 / 0.4  BF16 / MXFP8 / per-tensor FP8 (ms per local expert per layer per
                               / 1.2    micro-batch): Qwen3-30B-A3B H100 BF16 recipe; Bridge B200/GB200 Qwen3 and
                                        DeepSeek-V3 MXFP8; Bridge H100 Qwen3 FP8-CS + DeepSeek-V3 FP8
``MOE_TOKEN_COPY_S``           20 ns    MoE rows (Qwen3, DeepSeek-V3)
``FRAMEWORK_COMPUTE_EFF.``     0.82     torchtitan rows (incl. two H200 rows without a power cap); 0.8 before the
                                        FSDP overlap slowdown below was modelled
``OVERLAP_COMPUTE_SLOWDOWN``   0.189    not fitted: Lee et al. 2025 (arXiv 2507.03114) average measured slowdown of
                                        compute under overlapped NCCL collectives (A100/H100)
power_limit_clock_fraction     0.825    torchtitan rows on Grand Teton H100s at 500 W (cluster YAML grand-teton-h100;
                                        physical range 0.67-0.87; cross-check: H200/H100 ratio 0.78)
=============================  =======  ===========================================================================

Measured, not fitted any more: NCCL over Jean Zay's Omni-Path reaches 0.40 of a 100 Gb/s port (cluster YAML
jean-zay-a100, BigScience's all-reduce benchmark on that partition), the value the BLOOM rows had been fitted to.

Not fitted but read from the rows' recipes (each row's ``setup`` block, ``planner/row_options.py``): DeepSeek-V3
node-limited routing (HF config ``n_group`` 8 / ``topk_group`` 4) in the EP all-to-all (``ep_domain_copies``), Megatron
pipeline layouts (``ParallelConfig.pipeline_layout``) and the Megatron-Bridge DeepSeek-V3 presets (EP overlap,
full-iteration CUDA graph).

ZeRO-3 with pipeline parallelism in torchtitan: PyTorch's pipeline stage keeps the parameters unsharded across
micro-batches and reduces once (``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``), but the
published torchtitan 405B PP rows (1F1B / interleaved, torchtitan's default 8 / 16 micro-batches) come out +0.4% /
+19.7% with that schedule (torchtitan group 7.25%) and -3.3% / +6.2% with per-micro-batch gathers (6.90%), so the
per-micro-batch schedule is kept there (a calibration choice, open until a trace settles it).

Result on the dev rows (``plan3d validate``): MAPE 6.77% overall over 91 evaluated rows (13 skipped: no layout, no
GB300 spec, DeepSeek-V4 dims unpublished); every source group with >= 3 rows <= 10% (Megatron-Bridge 9.1%,
torchtitan 7.0%, Megatron Llama examples 7.9%, NeMo 24.07 7.6%, Megatron MoE recipes 5.4%, BLOOM 6.7%). The
constants above were fitted with the earlier hierarchical (NVLink + network in series) collective model and fp32
DeepSpeed gradient all-reduces; ``cost_models.comm`` now pipelines them as NCCL does and DeepSpeed reduces in bf16.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .comm import collective_time
from .config import BYTES_16BIT, BYTES_FP32, FlopsConvention, ParallelConfig, TrainingJob
from .flops import (attention_core_flops_per_token, layer_gemm_shapes, recomputed_layers,
                    step_hardware_flops, step_model_flops)
from .layout import (GroupPlacement, LayoutError, group_placement, parse_pipeline_layout, rank_stages,
                     stage_layer_ranges, virtual_stage)
from .memory import stage_params
from .pipeline import PAIRING_SCHEDULES, chunks_per_rank, simulate

#: HBM bytes moved per local parameter by one fused Adam step (4+4+4+4 read, 4+4+4 write, 2 write = 30, plus
#: the fp32 gradient zeroing 4): derived from the mixed-precision Adam state layout (ZeRO paper Sec. 3.1).
ADAM_HBM_BYTES_PER_PARAM = 34

#: GEMM operand-streaming weight (dimensionless): a GEMM costs its MAMF-rate compute time plus ``KAPPA`` times
#: the time to read A and B and write C once from HBM (a GEMM at the roofline ridge point runs at 1/3 of its MAMF
#: rate). Fitted on the dev rows (plan3d validate): it sets how much slower small per-GPU GEMMs (Qwen3-30B-A3B's
#: 768-wide experts, h=2048 at TP 8) run than large ones.
KAPPA = 2.0

#: HBM passes over the 16-bit hidden state per layer forward (norms: read+write x2, residual adds: 2 reads +
#: 1 write x2, bias/dropout/rotary, MoE-free), by framework: Megatron-LM/NeMo with Transformer Engine's fused
#: kernels; DeepSpeed (Megatron-DeepSpeed, BLOOM era); torchtitan eager PyTorch (RMSNorm and rotary as several
#: kernels each), and with torch.compile fusing elementwise chains. Fitted on the dev rows; the op count above gives
#: ~10-14 for fused kernels and several times that for eager ones.
ELEMENTWISE_PASSES = {"megatron": 12.0, "nemo": 12.0, "deepspeed": 24.0, "torchtitan": 64.0,
                      "torchtitan_compile": 4.0}

#: Backward / forward time of the fused attention kernel (FlashAttention-2: 5 backward matmuls vs 2 forward,
#: Dao 2023 Sec. 3.1, i.e. 2.5x the FLOPs at a similar rate).
ATTN_BWD_FACTOR = 2.5
#: Key length (tokens) at which the fused attention kernel reaches half its asymptotic efficiency. Fitted on the
#: dev rows (the NeMo long-sequence rows run 16k to 1M tokens).
ATTN_HALF_SEQ = 512.0
#: Achieved fraction of the cluster's calibrated GEMM and attention rates by framework (kernel choice, eager
#: PyTorch dispatch, FSDP2 hooks): torchtitan's matmuls go through torch.compile/cuBLAS without Transformer
#: Engine's fused kernels. Fitted on the torchtitan dev rows (including the two H200 rows, which have no power cap):
#: 0.8 when FSDP traffic was free; 0.82 (torchtitan group 7.15%) once the compute under the FSDP collectives is
#: slowed by ``OVERLAP_COMPUTE_SLOWDOWN`` (0.80: 7.41%, 0.84: 7.41%).
FRAMEWORK_COMPUTE_EFFICIENCY = {"torchtitan": 0.82, "torchtitan_compile": 0.82}
#: Fallback attention efficiency (fraction of the 16-bit dense peak) when the cluster has none calibrated
#: (A100, MI300X): FlashAttention-2 reaches 50-73% of A100 peak forward and somewhat less backward (Dao 2023,
#: Sec. 4.1); 0.5 is the low end.
DEFAULT_ATTENTION_EFFICIENCY = 0.5
#: HBM passes of the s x s score tensor per unfused attention forward (QK^T write, scale/mask/softmax read + write,
#: dropout mask write + apply, score x V read), ~4-8 depending on dropout (Korthikanti et al. 2022 Sec. 4.1 counts
#: 5·a·s² bytes of stored scores per layer with dropout). Fitted (8) on the SC21 rows, which ran attention dropout.
UNFUSED_SCORE_PASSES = 8.0
#: Share of TP communication left exposed when TP communication overlap is on (Megatron ``--tp-comm-overlap``,
#: torchtitan async TP): Transformer Engine's userbuffers pipeline the collectives with the GEMM chunks; the fit
#: finds them fully hidden in NeMo/Megatron and 15% exposed with torchtitan's async TP.
TP_OVERLAP_EXPOSED = {"megatron": 0.0, "nemo": 0.0, "torchtitan": 0.15}
#: Passes over the top_k token copies in MoE permute/unpermute (write + read at dispatch and at combine).
MOE_PERMUTE_PASSES = 4.0
#: HBM bytes per element of one FP8 cast (read 16-bit, write 8-bit).
FP8_CAST_BYTES = 3.0
#: Share of EP all-to-all left exposed when the framework overlaps it with another micro-batch's compute
#: (Megatron-LM ``--overlap-moe-expert-parallel-comm`` / Megatron-Bridge ``moe_a2a_overlap``, DeepSeek-V3
#: Sec. 3.2.1 "DualPipe"-style overlap). Fitted (benchmarks/fit_step_time.py) on the rows that run it: Megatron MoE
#: recipes marked "EP overlap" (DeepSeek-V3 B200, Qwen3-235B B200/GB200) and Megatron-Bridge 26.08 DeepSeek-V3 GB200.
#: The fit is flat from 0.4 to 0.6 (overall MAPE 6.50 / 6.47 / 6.49%); 0.6 is kept.
EP_OVERLAP_EXPOSED = 0.6
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
#: Bytes per element of the fp32 cross-entropy logits, and passes over them (softmax read/write, grad write).
CE_PASSES = 3 * BYTES_FP32

#: Fractional slowdown of compute kernels while a collective runs next to them (NCCL's channels occupy SMs and
#: HBM bandwidth; a GEMM sized to one wave of SMs spills into a second wave): Lee et al. 2025, "Characterizing
#: Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114), abstract: average
#: 18.9% (max 40%) compute slowdown under overlap on A100/H100, GPT and Llama layers. Applied to the compute that
#: hides ZeRO-3 / FSDP traffic (``fsdp_exposed_s``), where the overlap spans the whole pass; the TP and EP overlap
#: factors (``TP_OVERLAP_EXPOSED``, ``EP_OVERLAP_EXPOSED``) are fitted and already include theirs.
OVERLAP_COMPUTE_SLOWDOWN = 0.189

#: ZeRO-3 / FSDP reduce-scatters the gradients in every micro-batch's backward, not only in the last one of the
#: step, in all three frameworks, since each rank keeps only its gradient shard. DeepSpeed ZeRO-2/3: "gradient
#: reduction is required after every backward because of gradient partitioning" (tjruwase, deepspeedai/DeepSpeed
#: issue 2252; ``engine.py``: "ZeRO stage >= 2 communicates during non gradient accumulation boundaries as well").
#: torchtitan FSDP2: no ``set_requires_gradient_sync(False)`` during gradient accumulation (pytorch/torchtitan PR 1710
#: declined for that reason; pytorch/pytorch PR 126166: FSDP2 reduce-scatters per micro-batch "without any
#: intervention"). Megatron-FSDP: ``MegatronFSDP.no_sync`` (``megatron/core/distributed/fsdp/src/megatron_fsdp/
#: megatron_fsdp.py``): "For grads shard mode there will actually always be gradient sync happening"
#: (``optim_grads`` and ``optim_grads_params``).
FSDP_REDUCE_EVERY_MICROBATCH = frozenset({"megatron", "nemo", "deepspeed", "torchtitan"})


def fsdp_exposed_s(gather_s: float, reduce_s: float, compute_s: float, units: int) -> float:
    """Exposed seconds of layer-wise (FSDP / ZeRO-3) communication of one forward or backward pass of one
    micro-batch: ``gather_s`` (parameter all-gathers) and ``reduce_s`` (gradient reduce-scatters) over the whole
    pass, split evenly over ``units`` layers that take ``compute_s`` in all.

    Prefetch overlaps layer i+1's gather with layer i's compute, and layer i's reduce-scatter with layer i-1's
    compute (PyTorch FSDP ``backward_prefetch`` / FSDP2 implicit prefetch, Zhao et al. VLDB 2023 Sec. 3.3-3.4;
    DeepSpeed ``stage3_prefetch_bucket_size``; Megatron-FSDP ``--overlap-param-gather`` / ``--overlap-grad-reduce``).
    Gathers and reduce-scatters share the GPU's NIC, so the pass is a three-stage pipeline (gather, compute,
    reduce) over ``units`` items: the first gather and the last reduce-scatter are always exposed, and every
    other layer exposes whatever its communication takes beyond its compute,
    ``g + r + (units - 1) * max(0, g + r - c)`` with per-layer ``g, r, c``. So a pass never takes less than its
    communication (exposed >= gather + reduce - compute) nor less than its compute. The compute that runs under
    the collectives is stretched by ``OVERLAP_COMPUTE_SLOWDOWN`` (counted as exposed time).
    """
    if gather_s <= 0 and reduce_s <= 0:
        return 0.0
    n = max(1, units)
    g, r, c = gather_s / n, reduce_s / n, compute_s / n
    # the compute that runs under a collective is slowed by the SMs and HBM bandwidth the NCCL kernels take
    # (``OVERLAP_COMPUTE_SLOWDOWN``): the overlapped span min(g + r, c) of every layer but the edges is stretched
    hidden = (n - 1) * min(g + r, c)
    return g + r + (n - 1) * max(0.0, g + r - c) + OVERLAP_COMPUTE_SLOWDOWN * hidden


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


def _expert_host_s(job: TrainingJob, fp8_recipe: str) -> float:
    """``MOE_EXPERT_HOST_S`` of the job's expert GEMM format (16-bit: ``bf16``; FP8: ``fp8_recipe``)."""
    if job.precision == "fp8" and fp8_recipe not in MOE_EXPERT_HOST_S:
        raise ValueError(f"fp8_recipe {fp8_recipe!r}: allowed mx, cs")
    key = "bf16" if job.precision != "fp8" else fp8_recipe
    return MOE_EXPERT_HOST_S[key]


@lru_cache(maxsize=256)
def ep_domain_copies(num_experts: int, top_k: int, domains: int, n_group: int | None = None,
                     topk_group: int | None = None) -> float:
    """Expected NVLink domains one token's ``top_k`` routed copies reach when the EP group's experts are laid out
    contiguously over ``domains`` domains (``E/domains`` experts each); with one domain, the ``top_k`` copies.

    A token crosses the network once per distinct domain (DeepEP / HybridEP dedup at the node level, DeepSeek-V3
    Sec. 3.2.2). Unrestricted routing, experts drawn independently: ``D(1 - (1 - 1/D)^k)``. Node-limited routing
    (DeepSeek-V3 Sec. 2.1.2; HF ``n_group`` / ``topk_group``): the token first picks ``topk_group`` of the
    ``n_group`` contiguous expert groups, then its ``k`` experts inside them; averaged over the equally likely
    group choices, a domain is missed with probability ``(1 - |domain and chosen| / |chosen|)^k``. DeepSeek-V3 on
    8 domains with 8 groups, 4 chosen: 3.60 domains per token instead of 5.25.
    """
    if domains <= 1:
        return float(top_k)
    if not n_group or not topk_group or topk_group >= n_group or num_experts % n_group or num_experts % domains:
        return domains * (1 - (1 - 1 / domains) ** top_k)
    per_g, per_d = num_experts // n_group, num_experts // domains
    total, count = 0.0, 0
    for chosen in combinations(range(n_group), topk_group):
        experts = [e for g in chosen for e in range(g * per_g, (g + 1) * per_g)]
        n = len(experts)
        in_dom = [0] * domains
        for e in experts:
            in_dom[e // per_d] += 1
        total += sum(1 - (1 - c / n) ** top_k for c in in_dom)
        count += 1
    return total / count


def _half(cluster: ClusterSpec) -> str:
    return "bf16" if "bf16" in cluster.gpu.peak_flops else "fp16"


def _gemm_rate(cluster: ClusterSpec, precision: str) -> float:
    """Large-GEMM FLOP/s: dense peak x MAMF efficiency x the sustained clock under the board power limit
    (``ClusterSpec.clock_fraction``, 1 without a power cap)."""
    cal = cluster.calibration.gemm_efficiency
    half = _half(cluster)
    if precision == "fp8" and "fp8" in cluster.gpu.peak_flops:
        return cluster.gpu.peak_flops["fp8"] * cal.get("fp8", cal.get(half, 0.7)) * cluster.clock_fraction
    p = precision if precision in cluster.gpu.peak_flops else half
    return cluster.gpu.peak_flops[p] * cal.get(p, cal.get(half, 0.7)) * cluster.clock_fraction


def _hbm(cluster: ClusterSpec) -> float:
    return cluster.gpu.hbm_bandwidth_bytes_per_s * (cluster.calibration.hbm_efficiency or 1.0)


def _attn_eff(cluster: ClusterSpec) -> float:
    """Fused-attention fraction of the 16-bit peak, times the sustained clock under the board power limit."""
    ae = cluster.calibration.attention_efficiency or {}
    return ae.get(_half(cluster), DEFAULT_ATTENTION_EFFICIENCY) * cluster.clock_fraction


def gemm_time(m: float, k: float, n: float, rate: float, hbm: float, bytes_per_el: float) -> float:
    """Seconds of one ``m x k`` by ``k x n`` GEMM: compute at ``rate`` plus ``KAPPA`` x operand streaming."""
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    return 2.0 * m * k * n / rate + KAPPA * bytes_per_el * (m * k + k * n + m * n) / hbm


@dataclass
class _LayerCost:
    gemm: float = 0.0
    gemm_mlp: float = 0.0  # the MLP / MoE block's GEMMs (router, experts, shared experts) within ``gemm``
    gemm_up: float = 0.0  # MLA up-projections (q_b, kv_b) within ``gemm``
    mem_mlp: float = 0.0  # the MLP activation's memory-bound share within ``mem``
    attn_f: float = 0.0
    attn_b: float = 0.0
    mem: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0


def _selective_recompute_s(x: "_LayerCost", par: ParallelConfig) -> float:
    """Forward seconds that selective recompute re-runs in backward, by Megatron ``--recompute-modules``
    (``TransformerConfig.recompute_modules``; default ``core_attn``, Korthikanti et al. 2022 Sec. 5):
    ``core_attn`` the attention core, ``mlp``/``moe`` the MLP or MoE block's GEMMs and activation,
    ``mla_up_proj`` MLA's up-projections, ``moe_act`` the expert activation; ``layernorm`` and ``shared_experts``
    are small and counted as the MLP's memory-bound share."""
    mods = set(getattr(par, "recompute_modules", None) or ("core_attn",))
    t = 0.0
    if "core_attn" in mods:
        t += x.attn_f
    if mods & {"mlp", "moe"}:
        t += x.gemm_mlp + x.mem_mlp
    elif mods & {"moe_act", "layernorm", "shared_experts"}:
        t += x.mem_mlp
    if "mla_up_proj" in mods:
        t += x.gemm_up
    return t


def _layer_cost(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                framework: str, groups: dict[str, GroupPlacement]) -> _LayerCost:
    """Forward costs of one decoder layer for one micro-batch on one GPU (seconds)."""
    fe = FRAMEWORK_COMPUTE_EFFICIENCY.get(framework, 1.0)
    rate = _gemm_rate(cluster, job.precision) * fe
    half_peak = cluster.gpu.peak_flops[_half(cluster)] * fe
    hbm = _hbm(cluster)
    el = 1.0 if job.precision == "fp8" else float(BYTES_16BIT)
    b, s, h = par.micro_batch_size, job.seq_length, model.hidden_size
    tok = b * s / par.cp  # tokens through this rank's layer (sequence split by CP)
    c = _LayerCost()
    etp = par.expert_tp
    shapes = layer_gemm_shapes(model, layer)
    if model.mla is not None:
        n_attn = (1 if model.mla.q_lora_rank is None else 2) + 3
        up_idx = {n_attn - 2} | ({1} if model.mla.q_lora_rank is not None else set())
    else:
        n_attn, up_idx = 2, set()
    for idx, (k, n, share, shard, count) in enumerate(shapes):
        if shard == "tp":
            kk, nn, m, cnt = k, n / par.tp, tok, count
        elif shard == "etp":
            # E/ep local experts, each receiving top_k/E of the tokens of all ep ranks (balanced routing)
            kk, nn, m, cnt = k, n / etp, tok * share * par.ep * etp / par.tp, count / par.ep
        else:
            kk, nn, m, cnt = k, n, tok, count
        g = cnt * gemm_time(m, kk, nn, rate, hbm, el)
        c.gemm += g
        if idx >= n_attn:
            c.gemm_mlp += g
        elif idx in up_idx:
            c.gemm_up += g
    # attention core
    heads_frac = 1.0 / par.tp
    if job.flash_attention:
        fl = attention_core_flops_per_token(model, s, causal_halved=True) * tok * heads_frac
        # the kernel's rate rises with the key length it streams per query block (fixed per-block setup, tail tiles
        # of the causal triangle): eff(s) = eff_inf * s / (s + ATTN_HALF_SEQ). Under context parallelism each kernel
        # call sees only one ring step's keys, s / cp (the sequence is split into 2 cp chunks for causal load balance
        # and each rank holds two of them: Megatron-LM ``docs/source/api-guide/context_parallel.rst``; Transformer
        # Engine ``AttnFuncWithCPAndKVP2P`` runs one flash-attention call per ring step and chunk half)
        s_key = s / par.cp
        eff = _attn_eff(cluster) * s_key / (s_key + ATTN_HALF_SEQ)
        c.attn_f = fl / (half_peak * eff)
        c.attn_b = ATTN_BWD_FACTOR * c.attn_f
    else:
        fl = attention_core_flops_per_token(model, s, causal_halved=False) * tok * heads_frac
        scores = BYTES_16BIT * b * model.num_attention_heads * heads_frac * s * s / par.cp
        c.attn_f = fl / (fe * _gemm_rate(cluster, _half(cluster))) + UNFUSED_SCORE_PASSES * scores / hbm
        c.attn_b = 2.0 * c.attn_f
    # memory-bound elementwise work
    passes = ELEMENTWISE_PASSES.get(framework, ELEMENTWISE_PASSES["megatron"])
    hid = tok * h / (par.tp if par.sequence_parallel else 1)
    extra = 0.0
    if model.moe is not None and model.is_moe_layer(layer):
        ffn_act = model.moe.top_k * model.moe.expert_ffn_hidden_size / par.tp
        ffn_act += model.moe.shared_expert_ffn_hidden_size / par.tp
        # permute + unpermute: top_k copies of each hidden state written and read, each way
        extra += MOE_PERMUTE_PASSES * model.moe.top_k * tok * h / par.tp
    else:
        ffn_act = model.ffn_hidden_size / par.tp
    act = (3 if model.gated_mlp else 2) * tok * ffn_act
    c.mem = BYTES_16BIT * (passes * hid + act + extra) / hbm
    c.mem_mlp = BYTES_16BIT * (act + extra) / hbm
    if job.precision == "fp8":
        # FP8 quantisation of each GEMM's activation input (read 16-bit, write 8-bit) and of its weight
        # (Transformer Engine casts per micro-batch): 3 bytes per element, backward casts the output gradient too
        cast = 0.0
        for k, n, share, shard, count in layer_gemm_shapes(model, layer):
            if shard == "none":
                continue
            div = par.tp if shard == "tp" else par.ep * par.expert_tp
            cast += FP8_CAST_BYTES * (tok * share * count * k / (1 if shard == "tp" else par.tp) + count * k * n / div)
        c.mem += cast / hbm
    # tensor parallel: 2 collectives forward (AR, or AG + RS under SP: same bytes)
    act_bytes = BYTES_16BIT * tok * h
    if par.tp > 1:
        c.tp = 2 * collective_time("all_reduce", act_bytes, groups["tp"], cluster)
    if par.cp > 1:
        kv_w = (model.num_kv_heads * model.head_dim if model.mla is None
                else model.num_attention_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim))
        kv_bytes = 2 * BYTES_16BIT * tok * kv_w / min(par.tp, max(1, model.num_kv_heads))
        step = collective_time("p2p", kv_bytes, groups["cp"], cluster)
        # forward: cp-1 ring steps, each hidden behind one block of attention compute
        c.cp = max(0.0, (par.cp - 1) * step - c.attn_f * (par.cp - 1) / par.cp)
    if par.ep > 1 and model.moe is not None and model.is_moe_layer(layer):
        # dispatch (FP8 when the GEMMs are FP8: DeepEP / HybridEP) + combine (16-bit); a token routed to several
        # experts of one NVLink domain crosses the network once (DeepEP's node-level dedup): with D domains in the
        # group the expected distinct domains per token are D(1 - (1 - 1/D)^k)
        g = groups["ep"]
        copies = ep_domain_copies(model.moe.num_experts, model.moe.top_k, g.num_domains,
                                  model.moe.n_group, model.moe.topk_group)
        disp = (1.0 if job.precision == "fp8" else BYTES_16BIT) + BYTES_16BIT
        c.ep = collective_time("all_to_all", disp * tok * copies * h / par.tp, g, cluster)
    return c


def estimate_step(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                  convention: FlopsConvention = "megatron", framework: str | None = None,
                  tp_comm_overlap: bool | None = None, overlap_dp: bool | None = None,
                  ep_overlap: bool = False, full_cuda_graph: bool = False,
                  fp8_recipe: str | None = None, stages: frozenset[int] | None = None) -> StepEstimate:
    """Step time of ``par`` on ``cluster`` (see module docstring). Raises ``LayoutError`` on an impossible split.

    ``framework`` selects the kernel set (``ELEMENTWISE_PASSES``: megatron, nemo, deepspeed, torchtitan,
    torchtitan_compile) and the ZeRO-2/3 communication schedule; None = ``job.framework``. ``tp_comm_overlap`` / ``overlap_dp``: None = the framework default (Megatron-LM: off /
    off, NeMo and torchtitan: on / on; DeepSpeed: off / on without pipeline parallelism, off with it: its
    ``PipelineEngine`` reduces gradients after the whole schedule, ``runtime/pipe/schedule.py`` ``ReduceGrads``).
    ``ep_overlap``: EP all-to-all overlapped with another micro-batch's compute. ``full_cuda_graph``: the whole
    step is captured in CUDA graphs (Megatron ``--cuda-graph-scope full``), removing the MoE per-layer host
    per-expert host time (``MOE_EXPERT_HOST_S``). ``fp8_recipe``: scaling of FP8 expert GEMMs, ``mx`` (MXFP8 /
    blockwise) or ``cs`` (per-tensor current or delayed scaling), selecting ``MOE_EXPERT_HOST_S``; None = ``mx``
    on GPUs with block-scaled FP4/FP8 tensor cores (Blackwell: an ``fp4`` peak in the cluster spec), else ``cs``
    (Transformer Engine's default per-tensor recipe on Hopper).
    ``par.pipeline_layout`` (Megatron ``--pipeline-model-parallel-layout``) places the layers per model chunk instead
    of the even / first-last split; the embedding sits on the first chunk, the output layer and MTP on the last.
    ``stages``: the pipeline ranks whose per-rank terms are reported (busiest rank, exposed TP/CP/EP, data-parallel
    reduction of the largest stage, optimizer step); None = all. A pipeline whose stages sit on pools of different
    GPUs and networks (``cost_models.pools``) times each pool's ranks on that pool's cluster.
    """
    framework = framework or getattr(job, "framework", None) or "megatron"
    fw_base = framework.split("_")[0]
    if fp8_recipe is None:
        fp8_recipe = "mx" if "fp4" in cluster.gpu.peak_flops else "cs"
    if tp_comm_overlap is None:
        tp_comm_overlap = fw_base in ("nemo",)
    if overlap_dp is None:
        overlap_dp = fw_base in ("nemo", "torchtitan") or (fw_base == "deepspeed" and par.pp == 1)
    b, s, h = par.micro_batch_size, job.seq_length, model.hidden_size
    m = max(1, par.num_microbatches(job.global_batch_size))
    dom = cluster.node.nvlink_domain_size
    groups = {d: group_placement(d, par, dom) for d in ("tp", "cp", "ep", "dp", "pp")}
    vocab = model.padded_vocab_size(par.tp)
    hbm = _hbm(cluster)
    rate = _gemm_rate(cluster, job.precision) * FRAMEWORK_COMPUTE_EFFICIENCY.get(framework, 1.0)
    el = 1.0 if job.precision == "fp8" else float(BYTES_16BIT)
    tok = b * s / par.cp

    cache: dict[tuple, _LayerCost] = {}

    def lc(i: int) -> _LayerCost:
        key = (model.moe is not None and model.is_moe_layer(i),)
        if key not in cache:
            cache[key] = _layer_cost(model, cluster, job, par, i, framework, groups)
        return cache[key]

    tp_exp = 1.0 if not tp_comm_overlap else TP_OVERLAP_EXPOSED.get(fw_base, TP_OVERLAP_EXPOSED["megatron"])
    ep_exp = EP_OVERLAP_EXPOSED if ep_overlap else 1.0
    v = chunks_per_rank(par.pipeline_schedule, par.vpp)
    # schedules that pair a forward with another micro-batch's backward hide the EP all-to-all of each behind the
    # other's compute, leaving EP_OVERLAP_EXPOSED of it (``pipeline_ops.fb_seconds``); not twice with ``ep_overlap``
    ep_hide = 0.0 if ep_overlap or par.pipeline_schedule not in PAIRING_SCHEDULES else 1.0 - EP_OVERLAP_EXPOSED
    if par.pipeline_layout is not None:
        # Megatron ``--pipeline-model-parallel-layout``: model chunk k runs on rank k % pp as virtual stage k // pp;
        # layers are numbered along the chunks (so the dense prefix of a MoE model sits on the first chunks)
        counts = [c.count("t") for c in parse_pipeline_layout(par.pipeline_layout)]
        if len(counts) % par.pp or sum(counts) != model.num_layers:
            raise LayoutError(f"pipeline_layout {par.pipeline_layout!r}: {len(counts)} chunks holding {sum(counts)} "
                              f"layers for pp {par.pp} and {model.num_layers} layers")
        per_rank = len(counts) // par.pp
        starts = [sum(counts[:k]) for k in range(len(counts))]
        by_rank = [[list(range(starts[c * par.pp + r], starts[c * par.pp + r] + counts[c * par.pp + r]))
                    for c in range(per_rank)] for r in range(par.pp)]
        # with interleaving each chunk is a virtual stage; without, a rank runs its chunks back to back
        if per_rank != v and v > 1:
            raise LayoutError(f"pipeline_layout {par.pipeline_layout!r} has {per_rank} chunks per rank, vpp is {v}")
        chunk_lists = by_rank if per_rank == v else [[[i for ch in chunks for i in ch]] for chunks in by_rank]
        ranges = [[i for ch in chunks for i in ch] for chunks in by_rank]
    else:
        ranges = stage_layer_ranges(model.num_layers, par)
        chunk_lists = None
    # virtual stage k = chunk c of rank r holds layers of chunk c of stage r's range (split evenly by chunks)
    fwd_v = [0.0] * (par.pp * v)
    bwd_v = [0.0] * (par.pp * v)
    wgt_v = [0.0] * (par.pp * v)
    hide_f = [0.0] * (par.pp * v)
    hide_b = [0.0] * (par.pp * v)
    # decoder layers that full recompute re-runs (all, or the first recompute_num_layers of each chunk)
    rc_layers = set(recomputed_layers(model, par))
    kinds = {"gemm": 0.0, "attention": 0.0, "memory_bound": 0.0}
    exposed_mb = {"tp": [0.0] * par.pp, "cp": [0.0] * par.pp, "ep": [0.0] * par.pp}
    for r, layers in enumerate(ranges):
        lay = list(layers)
        chunks = chunk_lists[r] if chunk_lists is not None else [
            lay[c * len(lay) // v:(c + 1) * len(lay) // v] for c in range(v)]
        for c, chunk in enumerate(chunks):
            k = virtual_stage(par, r, c)
            f = bw = 0.0
            for i in chunk:
                x = lc(i)
                comp_f = x.gemm + x.attn_f + x.mem
                comp_b = 2 * x.gemm + x.attn_b + 2 * x.mem
                comm_f = x.tp * tp_exp + x.cp + x.ep * ep_exp
                comm_b = x.tp * tp_exp + 2 * x.cp + x.ep * ep_exp
                if model.moe is not None and model.is_moe_layer(i):
                    # routing bookkeeping per token copy (top-k, sort by expert, index/scatter kernels)
                    extra = MOE_TOKEN_COPY_S * tok * model.moe.top_k / par.tp
                    comp_f += extra / 3
                    comp_b += 2 * extra / 3
                    if not full_cuda_graph:
                        # host time per local expert (dropless routing syncs the token counts to the host, which
                        # then issues the per-expert kernels while the GPU waits)
                        host = _expert_host_s(job, fp8_recipe) * model.moe.num_experts / par.ep
                        comp_f += host / 3
                        comp_b += 2 * host / 3
                rc = 0.0
                full_i = i in rc_layers
                if full_i:
                    rc = comp_f + comm_f
                elif par.recompute == "selective":
                    rc = _selective_recompute_s(x, par)
                f += comp_f + comm_f
                bw += comp_b + comm_b + rc
                wgt_v[k] += x.gemm  # the weight-gradient GEMMs: one of the backward's two per forward GEMM
                hide_f[k] += ep_hide * x.ep
                hide_b[k] += ep_hide * x.ep
                exposed_mb["tp"][r] += 2 * x.tp * tp_exp + (x.tp * tp_exp if full_i else 0)
                exposed_mb["cp"][r] += 3 * x.cp
                exposed_mb["ep"][r] += ep_exp * (2 * x.ep + (x.ep if full_i else 0))
            if k == par.pp * v - 1:
                # output layer: logits GEMM + fused cross-entropy over V/tp fp32 logits; each multi-token-prediction
                # module (DeepSeek-V3 Sec. 2.2: projection 2h -> h, one more decoder layer, its own logits) runs
                # on the last stage too (Megatron-LM ``mtp_num_layers``)
                lg = gemm_time(tok, h, vocab / par.tp, rate, hbm, el)
                ce = CE_PASSES * tok * vocab / par.tp / hbm
                n_heads = 1 + model.num_mtp_layers
                f += n_heads * (lg + ce)
                bw += n_heads * (2 * lg + ce)
                wgt_v[k] += n_heads * lg
                for _ in range(model.num_mtp_layers):
                    x = lc(model.num_layers - 1)
                    proj = gemm_time(tok, 2 * h, h / par.tp, rate, hbm, el)
                    f += x.gemm + x.attn_f + x.mem + proj + x.tp * tp_exp + x.ep * ep_exp
                    bw += 2 * (x.gemm + x.mem + proj) + x.attn_b + x.tp * tp_exp + x.ep * ep_exp
            if k == 0:
                emb = 2 * BYTES_16BIT * tok * h / hbm  # embedding gather + write
                f += emb
                bw += 2 * emb
            fwd_v[k] = f
            bwd_v[k] = bw
    # per-kind compute on the busiest rank (for the breakdown)
    own = (lambda r: True) if stages is None else stages.__contains__
    busiest = max((r for r in range(par.pp) if own(r)),
                  key=lambda r: sum(fwd_v[virtual_stage(par, r, c)] + bwd_v[virtual_stage(par, r, c)]
                                    for c in range(v)))
    for i in ranges[busiest]:
        x = lc(i)
        full = i in rc_layers
        mods = set(getattr(par, "recompute_modules", None) or ("core_attn",)) if par.recompute == "selective" else set()
        rcg = x.gemm if full else (x.gemm_mlp if mods & {"mlp", "moe"} else 0.0) + (
            x.gemm_up if "mla_up_proj" in mods else 0.0)
        rca = x.attn_f if full or "core_attn" in mods else 0.0
        rcm = x.mem if full else (x.mem_mlp if mods & {"mlp", "moe", "moe_act", "layernorm", "shared_experts"} else 0.0)
        kinds["gemm"] += m * (3 * x.gemm + rcg)
        kinds["attention"] += m * (x.attn_f + x.attn_b + rca)
        kinds["memory_bound"] += m * (3 * x.mem + rcm)

    p2p = 0.0
    if par.pp > 1:
        p2p_bytes = BYTES_16BIT * tok * h / (par.tp if par.sequence_parallel else 1)
        p2p = collective_time("p2p", p2p_bytes, groups["pp"], cluster)
    sim = simulate(par.pipeline_schedule, par.pp, m, fwd_v, bwd_v, vpp=v, p2p_s=p2p, wgt_s=wgt_v, hide_f_s=hide_f,
                   hide_b_s=hide_b)
    pipeline_s = sim.makespan
    busy = max(sim.busy)
    bubble = max(0.0, pipeline_s - busy)

    # data-parallel gradient reduction / parameter gather on the most loaded stage
    # parameters each rank holds: its layers (by the layout's chunks when one is given), both stages under DualPipe
    held = [[i for s in rank_stages(par, r) for i in ranges[s]] for r in range(par.pp)]
    sp_max = max((stage_params(model, par, st, lay, vocab) for st, lay in enumerate(held) if own(st)),
                 key=lambda x: x.total)
    cp_g, dp_g = groups["cp"], groups["dp"]
    shard = par.dp * par.cp
    dp_group = GroupPlacement(shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
        if shard > 1 else GroupPlacement(1, 1)
    rs_t = ag_t = rep_ar_t = 0.0
    # bytes per gradient element in the reduction: fp32 main gradients (Megatron's default) or 16-bit with
    # ``--grad-reduce-in-bf16`` (``ParallelConfig.grad_reduce_in_bf16``)
    grad_b = BYTES_16BIT if getattr(par, "grad_reduce_in_bf16", False) else BYTES_FP32
    # bytes per gathered parameter: 16-bit, or 1-byte FP8 weights with ``--fp8-param-gather`` under a per-tensor
    # FP8 recipe (Transformer Engine Float8Tensor; ``cost_models.memory.FP8_PARAM_BYTES``)
    param_b = 1.0 if getattr(par, "fp8_param_gather", False) and job.precision == "fp8" else float(BYTES_16BIT)
    hsdp = getattr(par, "hsdp_shard_size", None)
    hsdp = hsdp if par.zero_stage >= 3 and hsdp and 1 < hsdp < shard and shard % hsdp == 0 else None
    if shard > 1:
        if par.zero_stage == 0:
            rs_t = collective_time("all_reduce", BYTES_FP32 * sp_max.dense, dp_group, cluster)
        elif fw_base == "deepspeed" and par.zero_stage == 1:
            # DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py): all-reduce of the fp32 gradient buffer, each
            # rank updates its partition, then all-gathers the 16-bit weights. The all-reduce runs in the engine's
            # communication_data_type, bf16 / fp16 under bf16 / fp16 training (runtime/engine.py
            # ``communication_data_type``, ``allreduce_bucket`` casts the fp32 buffer; pipe/engine.py
            # ``_bf16_reduce_grads``); BLOOM needed PyTorch 1.11's NCCL "which supports BF16 comms" for it
            # (bigscience tr11-176B-ml README)
            rs_t = collective_time("all_reduce", BYTES_16BIT * sp_max.dense, dp_group, cluster)
            ag_t = collective_time("all_gather", param_b * sp_max.dense, dp_group, cluster)
        elif hsdp:
            # HSDP (ZeRO-3 within ``hsdp_shard_size`` ranks, replicated across): gathers and reduce-scatters stay in
            # the shard group, the reduced shard is then all-reduced across the replicas (PyTorch FSDP2
            # ``fully_shard`` with a 2-D mesh; pytorch/pytorch PR 126166). The shard group is the inner (contiguous)
            # dimension of the dp x cp ranks (torchtitan mesh: dp_replicate outer, dp_shard inner)
            rpd = dp_group.ranks_per_domain
            sg = GroupPlacement(hsdp, min(hsdp, rpd))
            rg = GroupPlacement(shard // hsdp, max(1, rpd // hsdp))
            rs_t = collective_time("reduce_scatter", grad_b * sp_max.dense, sg, cluster)
            rep_ar_t = collective_time("all_reduce", grad_b * sp_max.dense / hsdp, rg, cluster)
            ag_t = collective_time("all_gather", param_b * sp_max.dense, sg, cluster)
        else:
            rs_t = collective_time("reduce_scatter", grad_b * sp_max.dense, dp_group, cluster)
            ag_t = collective_time("all_gather", param_b * sp_max.dense, dp_group, cluster)
    if par.expert_dp > 1 and sp_max.expert > 0:
        edp = GroupPlacement(par.expert_dp, max(1, min(par.expert_dp, dom // max(1, par.expert_tp * par.ep))))
        rs_t += collective_time("reduce_scatter" if par.zero_stage else "all_reduce",
                                BYTES_FP32 * sp_max.expert, edp, cluster)
        if par.zero_stage:
            ag_t += collective_time("all_gather", BYTES_16BIT * sp_max.expert, edp, cluster)
    if model.tie_word_embeddings and par.pp > 1:
        # first and last stage all-reduce the shared embedding's fp32 gradient after the pipeline drains
        # (Megatron-LM ``finalize_model_grads._allreduce_word_embedding_grads``; DeepSpeed ``ReduceTiedGrads``)
        emb_g = GroupPlacement(2, 2 if par.world_size // par.pp * (par.pp - 1) < dom else 1)
        rs_t += collective_time("all_reduce", BYTES_FP32 * vocab * h / par.tp, emb_g, cluster)
    last_bwd = sum(bwd_v[virtual_stage(par, busiest, c)] for c in range(v))
    first_fwd = sum(fwd_v[virtual_stage(par, busiest, c)] for c in range(v))
    n_units = max(1, len(ranges[busiest]))  # FSDP units (one per decoder layer) on the busiest rank
    if par.zero_stage >= 3 and shard > 1:
        # ZeRO-3 / FSDP: every micro-batch all-gathers the 16-bit parameters layer by layer in forward and again in
        # backward (parameters are resharded after forward), and reduce-scatters the gradients layer by layer in
        # backward; each layer's gather is prefetched under the previous layer's compute (``fsdp_exposed_s``)
        # torchtitan with pipeline parallelism does not reshard after forward (``fsdp_reshard_after_forward``
        # "default") and PyTorch's pipeline stage turns off reshard-after-backward and gradient sync for all but the
        # last backward (``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``), which would gather
        # once per step; the published torchtitan 405B PP rows come out +0.4% / +19.7% with that schedule (-3.3% /
        # +6.2% with per-micro-batch gathers), so the per-micro-batch schedule below is kept for them too
        # until a trace settles it (calibration choice, documented in the module docstring)
        # HSDP: torchtitan all-reduces across the replicas only in the last micro-batch
        # (``set_requires_all_reduce(is_last)``, pytorch/torchtitan PR 4505); Megatron-FSDP in every one
        rs_mb = rs_t if fw_base in FSDP_REDUCE_EVERY_MICROBATCH else 0.0
        rs_mb += 0.0 if fw_base == "torchtitan" else rep_ar_t
        fwd_mb = fsdp_exposed_s(ag_t, 0.0, first_fwd, n_units)
        bwd_mb = fsdp_exposed_s(ag_t, rs_mb, last_bwd, n_units)
        bwd_last = fsdp_exposed_s(ag_t, rs_t + rep_ar_t, last_bwd, n_units)
        dp_exposed = m * fwd_mb + (m - 1) * bwd_mb + bwd_last
    elif fw_base == "deepspeed" and par.zero_stage == 2 and shard > 1 and par.pp == 1:
        # DeepSpeed ZeRO-2 reduce-scatters the gradients in every micro-batch's backward (each rank keeps only its
        # partition: DeepSpeed issue 2252, stage_1_and_2.py ``reduce_ready_partitions_and_remove_grads``), in
        # buckets overlapped with the backward (``overlap_comm``); the updated 16-bit parameters are all-gathered
        # once after the optimizer step, before the next forward (``all_gather_dp_groups`` in ``step``)
        dp_exposed = m * fsdp_exposed_s(0.0, rs_t, last_bwd, n_units) + ag_t
    elif fw_base in ("megatron", "nemo") and par.zero_stage == 2 and shard > 1:
        # Megatron-FSDP ``optim_grads`` (sharded gradients) reduce-scatters in every micro-batch's backward
        # (``megatron_fsdp.py``: ``grad_reduce_every_bprop`` for optim_grads / optim_grads_params), layer by layer
        # under the backward; the replicated 16-bit weights are all-gathered once after the optimizer step
        # (under the first forward with ``--overlap-param-gather``)
        dp_exposed = m * fsdp_exposed_s(0.0, rs_t, last_bwd, n_units) + (
            max(0.0, ag_t - first_fwd) if overlap_dp else ag_t)
    elif overlap_dp:
        dp_exposed = max(0.0, rs_t - last_bwd) + max(0.0, ag_t - first_fwd)
    else:
        dp_exposed = rs_t + ag_t

    local_params = sp_max.dense / (shard if par.zero_stage >= 1 else 1) + \
        sp_max.expert / (par.expert_dp if par.zero_stage >= 1 else 1)
    optimizer = ADAM_HBM_BYTES_PER_PARAM * local_params / hbm

    exposed = {"tp": m * exposed_mb["tp"][busiest], "cp": m * exposed_mb["cp"][busiest],
               "ep": max(0.0, m * exposed_mb["ep"][busiest] - (sim.hidden or [0.0] * par.pp)[busiest]),
               "pp": 0.0, "dp": dp_exposed}
    # P2P sends on the warm-up / cool-down critical path (the steady state overlaps them with compute)
    exposed["pp"] = min(bubble, 2 * (par.pp - 1) * v * p2p) if par.pp > 1 else 0.0
    step = pipeline_s + dp_exposed + optimizer
    compute = busy - exposed["tp"] - exposed["cp"] - exposed["ep"]
    # embedding, output layer, cross-entropy, MTP and host-bound time are the rest of the busiest rank's compute
    kinds["other"] = max(0.0, compute - sum(kinds.values()))
    n_gpus = par.world_size
    mf = step_model_flops(model, job, convention)
    # HFU in the same convention: model FLOPs plus what recompute re-executes (PaLM App. B)
    hf = mf + step_hardware_flops(model, job, par) - step_model_flops(model, job, "megatron")
    peak_dtype = "bf16" if "bf16" in cluster.gpu.peak_flops else "fp16"
    peak = cluster.gpu.peak_flops[peak_dtype]
    return StepEstimate(
        step_s=step, compute_s=compute, bubble_s=bubble, optimizer_s=optimizer, exposed_comm_s=exposed,
        bubble_fraction=bubble / step if step > 0 else 0.0, num_microbatches=m,
        tokens_per_s=job.tokens_per_step / step, model_flops=mf, hardware_flops=hf,
        tflops_per_gpu=mf / step / n_gpus / 1e12, mfu=mf / (step * n_gpus * peak),
        hfu=hf / (step * n_gpus * peak), peak_flops_per_gpu=peak, mfu_peak_dtype=peak_dtype,
        flops_convention=convention,
        stage_forward_s=fwd_v, stage_backward_s=bwd_v, stage_wgrad_s=wgt_v, stage_hide_forward_s=hide_f,
        stage_hide_backward_s=hide_b, p2p_s=p2p, pp=par.pp, schedule=par.pipeline_schedule,
        framework=framework, compute_breakdown_s=kinds)
