"""Per-layer communication of model parallelism, on one GPU (seconds per micro-batch): TP, CP, EP and the
pipeline's point-to-point sends. Collective costs come from ``comm.collective_time`` on the rank placement of
``layout.group_placement``.

* **Tensor parallel**: 2 all-reduces (or all-gather + reduce-scatter pairs under SP, same bytes) of the hidden
  state per layer in forward and 2 in backward (formulas.md Sec. 6); a MoE layer's MLP block has the pair its
  framework runs (``mlp_block_tp_collectives``: none in Megatron-Core at expert TP 1 without shared experts); with TP
  communication overlap only ``TP_OVERLAP_EXPOSED`` of it is exposed.
* **Context parallel**: ring attention passes K/V ``cp-1`` times forward and K/V + their gradients backward,
  overlapped with the attention of each ring step; only the excess is exposed.
* **Expert parallel**: dispatch + combine all-to-all per MoE layer forward and backward, 16-bit both ways (FP8
  GEMMs included: Megatron-LM quantizes after the dispatch); a token routed to several experts of one NVLink domain
  crosses the network once. A run's flex backend is charged its measured throughput: inside one domain
  (``flex_in_domain_s``) and, across domains, no faster than its kernels were measured to go there
  (``flex_internode_s``). With EP overlap ``EP_OVERLAP_EXPOSED`` of it is exposed.
* **Pipeline**: one activation send per micro-batch and stage boundary.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from cluster_specs.efficiency import ep_dispatch_bandwidth, ep_internode_bandwidth
from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .comm import collective_time
from .config import ParallelConfig, TrainingJob, compute_bytes
from .layout import GroupPlacement

#: Share of TP communication left exposed when TP communication overlap is on (Megatron ``--tp-comm-overlap``,
#: torchtitan async TP): Transformer Engine's userbuffers pipeline the collectives with the GEMM chunks; the fit finds
#: them fully hidden in NeMo/Megatron and 63% exposed with torchtitan's async TP (since the Megatron-LM Llama example
#: rows state their 16-bit gradient reduction and FP8 parameter gather, 2026-12-04; 65% since the FP8 forward GEMMs run
#: at the fast-accumulation rate and current scaling's amax pass is charged, 2026-12-04; 69% since DeepEP's internode
#: throughput is charged, 2026-12-04; 67% before; 70%, the top, before the MoE routing kernels were measured,
#: 2026-12-04; 58% on the coarser grid before that; 64% before the attention tables carried the causal backward,
#: 2026-12).
TP_OVERLAP_EXPOSED = {"megatron": 0.0, "nemo": 0.0, "torchtitan": 0.634374}
#: Share of EP all-to-all left exposed when the framework overlaps it with another micro-batch's compute (Megatron-LM
#: ``--overlap-moe-expert-parallel-comm`` / Megatron-Bridge ``moe_a2a_overlap``, DeepSeek-V3 Sec. 3.2.1 "DualPipe"-style
#: overlap). Fitted (benchmarks/fit_step_time.py) on the rows that run it: Megatron MoE recipes marked "EP overlap"
#: (DeepSeek-V3 B200, Qwen3-235B B200/GB200), Megatron-Bridge 25.09 DeepSeek-V3 H100 and 26.08 DeepSeek-V3 GB200. The
#: ideal timeline of Megatron-LM's per-layer pairing (``model_chunk_schedule_plan.py`` ``schedule_layer_1f1b`` at
#: d48bd6be: combine_bwd || attn_fwd, dispatch_fwd -> dispatch_bwd || mlp_bwd -> mlp_dw -> mlp_fwd, combine_fwd ||
#: attn_bwd) would leave only the compute slowdown exposed (0.19 of the all-to-all) on four of those five rows and 0.33
#: on DeepSeek-V3 B200; the fit's 0.47 (2026-12-04, with DeepEP's measured internode throughput charged across
#: domains, ``flex_internode_s``; 0.57 with HybridEP's default SM count corrected to DeepEP's 32; 0.58
#: with the MoE routing kernels measured; 0.55 before them, 0.5 on the coarser grid, after the recompute-module and MTP
#: corrections) says the runs hide less than that schedule allows (the dispatcher's host synchronisation on the token
#: counts is one candidate).
EP_OVERLAP_EXPOSED = 0.468751

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them).
FIT_RANGES = {
    "TP_OVERLAP_EXPOSED.megatron": FitRange(0.0, 0.5, "share of TP communication exposed",
                                            "0: fully hidden by Transformer Engine userbuffers (GEMM chunks pipelined "
                                            "with the collective); 0.5: only the first/last chunk's share hidden",
                                            tied=("nemo",)),
    "TP_OVERLAP_EXPOSED.torchtitan": FitRange(0.0, 0.7, "share of TP communication exposed",
                                              "torch async TP (micro-pipelined all-gather / reduce-scatter matmuls): "
                                              "0 fully hidden, 0.7 mostly exposed"),
    "EP_OVERLAP_EXPOSED": FitRange(0.0, 1.0, "share of EP all-to-all exposed",
                                   "0: fully hidden under the other micro-batch's compute; 1: no overlap"),
}


#: Frameworks whose tensor-parallel linears run the backward's TP collectives of each column-parallel linear (QKV,
#: fc1) asynchronously under that linear's own backward GEMMs: the input-gradient all-reduce (reduce-scatter with
#: sequence parallelism) under the weight-gradient GEMM, and with sequence parallelism the re-gather of the saved
#: input shard under the input-gradient GEMM. Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication``
#: (``--async-tensor-model-parallel-allreduce``, on by default from 2021-09, commit 16c90445; ``megatron/core/
#: tensor_parallel/layers.py`` today) and Transformer Engine's ``Linear`` backward ("Overlap dgrad-RS/AR with wgrad"),
#: which NeMo runs. Not Megatron-DeepSpeed's BLOOM-era fork (``copy_to_tensor_model_parallel_region``: a blocking
#: all-reduce) nor PyTorch DTensor TP (torchtitan without async TP).
ASYNC_TP_BACKWARD_FRAMEWORKS = ("megatron", "nemo")
#: The column-parallel linears' backward GEMMs that hide those collectives, over the layer's weight-gradient GEMM time
#: (half its backward GEMMs: ``LayerCost.gemm_backward``; its forward GEMM time where both run at one rate): their
#: weight-gradient GEMMs alone are 7/12 of GPT-3's layer GEMM FLOPs (QKV 3h^2 + fc1 4h^2 of 12h^2) and 8.5/13 of
#: Llama 3 8B's; 0.5 is below both (counted, not fitted).
TP_BACKWARD_OVERLAP_WINDOW = 0.5


def tp_backward_shares(fw_base: str, tp_comm_overlap: bool, sequence_parallel: bool,
                       async_backward: bool | None = None) -> tuple[float, float]:
    """(exposed, overlapped) shares of a layer's forward TP seconds (``tp_layer_s``) that its backward runs.

    With TP communication overlap (``tp_comm_overlap``): ``tp_exposed_share``, as forward. Otherwise, where the
    framework runs the column-parallel linears' collectives asynchronously (``async_backward``; None =
    ``fw_base in ASYNC_TP_BACKWARD_FRAMEWORKS``): without sequence parallelism the backward's two all-reduces (one per
    attention / MLP block, at the column-parallel inputs) are overlapped (0, 1); with it, each block's all-gather of
    the output gradient before the row-parallel linear is on the critical path (half the forward's collectives), its
    reduce-scatter and input re-gather are overlapped (0.5, 1) (Korthikanti et al. 2022 Sec. 4.2.2, Fig. 6: g and
    g-bar). Blocking collectives: (1, 0)."""
    if tp_comm_overlap:
        return tp_exposed_share(fw_base, True), 0.0
    if async_backward is None:
        async_backward = fw_base in ASYNC_TP_BACKWARD_FRAMEWORKS
    if not async_backward:
        return 1.0, 0.0
    return (0.5 if sequence_parallel else 0.0), 1.0


def tp_exposed_share(fw_base: str, tp_comm_overlap: bool) -> float:
    """Share of the TP collectives on the critical path: 1 without overlap, else ``TP_OVERLAP_EXPOSED``."""
    return 1.0 if not tp_comm_overlap else TP_OVERLAP_EXPOSED.get(fw_base, TP_OVERLAP_EXPOSED["megatron"])


def ep_exposed_share(ep_overlap: bool) -> float:
    """Share of the EP all-to-all on the critical path: 1 without overlap, else ``EP_OVERLAP_EXPOSED``."""
    return EP_OVERLAP_EXPOSED if ep_overlap else 1.0


#: Frameworks built on Megatron-Core, whose MoE layer runs its routed experts on the expert-tensor-parallel group:
#: the token dispatchers gather and scatter over ``pg_collection.expt_tp`` (``--expert-tensor-parallel-size``,
#: default the TP size), not over the attention's TP group (``megatron/core/transformer/moe/token_dispatcher.py``,
#: ``MoETokenDispatcher.__init__``: "use pg_collection.expt_tp_group as tensor parallel group in this module";
#: ``MoEAlltoAllTokenDispatcher.token_dispatch`` gathers over it only ``if self.tp_size > 1``; Megatron-LM commit
#: d98e8a64dd). The shared experts are an MLP on the TP group (``SharedExpertMLP``).
MCORE_MOE_FRAMEWORKS = ("megatron", "nemo")
#: NVLink peers of one DeepEP "node" (deepseek-ai/DeepEP ``csrc/kernels/configs.cuh`` at 7febc6e2:
#: ``#define NUM_MAX_NVL_PEERS 8``): the topology DeepEP's and HybridEP's internode figures were measured on.
DEEPEP_NVL_PEERS = 8


def mlp_block_tp_collectives(model: ModelSpec, par: ParallelConfig, layer: int, fw_base: str) -> tuple[int, int]:
    """(through column-/row-parallel linears, blocking) TP collective pairs of decoder layer ``layer``'s MLP block,
    each pair the bytes of one all-reduce of the hidden state (an all-gather + reduce-scatter under sequence
    parallelism).

    A dense MLP: (1, 0). A MoE block under Megatron-Core (``MCORE_MOE_FRAMEWORKS``): the shared experts' MLP, one
    pair through its linears if the model has shared experts, and the token dispatcher's gather / scatter over the
    expert-TP group, one blocking pair if ``par.expert_tp`` > 1; with expert TP 1 and no shared experts (Qwen3 MoE at
    ``--expert-tensor-parallel-size 1``) the block has no TP traffic at all: each TP rank routes its own
    sequence-parallel shard. A MoE block under the other frameworks: one blocking pair (torchtitan's
    ``apply_moe_ep_tp``, ``infra/parallelize.py`` of its MoE models: "all-gather for input, reduce-scatter for
    output" around the whole MoE module, DTensor redistributions outside the linears)."""
    if model.moe is None or not model.is_moe_layer(layer):
        return 1, 0
    if fw_base not in MCORE_MOE_FRAMEWORKS:
        return 0, 1
    return (1 if model.moe.shared_expert_ffn_hidden_size > 0 else 0), (1 if par.expert_tp > 1 else 0)


def tp_layer_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
               groups: dict[str, GroupPlacement], layer: int, fw_base: str) -> tuple[float, float]:
    """(all, blocking) forward seconds of decoder layer ``layer``'s TP collectives: one all-reduce of the 16-bit
    ``b·s/cp x h`` hidden state for the attention block (or its all-gather + reduce-scatter halves under sequence
    parallelism: the same bytes; Korthikanti et al. 2022 Sec. 4.2.2) and the MLP block's
    (``mlp_block_tp_collectives``: one more for a dense MLP). ``blocking``: the share outside the column-/row-parallel
    linears (a MoE token dispatcher's), which no linear's GEMMs can hide. The backward runs the same collectives;
    how much of them is exposed is ``tp_backward_shares``."""
    if par.tp <= 1:
        return 0.0, 0.0
    tok = par.micro_batch_size * job.seq_length / par.cp
    act_bytes = compute_bytes(job.precision) * tok * model.hidden_size
    one = collective_time("all_reduce", act_bytes, groups["tp"], cluster)
    linears, blocking = mlp_block_tp_collectives(model, par, layer, fw_base)
    return (1 + linears + blocking) * one, blocking * one


def cp_layer_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
               groups: dict[str, GroupPlacement], attn_fwd_s: float) -> float:
    """Exposed forward seconds of one layer's ring-attention K/V exchange: ``cp - 1`` P2P steps of the local K/V
    (Megatron-LM ``docs/source/api-guide/context_parallel.rst``), each hidden behind one ring step's share of the
    attention forward ``attn_fwd_s``; the backward sends K/V and their gradients (2x, the caller's factor)."""
    if par.cp <= 1:
        return 0.0
    tok = par.micro_batch_size * job.seq_length / par.cp
    kv_w = (model.num_kv_heads * model.head_dim if model.mla is None
            else model.num_attention_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim))
    kv_bytes = 2 * compute_bytes(job.precision) * tok * kv_w / min(par.tp, max(1, model.num_kv_heads))
    step = collective_time("p2p", kv_bytes, groups["cp"], cluster)
    # forward: cp-1 ring steps, each hidden behind one block of attention compute
    return max(0.0, (par.cp - 1) * step - attn_fwd_s * (par.cp - 1) / par.cp)


