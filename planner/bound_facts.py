"""Inputs of the solver's lower bounds (``planner.tables``, ``planner.bound_terms``): the search's constants and
caches (``BoundContext``), each structure's stage layout, model states and data-parallel terms
(``StructureFacts``), and each micro-batch's per-layer costs and activations (``MicroBatchFacts``), from the cost
models' own functions.

Per-layer costs depend only on (tp, cp, ep, etp, micro-batch, sp, recompute) and the placement of the tp, cp and
ep groups; model states and DP terms only on (tp, pp, split, ep, etp) and the shard group's placement, not on how
dp x cp splits: each is computed once per such key (``BoundContext.cache``), which keeps a space with many splits,
cp degrees and micro-batch sizes cheap to bound.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from functools import lru_cache

from cluster_specs.spec import ClusterSpec
from cost_models import memory as mm
from cost_models import step_time as stm
from cost_models.comm import collective_time as comm_time
from cost_models.config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob
from cost_models.fp8_recipe import job_host_cost_class
from cost_models.layer_cost import OP_SAC_FRAMEWORKS
from cost_models.layout import GroupPlacement, group_placement, stage_layer_ranges
from cost_models.pipeline import PAIRING_SCHEDULES
from cost_models.activations import activation_bytes_per_layer, in_flight_microbatches, layer_input_bytes
from cost_models.memory import model_state_terms, precision_state_options, stage_params
from model_zoo.spec import ModelSpec

from .launch_options import launched_overlap_dp
from .recompute import PARTIAL_RECOMPUTE_FRAMEWORKS
from .space import SEARCH_SCHEDULES, SearchSpace, Structure, sp_options, to_parallel, vpp_options, zero_options

ZEROS = (0, 1, 2, 3)
#: The tables are lower bounds of the scalar model. MEM_MARGIN: relative slack of the memory filter (rounding).
MEM_MARGIN = 1e-6
#: Sentinel for an invalid table cell (seconds or bytes); any value at or above it is excluded.
INVALID = float("inf")


def layer_lb(model, cluster, job, par, layer, groups, exposed_comm: bool = False, framework: str = "megatron"):
    """Lower bounds of one layer's seconds per micro-batch from ``cost_models.step_time``'s per-layer costs
    (``_layer_cost``) with the framework with the fewest elementwise passes (Megatron) and no host-time floor:
    (forward, backward without recompute, selective recompute, full recompute, forward and backward without the
    context-parallel ring (an MTP layer's), the EP all-to-all of the forward (what a pairing schedule may hide)).
    MoE layers add the routing bookkeeping (``LayerCost.routing_f`` / ``routing_b``) and the host time of the
    per-expert work (``step_time.layer_pass_s``: ``moe_overhead.moe_routing_s`` and ``moe_host_exposed_s`` with the
    FP8 recipe the step model defaults to; the step model drops the host time only under a full-iteration CUDA graph, which the
    search never sets). ``exposed_comm``: TP
    and EP communication exposed as without overlap (the step model's defaults for Megatron-LM, DeepSpeed and
    torchtitan: TP overlap only for NeMo, EP overlap only on request), the backward's TP at its blocking share under
    Megatron's asynchronous schedule; otherwise at their smallest exposed share. Falls back to
    zeros (a trivially valid bound) if the step model's internals change. The selective recompute is Megatron's
    ``core_attn`` (the attention forward again); ``framework``'s per-op checkpointing (torchtitan,
    ``layer_cost.OP_SAC_FRAMEWORKS``) re-runs matmul outputs and elementwise work instead, bounded here by 0."""
    try:
        x = stm._layer_cost(model, cluster, job, par, layer, "megatron", groups)
        tp_exp = 1.0 if exposed_comm else min(1.0, *stm.TP_OVERLAP_EXPOSED.values())
        # the backward's TP on the critical path: at least the blocking share of the asynchronous schedule
        # (``collectives.tp_backward_shares``; the overlapped share adds only a non-negative slowdown)
        tp_exp_b = min(tp_exp, stm.tp_backward_shares("megatron", False, par.sequence_parallel)[0])
        ep_exp = 1.0 if exposed_comm else min(1.0, float(getattr(stm, "EP_OVERLAP_EXPOSED", 0.0)))
        # the FP8 recipe estimate_step assumes when the evaluation gives none
        recipe = job_host_cost_class(job, cluster, model, par)
        host_f, host_b = stm.moe_host_exposed_s(model, cluster, job, par, layer, "megatron", recipe, False,
                                                (x.compute_forward_s(), x.compute_backward_s()))
    except Exception:  # pragma: no cover - depends on another module's private API
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    comp_f = x.gemm + x.attn_f + x.mem + x.routing_f + host_f
    comp_b = x.gemm_backward + x.attn_b + 2 * x.mem + x.routing_b + host_b
    comm_f = x.tp * tp_exp + x.ep * ep_exp
    comm_b = x.tp * tp_exp_b + x.ep * ep_exp
    selective = 0.0 if framework.split("_")[0] in OP_SAC_FRAMEWORKS else x.attn_f
    return (comp_f + comm_f + x.cp, comp_b + comm_b + 2 * x.cp, selective, comp_f + comm_f + x.cp,
            x.gemm + x.attn_f + x.mem + comm_f, x.gemm_backward + 2 * x.mem + x.attn_b + comm_b, x.ep)


@dataclass
class BoundContext:
    """Constants of one search (model, cluster, job, framework) and the caches shared by all structures."""

    model: ModelSpec
    cluster: ClusterSpec
    job: TrainingJob
    framework: str
    space: SearchSpace
    mem_lim: float | None
    rep: dict[int, int]            # layer type (0 dense, 1 MoE) -> its cheapest layer (``context``)
    moe_prefix: list[int]          # MoE layers among the first i
    fws: list[str]                 # frameworks whose memory model may apply (the bound takes the smaller)
    reserve: float
    rate: float
    hbm: float
    el: float
    ce_bytes: tuple[float, float]  # cross-entropy HBM bytes per logit (forward, backward)
    logit_bpe: float
    adam: float
    partial_rc: bool
    least_rc: tuple[str, ...]      # the recompute settings searched
    n_mtp: int                     # multi-token-prediction layers, run on the last stage
    last_type: int                 # layer type of the last decoder layer (what an MTP layer costs like)
    cache: dict = field(default_factory=dict)

    def memo(self, key: tuple, make):
        """``make()`` once per ``key`` (per-layer costs, stage parameters, placements, layouts)."""
        try:
            return self.cache[key]
        except KeyError:
            val = self.cache[key] = make()
            return val


def context(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, space: SearchSpace = SearchSpace(),
            framework: str = "megatron", memory_headroom: float | None = None) -> BoundContext:
    """The constants and caches of one search (``memory_headroom`` None: no memory limit is used by the bounds)."""
    rep: dict[int, int] = {}
    prefix = [0]
    for i in range(model.num_layers):
        t = 1 if model.is_moe_layer(i) else 0
        # a type's representative is its cheapest layer: a sliding-window one where the type has one (its attention
        # costs no more than a full layer's, all else equal), so the per-type costs stay lower bounds
        if t not in rep or (model.attention_window(rep[t]) is None and model.attention_window(i) is not None):
            rep[t] = i
        prefix.append(prefix[-1] + t)
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s
    try:
        hbm = stm._hbm(cluster)
        rate = stm._gemm_rate(cluster, job.precision)
    except Exception:  # pragma: no cover
        rate = math.inf
    # the memory model's framework is the job's (``TrainingJob.framework``); the planner's framework too, in case
    # the evaluation passes it: the bound takes the smaller of the two
    known = set(getattr(mm, "FRAMEWORKS", ("megatron",)))
    fws = sorted({getattr(job, "framework", None) or "megatron", framework} & known) or ["megatron"]
    logit_bpe = min(mm.logits_bytes_per_element(job, fw) for fw in fws)
    mem_lim = (cluster.gpu.memory_bytes * (1 - memory_headroom) * (1 + MEM_MARGIN)
               if memory_headroom is not None else None)
    return BoundContext(model, cluster, job, framework, space, mem_lim, rep, prefix, fws,
                float(cluster.calibration.memory_reserve_bytes), rate, hbm,
                1.0 if job.precision == "fp8" else float(BYTES_16BIT), stm.cross_entropy_bytes(job, framework),
                logit_bpe, float(getattr(stm, "ADAM_HBM_BYTES_PER_PARAM", 0.0)),
                framework.split("_")[0] in PARTIAL_RECOMPUTE_FRAMEWORKS, tuple(space.recompute),
                model.num_mtp_layers, 1 if model.is_moe_layer(model.num_layers - 1) else 0)


@dataclass
class StageLayout:
    """Where the layers sit for one (pp, first, last): stage ranges, the distinct stage slots and the rank runs."""

    ranges: list[range]
    groups: list[tuple[int, int, int, range]]   # slot -> (first stage index, dense layers, MoE layers, range)
    sig_of: list[int]                           # stage -> slot
    runs: dict[int, list] = field(default_factory=dict)


def stage_layout(ctx: BoundContext, st: Structure) -> StageLayout:
    def make():
        pp = st.pp
        ranges = stage_layer_ranges(ctx.model.num_layers, ParallelConfig(
            pp=pp, first_stage_layers=st.first, last_stage_layers=st.last, pipeline_layout=st.layout))
        # distinct stages: (n layers, n moe layers, first?, last?) -> first stage index with that signature; the
        # lowest index of a signature holds the most in-flight micro-batches, so it bounds the others' memory
        sig_of, groups = [], []
        seen: dict[tuple, int] = {}
        for i, r in enumerate(ranges):
            nm = ctx.moe_prefix[r.stop] - ctx.moe_prefix[r.start]
            sig = (len(r), nm, i == 0, i == pp - 1)
            if sig not in seen:
                seen[sig] = len(groups)
                groups.append((i, len(r) - nm, nm, r))
            sig_of.append(seen[sig])
        return StageLayout(ranges, groups, sig_of)
    return ctx.memo(("layout", st.pp, st.first, st.last, st.layout), make)


def rank_runs(ctx: BoundContext, lay: StageLayout, pp: int, v: int) -> list[tuple]:
    """Ranks grouped in runs of equal (slot, first-chunk dense/MoE counts); rank 0 and the last rank are always
    runs of their own: (slot, first-chunk dense, first-chunk MoE, ranks, first rank)."""
    if v not in lay.runs:
        out: list[list] = []
        for r in range(pp):
            c0 = lay.ranges[r][: len(lay.ranges[r]) // v]
            nm0 = ctx.moe_prefix[c0.stop] - ctx.moe_prefix[c0.start] if len(c0) else 0
            key = (lay.sig_of[r], len(c0) - nm0, nm0)
            if out and tuple(out[-1][:3]) == key and r not in (1, pp - 1):
                out[-1][3] += 1
            else:
                out.append([*key, 1, r])
        lay.runs[v] = [tuple(x) for x in out]
    return lay.runs[v]


def group_placements(ctx: BoundContext, st: Structure) -> dict[str, GroupPlacement]:
    """Placement of the tp, cp and ep groups (they depend on tp, cp, ep and etp only: strides 1, tp, etp)."""
    def make():
        par = ParallelConfig(tp=st.tp, cp=st.cp, ep=st.ep, etp=st.etp)
        return {d: group_placement(d, par, ctx.cluster.node.nvlink_domain_size) for d in ("tp", "cp", "ep")}
    return ctx.memo(("placement", st.tp, st.cp, st.ep, st.etp), make)


@dataclass
class StructureFacts:
    """Per-structure facts: layout, framework options; model states by ZeRO stage (``with_states``) and the
    optimizer and data-parallel terms (``with_comm``) are added lazily, for the structures that need them."""

    st: Structure
    lay: StageLayout
    zs: list[int]
    sps: list[bool]
    vocab: int
    placements: dict[str, GroupPlacement]
    shard: int
    edp: int
    states: list[list[float]] = field(default_factory=list)   # [slot][z] bytes
    smax: object = None                                        # StageParams of the most loaded slot
    opt: dict[int, float] = field(default_factory=dict)   # ZeRO class (0 unsharded, 1 sharded) -> seconds
    rs_t: dict[int, float] = field(default_factory=dict)  # ZeRO class -> gradient reduction seconds
    ag_t: dict[int, float] = field(default_factory=dict)  # ZeRO class -> parameter gather seconds
    rs3: float = 0.0
    ag3: float = 0.0
    dp_full: bool = True
    #: ZeRO-2 reduce-scatters in every micro-batch's backward (Megatron-FSDP ``optim_grads``): its reduction is in
    #: ``o_coef``'s per-micro-batch term and ``Z`` bounds only the weight gather (``bound_terms.z_bound``)
    rs_every_microbatch: bool = False
    o_coef: dict[int, tuple[float, float]] = field(default_factory=dict)   # z -> (a, c): O[z] = a + m c seconds
    n_hi: int = 1                               # most decoder layers on one rank
    dpg: GroupPlacement | None = None           # placement of the dp x cp shard group (``with_comm``)
    #: the framework's other pipeline schedules (``space.schedule_options``) may apply; with ``pair_hide`` the
    #: share of each MoE layer's EP all-to-all an overlapped pair hides (pairing schedules), else 0
    other_schedules: tuple[str, ...] = ()
    pair_hide: float = 0.0
    has_comm: bool = False


def structure_facts(ctx: BoundContext, st: Structure) -> StructureFacts | None:
    """The structure's layout and framework options (None when the framework rules leave it no ZeRO stage or no
    sequence-parallel setting)."""
    zs = zero_options(st, ctx.framework, ctx.space, ctx.model.moe is not None)
    sps = sp_options(st, ctx.job, ctx.framework, ctx.space, ctx.model.moe is not None)
    if not zs or not sps:
        return None
    tp = st.tp
    etp = st.etp if st.etp is not None else tp
    vocab = ctx.memo(("vocab", tp), lambda: ctx.model.padded_vocab_size(tp))
    edp = max(1, tp * st.dp * st.cp // (etp * st.ep))   # ParallelConfig.expert_dp
    lay = stage_layout(ctx, st)
    others = _other_schedules(ctx, st)
    hide = (1.0 - float(getattr(stm, "EP_OVERLAP_EXPOSED", 1.0))) if set(others) & set(PAIRING_SCHEDULES) else 0.0
    return StructureFacts(st, lay, zs, sps, vocab, group_placements(ctx, st), st.dp * st.cp, edp,
                          n_hi=max(1, max(len(r) for r in lay.ranges)), other_schedules=others, pair_hide=hide)


def _other_schedules(ctx: BoundContext, st: Structure) -> tuple[str, ...]:
    """The framework's non-default pipeline schedules (``space.SEARCH_SCHEDULES``, not pinned out) that the
    structure does not rule out: combined 1F1B needs a MoE model and ep > 1, the V schedules pp > 1 over an even
    split of the layers into 2 pp stages (a superset of ``space.schedule_options``, which also checks vpp, ZeRO,
    recompute and the micro-batches)."""
    pins = ctx.space.pipeline_schedule
    out = []
    for s in SEARCH_SCHEDULES.get(ctx.framework, ()):
        if pins is not None and s not in pins:
            continue
        if s == "combined-1f1b":
            ok = ctx.model.moe is not None and st.ep > 1
        else:
            ok = st.pp > 1 and st.first is None and ctx.model.num_layers % (2 * st.pp) == 0
        if ok:
            out.append(s)
    return tuple(out)


def with_states(ctx: BoundContext, sf: StructureFacts) -> None:
    """Model states per slot and ZeRO stage: the smallest over the frameworks in play of weights + gradients +
    optimizer states (``memory.model_state_terms``), bytes. They depend on (tp, pp, split, ep, etp) and the shard
    sizes dp x cp = world / (tp x pp) and the expert data-parallel size, not on how dp x cp splits, so they are
    shared by every cp."""
    if sf.states:
        return
    st = sf.st
    sf.states, sf.smax = ctx.memo(("states", st.tp, st.pp, st.first, st.last, st.ep, st.etp, sf.shard, sf.edp,
                                   tuple(sf.zs)), lambda: _new_states(ctx, sf))


def _new_states(ctx: BoundContext, sf: StructureFacts):
    model, st = ctx.model, sf.st
    tp, pp = st.tp, st.pp
    etp = st.etp if st.etp is not None else tp
    sparams = []
    for stage, nd, nm, r in sf.lay.groups:
        sparams.append(ctx.memo(
            ("params", tp, st.ep, etp, pp, stage == 0, stage == pp - 1, nd, nm),
            lambda stage=stage, r=r: stage_params(model, ParallelConfig(tp=tp, pp=pp, ep=st.ep, etp=st.etp), stage,
                                                  r, sf.vocab)))
    states = []
    for sp_ in sparams:
        row = []
        for z in ZEROS:
            if z not in sf.zs:
                row.append(INVALID)  # never read: W[z] of a ZeRO stage the framework rules exclude
                continue
            row.append(min(model_state_bytes(ctx, fw, z, sp_.dense, sf.shard)
                           + model_state_bytes(ctx, fw, z, sp_.expert, sf.edp)
                           for fw in ctx.fws))
        states.append(row)
    return states, max(sparams, key=lambda x: x.total)


def model_state_bytes(ctx: BoundContext, fw: str, z: int, params: float, shard: int) -> float:
    """``memory.model_state_terms`` summed (bytes), cached: the dense part is shared by every ep and etp."""
    key = ("state", fw, z, params, shard)
    got = ctx.cache.get(key)
    if got is None:
        try:
            # fp32 / fp16 training: their own model-state bytes (memory.state_bytes)
            got = float(sum(model_state_terms(fw, z, params, shard, **precision_state_options(ctx.job.precision))))
        except Exception:  # pragma: no cover
            got = 0.0
        ctx.cache[key] = got
    return got


def with_comm(ctx: BoundContext, sf: StructureFacts) -> None:
    """Optimizer step (step_time: memory-bound Adam over the most loaded stage's local parameters) and the
    data-parallel gradient reduction / parameter gather seconds by ZeRO class, into ``sf``. They depend on the
    states' key and the placement of the dp x cp shard group, so most cp values share them."""
    if sf.has_comm:
        return
    with_states(ctx, sf)
    st, dom = sf.st, ctx.cluster.node.nvlink_domain_size
    par0 = ctx.memo(("par0", st.tp, st.pp, st.dp, st.cp),
                    lambda: ParallelConfig(tp=st.tp, pp=st.pp, dp=st.dp, cp=st.cp))
    dp_g, cp_g = group_placement("dp", par0, dom), sf.placements["cp"]
    dpg = GroupPlacement(sf.shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
        if sf.shard > 1 else GroupPlacement(1, 1)
    sf.dpg = dpg
    key = ("comm", st.tp, st.pp, st.first, st.last, st.ep, st.etp, sf.shard, sf.edp, dpg, tuple(sf.zs))
    got = ctx.cache.get(key)
    if got is None:
        sf.opt, sf.rs_t, sf.ag_t, sf.rs3, sf.ag3 = _new_comm(ctx, sf, dpg)
        # exposed in full where the launch does not overlap it (launch_options: DeepSpeed's pipeline engine;
        # Megatron without a dp x cp group, where only expert gradients reduce); otherwise only what the busiest
        # rank's backward / forward cannot hide (bounded with the compute upper bounds)
        sf.dp_full = not launched_overlap_dp(ctx.framework, st.dp, st.cp, st.pp)
        sf.rs_every_microbatch = ctx.framework == "megatron"
        sf.o_coef = _o_coefficients(ctx, sf)
        ctx.cache[key] = (sf.opt, sf.rs_t, sf.ag_t, sf.rs3, sf.ag3, sf.dp_full, sf.rs_every_microbatch, sf.o_coef)
    else:
        sf.opt, sf.rs_t, sf.ag_t, sf.rs3, sf.ag3, sf.dp_full, sf.rs_every_microbatch, sf.o_coef = got
    sf.has_comm = True


def decoder_sync_facts(ctx: BoundContext, sf: StructureFacts) -> StructureFacts:
    """``sf`` with its data-parallel terms (``rs_t``, ``ag_t``, ``rs3``, ``ag3``) recomputed for the fewest
    parameters any rank holds: the least dense and the least expert decoder parameters over the stages, without the
    embedding and the output layer. A lower bound of the sync of whichever rank a schedule makes the most loaded,
    whatever it places where (a V schedule puts the embedding and the output layer both on rank 0, so the default
    placement's most loaded stage, ``sf.smax``, need not be the V's); the collectives' times grow with the bytes of
    each part. For the bounds of ZB-V's and DualPipeV's rows (``tables.schedule_rows``)."""
    with_comm(ctx, sf)
    st = sf.st
    key = ("decoder_sync", st.tp, st.pp, st.first, st.last, st.ep, st.etp, sf.shard, sf.edp, sf.dpg, tuple(sf.zs))
    got = ctx.cache.get(key)
    if got is None:
        model = ctx.model
        shards = (st.etp if st.etp is not None else st.tp) * st.ep
        dense, expert = math.inf, math.inf
        for _, _, _, r in sf.lay.groups:
            per_kind = [(n, mm.layer_shard_params(model, i, st.tp, shards)) for i, n in model.layer_kinds(r)]
            dense = min(dense, sum(n * d for n, (d, _) in per_kind))
            expert = min(expert, sum(n * e for n, (_, e) in per_kind))
        least = mm.StageParams(dense=dense, expert=expert, largest_layer=0.0)
        _, rs_t, ag_t, rs3, ag3 = _new_comm(ctx, sf, sf.dpg, least)
        got = ctx.cache[key] = (rs_t, ag_t, rs3, ag3)
    low = copy.copy(sf)
    low.rs_t, low.ag_t, low.rs3, low.ag3 = got
    return low


def _new_comm(ctx: BoundContext, sf: StructureFacts, dpg: GroupPlacement, params: mm.StageParams | None = None):
    """Optimizer and DP seconds (``with_comm``) for the parameters ``params`` hold (default: ``sf.smax``)."""
    cluster, st, shard, edp = ctx.cluster, sf.st, sf.shard, sf.edp
    smax = sf.smax if params is None else params

    def collective_time(kind: str, nbytes: float, g: GroupPlacement) -> float:  # cost_models.comm, cached
        return ctx.memo(("coll", kind, nbytes, g), lambda: comm_time(kind, nbytes, g, cluster))
    dom = cluster.node.nvlink_domain_size
    etp = st.etp if st.etp is not None else st.tp
    opt = {zc: ctx.adam * (smax.dense / (shard if zc else 1) + smax.expert / (edp if zc else 1)) / ctx.hbm
           for zc in (0, 1)}
    # data-parallel gradient reduction (+ parameter all-gather under ZeRO 1/2), fully exposed in Megatron-LM
    # without --overlap-grad-reduce (the step model's default for framework megatron); bounded by 0 for the
    # frameworks that overlap it and for ZeRO-3 (per-micro-batch gathers hidden behind compute)
    eg = GroupPlacement(edp, max(1, min(edp, dom // max(1, etp * st.ep))))
    ag3 = rs3 = 0.0
    if shard > 1:
        rs3 = collective_time("reduce_scatter", BYTES_FP32 * smax.dense, dpg)
        ag3 = collective_time("all_gather", BYTES_16BIT * smax.dense, dpg)
    if edp > 1 and smax.expert > 0:
        rs3 += collective_time("reduce_scatter", BYTES_FP32 * smax.expert, eg)
        ag3 += collective_time("all_gather", BYTES_16BIT * smax.expert, eg)
    # gradient reduction (rs) and parameter gather (ag) seconds by ZeRO class (0: all-reduce; 1, 2: distributed
    # optimizer reduce-scatter + all-gather), dense and expert groups (step_time)
    rs_t, ag_t = {0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0}
    for zc in (0, 1):
        if shard > 1:
            if zc == 0:
                rs_t[zc] = collective_time("all_reduce", BYTES_FP32 * smax.dense, dpg)
            else:
                rs_t[zc] = collective_time("reduce_scatter", BYTES_FP32 * smax.dense, dpg)
                if ctx.framework == "deepspeed":
                    # DeepSpeed ZeRO-1 all-reduces the gradients in 16 bits (data_parallel.dp_sync_s), faster than
                    # the fp32 reduce-scatter of its ZeRO-2 on NVLS or across two domains: the class bounds both
                    rs_t[zc] = min(rs_t[zc], collective_time("all_reduce", BYTES_16BIT * smax.dense, dpg))
                ag_t[zc] = collective_time("all_gather", BYTES_16BIT * smax.dense, dpg)
        if edp > 1 and smax.expert > 0:
            rs_t[zc] += collective_time("reduce_scatter" if zc else "all_reduce", BYTES_FP32 * smax.expert, eg)
            if zc:
                ag_t[zc] += collective_time("all_gather", BYTES_16BIT * smax.expert, eg)
    return opt, rs_t, ag_t, rs3, ag3


@dataclass
class MicroBatchFacts:
    """Per (structure, micro-batch) facts: micro-batches, end-stage extras, per-layer costs; vpp choices,
    in-flight micro-batches and activations are added by ``with_memory_facts``."""

    mbs: int
    m: int
    tok: float
    lg: float          # output-layer GEMM forward seconds
    ce: tuple[float, float]  # cross-entropy seconds (forward, backward)
    emb: float         # embedding seconds
    logits_b: float    # logits bytes
    lay: dict[bool, dict[int, tuple]]                        # sp -> type -> (f, b, rc_sel, rc_full) seconds
    vpps: list[int] = field(default_factory=list)
    inflight: dict[int, list[float]] = field(default_factory=dict)   # vpp -> per slot
    acts: dict = field(default_factory=dict)   # (sp, rc) -> (type -> bytes, layer input bytes)


def layer_costs(ctx: BoundContext, st: Structure, mbs: int, sp: bool) -> dict[int, tuple]:
    """Per layer type: ``layer_lb`` seconds (forward, backward, selective and full recompute, and the forward and
    backward without the CP ring) per micro-batch. A dense layer's costs do not depend on ep and etp (no expert
    GEMMs, no all-to-all), so they are shared by every expert layout."""
    key = ("layer", st.tp, st.cp, st.ep, st.etp, mbs, sp)
    got = ctx.cache.get(key)
    if got is None:
        got = {}
        for t, i in ctx.rep.items():
            tkey = ("layer_t", t, st.tp, st.cp, mbs, sp) + ((st.ep, st.etp) if t else ())
            val = ctx.cache.get(tkey)
            if val is None:
                groups = dict(group_placements(ctx, st), dp=GroupPlacement(1, 1), pp=GroupPlacement(1, 1))
                pr = to_parallel(st, mbs, 1, 0, sp, "none")
                val = ctx.cache[tkey] = layer_lb(ctx.model, ctx.cluster, ctx.job, pr, i, groups, True,
                                                 ctx.framework)
            got[t] = val
        ctx.cache[key] = got
    return got


def activations(ctx: BoundContext, st: Structure, mbs: int, sp: bool, rc: str) -> tuple[dict[int, float], float]:
    """Per layer type: the smallest stored activation bytes over the frameworks in play; the layer input bytes."""
    def make():
        prc = to_parallel(st, mbs, 1, 0, sp, rc)
        per_t = {}
        for t, i in ctx.rep.items():
            vals = []
            for fw in ctx.fws:
                try:
                    vals.append(activation_bytes_per_layer(ctx.model, ctx.job, prc, i, fw))
                except TypeError:  # pragma: no cover - older signature
                    vals.append(activation_bytes_per_layer(ctx.model, ctx.job, prc, i))
            per_t[t] = min(vals)
        return per_t, layer_input_bytes(ctx.model, ctx.job, prc)
    return ctx.memo(("acts", st.tp, st.cp, st.ep, st.etp, mbs, sp, rc), make)


def in_flight(ctx: BoundContext, pp: int, v: int, stage: int, m: int) -> float:
    par = ctx.memo(("pv", pp, v), lambda: ParallelConfig(pp=pp, vpp=v))
    return in_flight_microbatches(par, stage, m)


def p2p_seconds(ctx: BoundContext, st: Structure, tok: float, sp: bool) -> float:
    """Seconds of one activation send to the next pipeline stage (``step_time``: BYTES_16BIT x tokens x hidden,
    / tp under SP, over the pp group's placement, ``comm.collective_time('p2p')``); 0 without pipelining. The
    pipeline simulation adds it to every cross-stage dependency."""
    if st.pp <= 1:
        return 0.0

    def make():
        par = ParallelConfig(tp=st.tp, cp=st.cp, dp=st.dp, pp=st.pp)
        grp = group_placement("pp", par, ctx.cluster.node.nvlink_domain_size)
        return comm_time("p2p", BYTES_16BIT * tok * ctx.model.hidden_size / (st.tp if sp else 1), grp, ctx.cluster)
    return ctx.memo(("p2p", st.tp, st.cp, st.dp, st.pp, tok, sp), make)


@lru_cache(maxsize=4096)
def round_trips(pp: int, m: int, v: int) -> tuple[int, int, int]:
    """(K, m', hops) of the pipeline ``cost_models.pipeline.simulate`` runs for pp ranks, m micro-batches and v
    chunks per rank: rank 0 starts micro-batch i + K only after micro-batch i's backward is back (at most K in
    flight in its static order), and a micro-batch's round trip is every virtual stage's forward and backward plus
    2 x ``hops`` point-to-point sends. So the makespan is at least m' / K round trips (m' = the micro-batches
    simulated in whole groups: an interleaved partial group is added at the steady rate; m'/K without rounding up
    also holds for the linear extrapolation of long schedules). This is what binds when the sends dominate (a slow
    network between pipeline stages), where the per-rank bound leaves the pipeline's stalls out."""
    if v > 1:
        whole = m - m % pp
        if whole == 0:  # simulate falls back to 1F1B over each rank's chunks run back to back
            return min(m, pp), m, pp - 1
        # rank 0's order in Megatron's interleaved schedule (cost_models.pipeline._orders): warm-up forwards, then
        # one forward and one backward in turn; forwards go group by group of pp micro-batches, chunk 0 first,
        # backwards chunk v-1 first. Its in-flight count saturates by 4 pp micro-batches.
        total = min(whole, 4 * pp) * v
        warm = min(total, 2 * (pp - 1) + (v - 1) * pp)
        started = sum(1 for i in range(warm) if i % (pp * v) < pp)
        k, done = started, 0
        for t in range(total - warm):
            if (warm + t) % (pp * v) < pp:
                started += 1
                k = max(k, started - done)
            if t % (pp * v) >= (v - 1) * pp:
                done += 1
        return max(1, k), whole, pp * v - 1
    return min(m, pp), m, pp - 1


def microbatch_facts(ctx: BoundContext, sf: StructureFacts, mbs: int) -> MicroBatchFacts:
    key = ("mb", sf.st, mbs)
    mb = ctx.cache.get(key)
    if mb is None:
        mb = ctx.cache[key] = _new_microbatch_facts(ctx, sf, mbs)
    return mb


def _new_microbatch_facts(ctx: BoundContext, sf: StructureFacts, mbs: int) -> MicroBatchFacts:
    model, job, st = ctx.model, ctx.job, sf.st
    m = job.global_batch_size // (mbs * st.dp)
    tok = mbs * job.seq_length / st.cp
    h, vocab, tp = model.hidden_size, sf.vocab, st.tp
    lg = ctx.memo(("lg", tp, tok), lambda: stm.gemm_time(tok, h, vocab / tp, ctx.rate, ctx.hbm, ctx.el)
                  if hasattr(stm, "gemm_time") else 0.0)
    ce = ce_seconds(ctx, tok * vocab / tp)
    emb = 2 * BYTES_16BIT * tok * h / ctx.hbm
    logits_b = tok * vocab / tp * ctx.logit_bpe
    lay = {}
    for sp in sf.sps:
        lay[sp] = layer_costs(ctx, st, mbs, sp)
    return MicroBatchFacts(mbs, m, tok, lg, ce, emb, logits_b, lay)


def ce_seconds(ctx: BoundContext, logits: float) -> tuple[float, float]:
    """(forward, backward) cross-entropy seconds over ``logits`` logits per micro-batch (``step_time``'s
    ``cross_entropy_s``)."""
    return ctx.ce_bytes[0] * logits / ctx.hbm, ctx.ce_bytes[1] * logits / ctx.hbm


def end_extras(ctx: BoundContext, lt: dict[int, tuple], lg: float, ce: tuple[float, float]) -> tuple[float, float]:
    """Forward and backward seconds per micro-batch the last stage adds: the output layer (logits GEMM ``lg`` and
    the cross-entropy ``ce``) and each MTP module (its own logits, and one decoder layer without the CP ring:
    DeepSeek-V3 Sec. 2.2, ``step_time``)."""
    heads = 1 + ctx.n_mtp
    f, b = heads * (lg + ce[0]), heads * (2 * lg + ce[1])
    if ctx.n_mtp and ctx.last_type in lt:
        f += ctx.n_mtp * lt[ctx.last_type][4]
        b += ctx.n_mtp * lt[ctx.last_type][5]
    return f, b


def with_memory_facts(ctx: BoundContext, sf: StructureFacts, mb: MicroBatchFacts) -> None:
    """vpp choices, in-flight micro-batches per vpp and slot, the activations of every (sp, recompute), and the
    model states (``with_states``)."""
    if mb.vpps:
        return
    with_states(ctx, sf)
    mb.vpps = vpp_options(ctx.model, sf.st, mb.m, ctx.framework, ctx.space)
    for v in mb.vpps:
        mb.inflight[v] = [in_flight(ctx, sf.st.pp, v, stage, mb.m) for stage, _, _, _ in sf.lay.groups]
    for sp in sf.sps:
        for rc in ctx.space.recompute:
            mb.acts[(sp, rc)] = activations(ctx, sf.st, mb.mbs, sp, rc)


def _o_coefficients(ctx: BoundContext, sf: StructureFacts) -> dict[int, tuple[float, float]]:
    """``O[z] = a + m x c`` seconds per ZeRO stage: the optimizer step plus the DP reduction and gather where they
    are fully exposed; Megatron-FSDP ``optim_grads`` (z 2) reduce-scatters in every micro-batch's backward, layer
    by layer, + the exposed weight gather: step_time.fsdp_exposed_s(0, rs, c, n) >= rs / n + (n - 1) / n x
    OVERLAP_COMPUTE_SLOWDOWN x rs for any compute c, n = the busiest rank's layers, between the fewest and the
    most layers per rank."""
    out = {}
    for z in sf.zs:
        zc = 1 if z else 0
        if z == 2 and sf.rs_every_microbatch:
            n_hi = max(1, max(len(r) for r in sf.lay.ranges))
            n_lo = max(1, min(len(r) for r in sf.lay.ranges))
            # the weight gather: in full without overlap, else in ``Z`` (``bound_terms.z_bound``)
            out[z] = (sf.opt[zc] + (sf.ag_t[zc] if sf.dp_full else 0.0),
                      sf.rs_t[zc] * (1 / n_hi + (1 - 1 / n_lo) * stm.OVERLAP_COMPUTE_SLOWDOWN))
        else:
            out[z] = (sf.opt[zc] + (sf.rs_t[zc] + sf.ag_t[zc] if z < 3 and sf.dp_full else 0.0), 0.0)
    return out