def moe_token_dispatcher(job: TrainingJob, ep_group: GroupPlacement | None) -> str:
    """Megatron-LM ``--moe-token-dispatcher-type`` whose traffic ``ep_layer_s`` charges (and the Megatron emitter
    writes): ``flex`` (DeepEP) for dropless routing over an EP group that spans NVLink domains, where its
    node-level dedup sends a token once per domain (the Megatron MoE recipes run it); ``alltoall`` for drop-and-pad
    routing (the dispatcher that pads to capacity: Megatron-LM refuses DeepEP with
    ``moe_pad_expert_input_to_capacity``) and for an EP group inside one NVLink domain, without DeepEP's dependency.
    Inside a domain ``alltoall`` sends every routed copy at NCCL's all-to-all rate. A run that states its flex
    backend (``TrainingJob.moe_flex_dispatcher_backend``, as the MoE recipes do) runs ``flex`` when dropless; inside
    one domain it is charged from that backend's measured throughput (``flex_in_domain_s``): one copy per
    destination GPU (5.25 of 8 for top-8 over 8 GPUs) at the rate its SMs reach (GB200: 420-570 GB/s, where NCCL's
    all-to-all bus rate is 740). (Counting DeepEP's deduplicated bytes at NCCL's rate instead, 2026-12, made the dev
    rows worse: in-sample 5.08 -> 5.17%.) ``ep_group`` None: the placement is unknown (no cluster), taken as one
    domain."""
    spans = ep_group is not None and ep_group.num_domains > 1
    if job.moe_expert_capacity_factor is None and (spans or job.moe_flex_dispatcher_backend is not None):
        return "flex"
    return "alltoall"


def ep_layer_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
               groups: dict[str, GroupPlacement], fw_base: str = "megatron") -> float:
    """Forward seconds of one MoE layer's EP all-to-alls: dispatch + combine of each token's routed copies, 16-bit
    both ways, FP8 runs included (Megatron-LM dispatches the bf16 hidden states and quantizes after: its DeepEP
    path passes them to ``Buffer.dispatch`` as they are and its HybridEP path asserts ``not fp8_dispatch``,
    ``megatron/core/transformer/moe/fused_a2a.py`` at 8c1a3f5df0cb and d48bd6be; the ``alltoall`` dispatcher
    permutes them in the activation dtype). The dispatcher is ``moe_token_dispatcher``'s: DeepEP (``flex``) sends a
    token routed to several experts of one NVLink domain across the network once (node-level dedup,
    ``ep_domain_copies``); ``alltoall`` sends every routed copy, and under drop-and-pad every padded slot
    (``TrainingJob.routed_token_factor``). Across domains Megatron-Core's flex dispatcher takes no less than its
    measured internode time (``flex_internode_s``; ``fw_base``: the framework without its variant suffix). Backward: the
    same."""
    if par.ep <= 1 or model.moe is None or not model.is_moe_layer(layer):
        return 0.0
    tok = par.micro_batch_size * job.seq_length / par.cp
    g = groups["ep"]
    measured = flex_in_domain_s(model, cluster, job, par, g, tok)
    if measured is not None:
        return measured
    disp = 2.0 * compute_bytes(job.precision)
    copies = (ep_domain_copies(model.moe.num_experts, model.moe.top_k, g.num_domains, model.moe.n_group,
                               model.moe.topk_group)
              if moe_token_dispatcher(job, g) == "flex" else float(model.moe.top_k))
    network = collective_time("all_to_all", disp * tok * copies * job.routed_token_factor * model.hidden_size / par.tp,
                              g, cluster)
    kernel = flex_internode_s(model, cluster, job, par, g, tok, fw_base)
    return network if kernel is None else max(network, kernel)


def flex_in_domain_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                     g: GroupPlacement, tokens: float) -> float | None:
    """Forward seconds of one MoE layer's dispatch + combine by the run's stated flex backend (DeepEP / HybridEP)
    when the EP group lies in one NVLink domain, from the backend's measured throughput there
    (``cluster_specs.efficiency.ep_dispatch_bandwidth``: NVIDIA's Hybrid-EP measurements in DeepEP, by EP ranks and
    SMs); None when no backend is stated, the routing drops and pads, the group spans domains (``ep_layer_s``'s
    network model) or the GPU has no measured series. Bytes: the 16-bit hidden state of each of the ``tokens``
    (``tokens / tp``: each TP rank routes its sequence-parallel shard) once per destination rank holding any of its
    experts (``ep_domain_copies`` over the EP ranks: the measurement's byte count), each way."""
    backend = job.moe_flex_dispatcher_backend
    if backend is None or g.num_domains != 1 or job.moe_expert_capacity_factor is not None:
        return None
    bw = ep_dispatch_bandwidth(cluster.gpu.name, backend, par.ep, job.moe_flex_dispatcher_num_sms)
    if bw is None:
        return None
    return measured_dispatch_combine_s(model, job, par, tokens, par.ep, bw)


def flex_internode_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                     g: GroupPlacement, tokens: float, fw_base: str = "megatron") -> float | None:
    """Forward seconds of one MoE layer's dispatch + combine by the flex dispatcher's kernels when the EP group spans
    NVLink domains, at the backend's measured internode throughput (``cluster_specs.efficiency.
    ep_internode_bandwidth``, nodes of 8 GPUs with a 400 Gb/s NIC each: DeepEP's normal kernels, DeepSeek's figures
    by node count; HybridEP, NVIDIA's by node count and SMs). Megatron-LM's flex dispatcher runs DeepEP unless the
    run names another backend; the SMs are the run's (``TrainingJob.moe_flex_dispatcher_num_sms``) or the backend's
    default across domains. Bytes: the 16-bit hidden state of each of the ``tokens`` (``/ tp``) once per destination
    domain, its own included (``ep_domain_copies``, as the measurements count them), each way. Megatron-LM dispatches
    bf16: HybridEP's dispatch was measured so; DeepEP's was measured in FP8, and the bf16 bytes are charged at its
    GB/s (an assumption: the pipeline bound by bytes, not by tokens).

    None where those kernels do not run or were not measured: inside one domain; under drop-and-pad routing or
    another dispatcher (``moe_token_dispatcher`` not ``flex``); in a framework other than Megatron-Core's
    (``MCORE_MOE_FRAMEWORKS``: torchtitan's and DeepSpeed's launches emit no flex dispatcher); on a GPU without
    the kernels' internode path (NVIDIA Hopper or newer, an FP8 peak here: DeepEP's ``setup.py`` builds its internode
    kernels only with the SM90 features and NVSHMEM); on nodes other than 8 NVLink peers (DeepEP V1
    ``NUM_MAX_NVL_PEERS 8``, the measured topology; an NVL72 domain is not one).

    The figures are what the kernels' forwarding pipelines reach, not a NIC limit: at 2 nodes DeepEP's NIC carries
    half the counted bytes, ~21.5 GB/s on a 50 GB/s link. So ``ep_layer_s`` charges the slower of this and the
    all-to-all's network time at the cluster's NIC rate (a slower network makes the NIC the limit; a faster one is not
    assumed to speed the kernels up)."""
    if (fw_base not in MCORE_MOE_FRAMEWORKS or cluster.gpu.vendor != "nvidia" or "fp8" not in cluster.gpu.peak_flops
            or cluster.node.nvlink_domain_size != DEEPEP_NVL_PEERS):
        return None
    if g.num_domains <= 1 or moe_token_dispatcher(job, g) != "flex":
        return None
    bw = ep_internode_bandwidth(job.moe_flex_dispatcher_backend or "deepep", g.num_domains,
                                job.moe_flex_dispatcher_num_sms)
    if bw is None:
        return None
    return measured_dispatch_combine_s(model, job, par, tokens, g.num_domains, bw)


def measured_dispatch_combine_s(model: ModelSpec, job: TrainingJob, par: ParallelConfig, tokens: float,
                                destinations: int, bw: tuple[float, float]) -> float:
    """Seconds of one dispatch + combine at a measured (dispatch, combine) throughput ``bw`` in bytes/s counted as
    DeepEP and HybridEP count it: the 16-bit hidden state of each of the ``tokens`` (``/ tp``: each TP rank routes
    its sequence-parallel shard) once per distinct destination among ``destinations`` (EP ranks inside a domain,
    domains across them; ``ep_domain_copies``, node-limited routing included), each way."""
    moe = model.moe
    copies = ep_domain_copies(moe.num_experts, moe.top_k, destinations, moe.n_group, moe.topk_group)
    nbytes = compute_bytes(job.precision) * tokens * copies * model.hidden_size / par.tp
    return nbytes / bw[0] + nbytes / bw[1]


def pipeline_p2p_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                   groups: dict[str, GroupPlacement]) -> float:
    """Seconds of one activation send between adjacent pipeline stages (16-bit ``b·s/cp x h``, divided by TP
    under sequence parallelism); 0 without pipeline parallelism."""
    if par.pp <= 1:
        return 0.0
    tok = par.micro_batch_size * job.seq_length / par.cp
    p2p_bytes = compute_bytes(job.precision) * tok * model.hidden_size / (par.tp if par.sequence_parallel else 1)
    return collective_time("p2p", p2p_bytes, groups["pp"], cluster)


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
