"""The solver's factorized lower-bound tables, one function per table (``planner.solver`` uses them).

Built per structure (``planner.space.structures``: tp, pp, cp, dp, ep, etp, layer split) from the cost models' own
functions, evaluated once per layer *type* (dense / MoE) and once per distinct pipeline stage (stages with the same
layer mix share their terms; the lowest index holds the most in-flight micro-batches). With ``k = (structure,
micro-batch, recompute)``:

* ``pipeline_table`` -> ``P[k, sp, vpp]`` (seconds): the busiest rank's ``m x (forward + backward)`` plus the
  forward and backward of the first micro-batch through the ranks before it (no schedule can start rank r earlier
  or let rank 0 finish sooner), from ``cost_models.step_time``'s per-layer costs (``_layer_lb``);
* ``dp_table`` -> ``E[k, zero]`` (seconds): the optimizer step plus the data-parallel reduction (in full where the
  framework does not overlap it; otherwise what an upper bound of the compute cannot hide) and the ZeRO-3
  per-micro-batch gathers (same upper-bound argument); with ``Z`` and ``O`` for the tighter per-cell bound;
* ``memory_table`` -> ``W[k, slot, zero] + X[k, slot, sp, vpp]`` (bytes): model states
  (``memory.model_state_terms``), reserve and logits, plus stored activations x in-flight micro-batches and the
  largest layer's working set (``memory.activation_bytes_per_layer``, ``in_flight_microbatches``); buffers and
  transients are left out, so the bound stays below every phase's peak.

Full recompute (Megatron) is re-scored at the fewest recomputed layers per chunk N that fit
(``planner.recompute.fewest_recomputed_layers``; Megatron ``--recompute-method block``): its memory bound
recomputes every layer (the least memory of any N) and its time bound charges ``min(N_lb, chunk layers)``
recomputed layers per chunk, ``N_lb`` >= 1 the smallest N whose memory lower bound fits, so both stay below the
scalar values at the derived N.

Per-layer costs depend only on (tp, cp, ep, etp, micro-batch, sp, recompute) and the placement of the tp, cp and
ep groups, not on pp, dp or the layer split: they are computed once per such key (``_Ctx`` caches), which keeps a
space with many splits and micro-batch sizes cheap to tabulate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models import memory as mm
from cost_models import step_time as stm
from cost_models.comm import collective_time as comm_time
from cost_models.config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob
from cost_models.layout import GroupPlacement, group_placement, stage_layer_ranges
from cost_models.memory import (TOKEN_ID_BYTES, activation_bytes_per_layer, in_flight_microbatches,
                                layer_input_bytes, model_state_terms, stage_params)
from model_zoo.spec import ModelSpec

from .recompute import PARTIAL_RECOMPUTE_FRAMEWORKS
from .space import MAX_VPP, SearchSpace, Structure, micro_batch_options, sp_options, to_parallel, vpp_options, \
    zero_options

ZEROS = (0, 1, 2, 3)
V = MAX_VPP
#: The tables are lower bounds of the scalar model. MEM_MARGIN: relative slack of the memory filter (rounding).
MEM_MARGIN = 1e-6
#: Sentinel for an invalid table cell (seconds or bytes); any value at or above it is excluded.
INVALID = float("inf")


@dataclass
class Tables:
    """Factorized tables over ``k = (structure, mbs, recompute)`` (see module docstring). Seconds and bytes."""

    keys: list[tuple[Structure, int, str]] = field(default_factory=list)
    A: list = field(default_factory=list)  # [k][v]   0 where vpp v is valid, INVALID elsewhere
    P: list = field(default_factory=list)  # [k][sp][v] pipeline bound (s)
    E: list = field(default_factory=list)  # [k][z]   dp exposed + zero3 + optimizer (s)
    W: list = field(default_factory=list)  # [k][slot][z] states + logits + reserve (bytes)
    X: list = field(default_factory=list)  # [k][slot][sp][v] activations (bytes)
    Z: list = field(default_factory=list)  # [k][sp][z] bound on pipeline + hidden-DP/ZeRO-3 terms (s), 0 if none
    O: list = field(default_factory=list)  # [k][z] optimizer + fully exposed DP (s)
    D: list = field(default_factory=list)  # [k][z] DP / ZeRO-3 time always added to the pipeline (s)
    slots: int = 1

    def add(self, key, A, P, E, W, X, Z, O, D) -> None:
        self.keys.append(key)
        for name, val in (("A", A), ("P", P), ("E", E), ("W", W), ("X", X), ("Z", Z), ("O", O), ("D", D)):
            getattr(self, name).append(val)
        self.slots = max(self.slots, len(W))

    def arrays(self):
        n = len(self.keys)
        A = np.array(self.A, dtype=float).reshape(n, V)
        P = np.array(self.P, dtype=float).reshape(n, 2, V)
        E = np.array(self.E, dtype=float).reshape(n, 4)
        J = self.slots
        W = np.zeros((n, J, 4))
        X = np.zeros((n, J, 2, V))
        for i in range(n):
            for j, w in enumerate(self.W[i]):
                W[i, j] = w
            for j, x in enumerate(self.X[i]):
                X[i, j] = x
        return A, P, E, W, X

    def tight(self, A, P):
        """Per-cell step bound ``A + max(P + D, Z) + O`` over (k, sp, v, z): tighter than the additive
        ``A + P + E`` that CP-SAT minimises (it keeps the max of the pipeline and the DP/ZeRO-3 bounds per cell)."""
        n = len(self.keys)
        Z = np.array(self.Z, dtype=float).reshape(n, 2, 4)
        O = np.array(self.O, dtype=float).reshape(n, 4)
        D = np.array(self.D, dtype=float).reshape(n, 4)
        return A[:, None, :, None] + np.maximum(P[:, :, :, None] + D[:, None, None, :],
                                                Z[:, :, None, :]) + O[:, None, None, :]


def _layer_lb(model, cluster, job, par, layer, groups, exposed_comm: bool = False):
    """Lower bounds of one layer's seconds per micro-batch from ``cost_models.step_time``'s per-layer costs
    (``_layer_cost``) with the framework with the fewest elementwise passes (Megatron) and no host-time floor:
    (forward, backward without recompute, selective recompute, full recompute, forward and backward without the
    context-parallel ring (an MTP layer's)). MoE layers add the routing bookkeeping per token copy and the host
    time per local expert (``MOE_TOKEN_COPY_S``, ``MOE_EXPERT_HOST_S`` of the job's expert GEMM format; the step
    model drops the host time only under a full-iteration CUDA graph, which the search never sets). ``exposed_comm``: TP
    and EP communication fully exposed (the step model's defaults for Megatron-LM, DeepSpeed and torchtitan: TP
    overlap only for NeMo, EP overlap only on request); otherwise at their smallest exposed share. Falls back to
    zeros (a trivially valid bound) if the step model's internals change."""
    try:
        x = stm._layer_cost(model, cluster, job, par, layer, "megatron", groups)
        tp_exp = 1.0 if exposed_comm else min(1.0, float(getattr(stm, "TP_OVERLAP_EXPOSED", 0.0)))
        ep_exp = 1.0 if exposed_comm else min(1.0, float(getattr(stm, "EP_OVERLAP_EXPOSED", 0.0)))
        extra = 0.0
        if model.moe is not None and model.is_moe_layer(layer):
            tok = par.micro_batch_size * job.seq_length / par.cp
            extra = float(getattr(stm, "MOE_TOKEN_COPY_S", 0.0)) * tok * model.moe.top_k / par.tp
            # the FP8 recipe estimate_step assumes when the evaluation gives none (Blackwell: MXFP8, else per-tensor);
            # were that default to change, a bound above a scalar value only triggers the solver's rescaling
            recipe = "mx" if "fp4" in cluster.gpu.peak_flops else "cs"
            key = recipe if job.precision == "fp8" else "bf16"
            extra += float(getattr(stm, "MOE_EXPERT_HOST_S", {}).get(key, 0.0)) * model.moe.num_experts / par.ep
    except Exception:  # pragma: no cover - depends on another module's private API
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    comp_f = x.gemm + x.attn_f + x.mem + extra / 3
    comp_b = 2 * x.gemm + x.attn_b + 2 * x.mem + 2 * extra / 3
    comm_f = x.tp * tp_exp + x.ep * ep_exp
    comm_b = x.tp * tp_exp + x.ep * ep_exp
    return (comp_f + comm_f + x.cp, comp_b + comm_b + 2 * x.cp, x.attn_f, comp_f + comm_f + x.cp,
            x.gemm + x.attn_f + x.mem + comm_f, 2 * (x.gemm + x.mem) + x.attn_b + comm_b)


@dataclass
class _Ctx:
    """Constants of one search (model, cluster, job, framework) and the caches shared by all structures."""

    model: ModelSpec
    cluster: ClusterSpec
    job: TrainingJob
    framework: str
    space: SearchSpace
    mem_lim: float | None
    rep: dict[int, int]            # layer type (0 dense, 1 MoE) -> a representative layer index
    moe_prefix: list[int]          # MoE layers among the first i
    fws: list[str]                 # frameworks whose memory model may apply (the bound takes the smaller)
    reserve: float
    rate: float
    hbm: float
    el: float
    ce_passes: float
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
            framework: str = "megatron", memory_headroom: float | None = None) -> _Ctx:
    """The constants and caches of one search (``memory_headroom`` None: no memory limit is used by the bounds)."""
    rep: dict[int, int] = {}
    prefix = [0]
    for i in range(model.num_layers):
        t = 1 if model.is_moe_layer(i) else 0
        rep.setdefault(t, i)
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
    lbpe = getattr(mm, "LOGITS_BYTES_PER_ELEMENT", {})
    logit_bpe = min([lbpe.get(fw, 0) for fw in getattr(mm, "FRAMEWORKS", ("megatron",)) if fw in fws] or [0])
    mem_lim = (cluster.gpu.memory_bytes * (1 - memory_headroom) * (1 + MEM_MARGIN)
               if memory_headroom is not None else None)
    return _Ctx(model, cluster, job, framework, space, mem_lim, rep, prefix, fws,
                float(cluster.calibration.memory_reserve_bytes), rate, hbm,
                1.0 if job.precision == "fp8" else float(BYTES_16BIT), float(getattr(stm, "CE_PASSES", 0.0)),
                logit_bpe, float(getattr(stm, "ADAM_HBM_BYTES_PER_PARAM", 0.0)),
                framework.split("_")[0] in PARTIAL_RECOMPUTE_FRAMEWORKS, tuple(space.recompute),
                model.num_mtp_layers, 1 if model.is_moe_layer(model.num_layers - 1) else 0)


@dataclass
class _Layout:
    """Where the layers sit for one (pp, first, last): stage ranges, the distinct stage slots and the rank runs."""

    ranges: list[range]
    groups: list[tuple[int, int, int, range]]   # slot -> (first stage index, dense layers, MoE layers, range)
    sig_of: list[int]                           # stage -> slot
    runs: dict[int, list] = field(default_factory=dict)


def _layout(ctx: _Ctx, st: Structure) -> _Layout:
    def make():
        pp = st.pp
        ranges = stage_layer_ranges(ctx.model.num_layers, ParallelConfig(
            pp=pp, first_stage_layers=st.first, last_stage_layers=st.last))
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
        return _Layout(ranges, groups, sig_of)
    return ctx.memo(("layout", st.pp, st.first, st.last), make)


def _runs(ctx: _Ctx, lay: _Layout, pp: int, v: int) -> list[tuple]:
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


def _placements(ctx: _Ctx, st: Structure) -> dict[str, GroupPlacement]:
    """Placement of the tp, cp and ep groups (they depend on tp, cp, ep and etp only: strides 1, tp, etp)."""
    def make():
        par = ParallelConfig(tp=st.tp, cp=st.cp, ep=st.ep, etp=st.etp)
        return {d: group_placement(d, par, ctx.cluster.node.nvlink_domain_size) for d in ("tp", "cp", "ep")}
    return ctx.memo(("placement", st.tp, st.cp, st.ep, st.etp), make)


@dataclass
class _Stages:
    """Per-structure facts: layout, framework options; model states by ZeRO stage (``_with_states``) and the
    optimizer and data-parallel terms (``_comm_facts``) are added lazily, for the structures that need them."""

    st: Structure
    lay: _Layout
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
    o_coef: dict[int, tuple[float, float]] = field(default_factory=dict)   # z -> (a, c): O[z] = a + m c seconds
    n_hi: int = 1                               # most decoder layers on one rank
    has_comm: bool = False


def _stage_facts(ctx: _Ctx, st: Structure) -> _Stages | None:
    """The structure's layout and framework options (None when the framework rules leave it no ZeRO stage or no
    sequence-parallel setting)."""
    zs = zero_options(st, ctx.framework, ctx.space, ctx.model.moe is not None)
    sps = sp_options(st, ctx.job, ctx.framework, ctx.space)
    if not zs or not sps:
        return None
    tp = st.tp
    etp = st.etp if st.etp is not None else tp
    vocab = ctx.memo(("vocab", tp), lambda: ctx.model.padded_vocab_size(tp))
    edp = max(1, tp * st.dp * st.cp // (etp * st.ep))   # ParallelConfig.expert_dp
    lay = _layout(ctx, st)
    return _Stages(st, lay, zs, sps, vocab, _placements(ctx, st), st.dp * st.cp, edp,
                   n_hi=max(1, max(len(r) for r in lay.ranges)))


def _with_states(ctx: _Ctx, sf: _Stages) -> None:
    """Model states per slot and ZeRO stage: the smallest over the frameworks in play of weights + gradients +
    optimizer states (``memory.model_state_terms``), bytes. They depend on (tp, pp, split, ep, etp) and the shard
    sizes dp x cp = world / (tp x pp) and the expert data-parallel size, not on how dp x cp splits, so they are
    shared by every cp."""
    if sf.states:
        return
    st = sf.st
    sf.states, sf.smax = ctx.memo(("states", st.tp, st.pp, st.first, st.last, st.ep, st.etp, sf.shard, sf.edp,
                                   tuple(sf.zs)), lambda: _new_states(ctx, sf))


def _new_states(ctx: _Ctx, sf: _Stages):
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
            row.append(min(_state_bytes(ctx, fw, z, sp_.dense, sf.shard) + _state_bytes(ctx, fw, z, sp_.expert, sf.edp)
                           for fw in ctx.fws))
        states.append(row)
    return states, max(sparams, key=lambda x: x.total)


def _state_bytes(ctx: _Ctx, fw: str, z: int, params: float, shard: int) -> float:
    """``memory.model_state_terms`` summed (bytes), cached: the dense part is shared by every ep and etp."""
    key = ("state", fw, z, params, shard)
    got = ctx.cache.get(key)
    if got is None:
        try:
            got = float(sum(model_state_terms(fw, z, params, shard)))
        except Exception:  # pragma: no cover
            got = 0.0
        ctx.cache[key] = got
    return got


def _comm_facts(ctx: _Ctx, sf: _Stages) -> None:
    """Optimizer step (step_time: memory-bound Adam over the most loaded stage's local parameters) and the
    data-parallel gradient reduction / parameter gather seconds by ZeRO class, into ``sf``. They depend on the
    states' key and the placement of the dp x cp shard group, so most cp values share them."""
    if sf.has_comm:
        return
    _with_states(ctx, sf)
    st, dom = sf.st, ctx.cluster.node.nvlink_domain_size
    par0 = ctx.memo(("par0", st.tp, st.pp, st.dp, st.cp),
                    lambda: ParallelConfig(tp=st.tp, pp=st.pp, dp=st.dp, cp=st.cp))
    dp_g, cp_g = group_placement("dp", par0, dom), sf.placements["cp"]
    dpg = GroupPlacement(sf.shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
        if sf.shard > 1 else GroupPlacement(1, 1)
    key = ("comm", st.tp, st.pp, st.first, st.last, st.ep, st.etp, sf.shard, sf.edp, dpg, tuple(sf.zs))
    got = ctx.cache.get(key)
    if got is None:
        sf.opt, sf.rs_t, sf.ag_t, sf.rs3, sf.ag3 = _new_comm(ctx, sf, dpg)
        # exposed in full without overlap (Megatron-LM's default; DeepSpeed's pipeline engine); otherwise only
        # what the busiest rank's backward / forward cannot hide (bounded with the compute upper bounds)
        sf.dp_full = ctx.framework == "megatron" or (ctx.framework == "deepspeed" and st.pp > 1)
        sf.o_coef = _o_coefficients(ctx, sf)
        ctx.cache[key] = (sf.opt, sf.rs_t, sf.ag_t, sf.rs3, sf.ag3, sf.dp_full, sf.o_coef)
    else:
        sf.opt, sf.rs_t, sf.ag_t, sf.rs3, sf.ag3, sf.dp_full, sf.o_coef = got
    sf.has_comm = True


def _new_comm(ctx: _Ctx, sf: _Stages, dpg: GroupPlacement):
    cluster, st, smax, shard, edp = ctx.cluster, sf.st, sf.smax, sf.shard, sf.edp

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
                ag_t[zc] = collective_time("all_gather", BYTES_16BIT * smax.dense, dpg)
        if edp > 1 and smax.expert > 0:
            rs_t[zc] += collective_time("reduce_scatter" if zc else "all_reduce", BYTES_FP32 * smax.expert, eg)
            if zc:
                ag_t[zc] += collective_time("all_gather", BYTES_16BIT * smax.expert, eg)
    return opt, rs_t, ag_t, rs3, ag3


@dataclass
class _MicroBatch:
    """Per (structure, micro-batch) facts: micro-batches, end-stage extras, per-layer costs; vpp choices,
    in-flight micro-batches and activations are added by ``_with_memory_facts``."""

    mbs: int
    m: int
    tok: float
    lg: float          # output-layer GEMM forward seconds
    ce: float          # cross-entropy seconds
    emb: float         # embedding seconds
    logits_b: float    # logits bytes
    lay: dict[bool, dict[int, tuple]]                        # sp -> type -> (f, b, rc_sel, rc_full) seconds
    vpps: list[int] = field(default_factory=list)
    inflight: dict[int, list[float]] = field(default_factory=dict)   # vpp -> per slot
    acts: dict = field(default_factory=dict)   # (sp, rc) -> (type -> bytes, layer input bytes)


def _layer_costs(ctx: _Ctx, st: Structure, mbs: int, sp: bool) -> dict[int, tuple]:
    """Per layer type: ``_layer_lb`` seconds (forward, backward, selective and full recompute) per micro-batch."""
    key = ("layer", st.tp, st.cp, st.ep, st.etp, mbs, sp)
    got = ctx.cache.get(key)
    if got is None:
        groups = dict(_placements(ctx, st), dp=GroupPlacement(1, 1), pp=GroupPlacement(1, 1))
        pr = to_parallel(st, mbs, 1, 0, sp, "none")
        got = ctx.cache[key] = {t: _layer_lb(ctx.model, ctx.cluster, ctx.job, pr, i, groups, True)
                                for t, i in ctx.rep.items()}
    return got


def _activations(ctx: _Ctx, st: Structure, mbs: int, sp: bool, rc: str) -> tuple[dict[int, float], float]:
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


def _in_flight(ctx: _Ctx, pp: int, v: int, stage: int, m: int) -> float:
    par = ctx.memo(("pv", pp, v), lambda: ParallelConfig(pp=pp, vpp=v))
    return in_flight_microbatches(par, stage, m)


def _microbatch_facts(ctx: _Ctx, sf: _Stages, mbs: int) -> _MicroBatch:
    key = ("mb", sf.st, mbs)
    mb = ctx.cache.get(key)
    if mb is None:
        mb = ctx.cache[key] = _new_microbatch_facts(ctx, sf, mbs)
    return mb


def _new_microbatch_facts(ctx: _Ctx, sf: _Stages, mbs: int) -> _MicroBatch:
    model, job, st = ctx.model, ctx.job, sf.st
    m = job.global_batch_size // (mbs * st.dp)
    tok = mbs * job.seq_length / st.cp
    h, vocab, tp = model.hidden_size, sf.vocab, st.tp
    lg = ctx.memo(("lg", tp, tok), lambda: stm.gemm_time(tok, h, vocab / tp, ctx.rate, ctx.hbm, ctx.el)
                  if hasattr(stm, "gemm_time") else 0.0)
    ce = ctx.ce_passes * tok * vocab / tp / ctx.hbm
    emb = 2 * BYTES_16BIT * tok * h / ctx.hbm
    logits_b = tok * vocab / tp * ctx.logit_bpe
    lay = {}
    for sp in sf.sps:
        lay[sp] = _layer_costs(ctx, st, mbs, sp)
    return _MicroBatch(mbs, m, tok, lg, ce, emb, logits_b, lay)


def _end_extras(ctx: _Ctx, lt: dict[int, tuple], lg: float, ce: float) -> tuple[float, float]:
    """Forward and backward seconds per micro-batch the last stage adds: the output layer (logits GEMM ``lg`` and
    the cross-entropy ``ce``) and each MTP module (its own logits, and one decoder layer without the CP ring:
    DeepSeek-V3 Sec. 2.2, ``step_time``)."""
    heads = 1 + ctx.n_mtp
    f, b = heads * (lg + ce), heads * (2 * lg + ce)
    if ctx.n_mtp and ctx.last_type in lt:
        f += ctx.n_mtp * lt[ctx.last_type][4]
        b += ctx.n_mtp * lt[ctx.last_type][5]
    return f, b


def _with_memory_facts(ctx: _Ctx, sf: _Stages, mb: _MicroBatch) -> None:
    """vpp choices, in-flight micro-batches per vpp and slot, the activations of every (sp, recompute), and the
    model states (``_with_states``)."""
    if mb.vpps:
        return
    _with_states(ctx, sf)
    mb.vpps = vpp_options(ctx.model, sf.st, mb.m, ctx.framework, ctx.space)
    for v in mb.vpps:
        mb.inflight[v] = [_in_flight(ctx, sf.st.pp, v, stage, mb.m) for stage, _, _, _ in sf.lay.groups]
    for sp in sf.sps:
        for rc in ctx.space.recompute:
            mb.acts[(sp, rc)] = _activations(ctx, sf.st, mb.mbs, sp, rc)


def busiest_rank_bounds(ctx: _Ctx, sf: _Stages, mbss, only_v1) -> list[float]:
    """For each micro-batch of ``mbss``: a lower bound (seconds) of the tight bound ``A + max(P, Z) + O`` of every
    candidate of (structure, micro-batch), cheap enough for the whole space: ``P`` by the busiest rank's
    m x (forward + backward) per micro-batch, or the vpp-1 pipeline bound when vpp 1 is the only choice
    (``only_v1``, one flag per micro-batch), and ``Z`` with the smallest per-rank forward / backward, all at no
    recompute (recompute only adds) and the smaller sp setting; the smallest ``max(P, Z[z]) + O[z]`` over the ZeRO
    stages. Per-layer costs and the DP / optimizer terms are cached (``_layer_costs``, ``_comm_facts``)."""
    _comm_facts(ctx, sf)
    st, job, cache = sf.st, ctx.job, ctx.cache
    pp, dp, tp, h, vocab = st.pp, st.dp, st.tp, ctx.model.hidden_size, sf.vocab
    slots = [(stage == 0, stage == pp - 1, nd, nm) for stage, nd, nm, _ in sf.lay.groups]
    runs = [(g, cnt) for g, _, _, cnt, _ in _runs(ctx, sf.lay, pp, 1)] if pp > 1 else [(0, 1)]
    out = []
    for mbs, v1 in zip(mbss, only_v1):
        m = job.global_batch_size // (mbs * dp)
        tok = mbs * job.seq_length / st.cp
        lg = cache.get(("lg", tp, tok))
        if lg is None:
            lg = cache[("lg", tp, tok)] = stm.gemm_time(tok, h, vocab / tp, ctx.rate, ctx.hbm, ctx.el)
        ce = ctx.ce_passes * tok * vocab / tp / ctx.hbm
        emb = 2 * BYTES_16BIT * tok * h / ctx.hbm
        best = math.inf
        for sp in sf.sps:
            lt = _layer_costs(ctx, st, mbs, sp)
            d, e = lt.get(0), lt.get(1)
            lf, lb = _end_extras(ctx, lt, lg, ce)
            busy, f0, b0 = 0.0, math.inf, math.inf
            fbs = []
            for is_first, is_last, nd, nm in slots:
                f = b = 0.0
                if nd and d is not None:
                    f, b = nd * d[0], nd * d[1]
                if nm and e is not None:
                    f, b = f + nm * e[0], b + nm * e[1]
                if is_last:
                    f, b = f + lf, b + lb
                if is_first:
                    f, b = f + emb, b + 2 * emb
                fbs.append(f + b)
                busy = max(busy, f + b)
                f0, b0 = min(f0, f), min(b0, b)
            if v1:  # _pipeline_bound at vpp 1: the first micro-batch through the ranks before each run
                p = pre = 0.0
                for g, cnt in runs:
                    p = max(p, pre + (cnt - 1 + m) * fbs[g])
                    pre += cnt * fbs[g]
            else:
                p = m * busy
            for z, (a, c) in sf.o_coef.items():
                best = min(best, max(p + _d_bound(sf, m, z), _z_bound(sf, m, z, f0, b0)) + a + m * c)
        out.append(best)
    return out


def group_bound(ctx: _Ctx, sf: _Stages, mbs: int, mem_limit: float) -> tuple[float, int]:
    """A lower bound (seconds) of the tight bound ``A + max(P, Z) + O`` of every candidate of (structure, ``mbs``)
    whose memory bound fits ``mem_limit`` (bytes), and how many candidates may fit (an upper bound).

    Over (recompute, sp, zero): skipped when the memory bound at vpp 1 exceeds the limit (interleaving never holds
    fewer micro-batches in flight, ``memory.in_flight_microbatches``, so no vpp fits either); else
    ``max(P', Z[sp][z]) + O[z]`` with ``P'`` the vpp-1 pipeline bound when vpp 1 is the only choice, else the
    busiest rank's m x (forward + backward), the recompute charged at vpp 1 (the fewest recomputed layers per
    chunk N_lb only grows with the in-flight micro-batches, and interleaving recomputes N_lb per chunk), and ``Z``
    with the smallest per-rank forward/backward at vpp 1 (``Z`` is non-decreasing in them). inf when nothing fits.
    """
    mb = _microbatch_facts(ctx, sf, mbs)
    _with_memory_facts(ctx, sf, mb)
    _comm_facts(ctx, sf)
    pp = sf.st.pp
    if not mb.vpps:
        return math.inf, 0
    only_v1 = mb.vpps == [1]
    slots = sf.lay.groups
    infl1 = [_in_flight(ctx, pp, 1, stage, mb.m) for stage, _, _, _ in slots]
    w = [[sf.states[j][z] + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0) for z in ZEROS]
         for j, (stage, _, _, _) in enumerate(slots)]
    best, fits = math.inf, 0
    for rc in ctx.space.recompute:
        for sp in sf.sps:
            x = [_stored(ctx, mb, sp, rc, stage, nd, nm, pp) * infl1[j] + _biggest(ctx, mb, sp, rc, stage, nd, nm, pp)
                 for j, (stage, nd, nm, _) in enumerate(slots)]
            ok = [z for z in sf.zs if max(wj[z] + xj for wj, xj in zip(w, x)) <= mem_limit]
            if not ok:
                continue
            fits += len(ok) * len(mb.vpps)
            fb = _rank_fb(ctx, mb, rc, sp, _min_recomputed_layers(ctx, sf, mb, rc, sp, 1))
            busy, f0, b0 = 0.0, math.inf, math.inf
            lf, lb = _end_extras(ctx, mb.lay[sp], mb.lg, mb.ce)
            for stage, nd, nm, _ in slots:
                f, b = fb(nd, nm)
                if stage == pp - 1:
                    f, b = f + lf, b + lb
                if stage == 0:
                    f, b = f + mb.emb, b + 2 * mb.emb
                busy = max(busy, f + b)
                f0, b0 = min(f0, f), min(b0, b)
            p = _pipeline_bound(ctx, sf, mb, fb, 1) if only_v1 else mb.m * busy
            for z in ok:
                best = min(best, max(p + _d_bound(sf, mb.m, z), _z_bound(sf, mb.m, z, f0, b0))
                           + _o_bound(ctx, sf, mb.m, z))
    return best, fits


def _z_bound(sf: _Stages, m: int, z: int, f0: float, b0: float) -> float:
    """The ``Z`` table's value: the DP / ZeRO-3 terms that the smallest per-rank forward f0 and backward b0
    (seconds per micro-batch) cannot hide (``dp_table``)."""
    zc = 1 if z else 0
    if z < 3 and not sf.dp_full and sf.shard * sf.edp > 1:
        return (m - 1) * (f0 + b0) + max(f0, sf.ag_t[zc]) + max(b0, sf.rs_t[zc])
    if z >= 3 and (sf.shard > 1 or sf.edp > 1):
        return m * (max(f0, sf.ag3) + max(b0, sf.ag3 + sf.rs3))
    return 0.0


def _d_bound(sf: _Stages, m: int, z: int) -> float:
    """The ``D`` table's value: ZeRO-3 / FSDP time the step model adds to the pipeline in any case. Every forward
    and backward pass of every micro-batch exposes at least its first layer's all-gather, and the last backward its
    last layer's reduce-scatter (``step_time.fsdp_exposed_s`` >= (gather + reduce) / layers, with at most
    ``n_hi`` layers on the busiest rank): (2 m ag + rs) / n_hi."""
    if z < 3 or sf.shard == 1:
        return 0.0
    return (2 * m * sf.ag3 + sf.rs3) / sf.n_hi


def _o_bound(ctx: _Ctx, sf: _Stages, m: int, z: int) -> float:
    """The ``O`` table's value: the optimizer step plus the fully exposed DP terms (``dp_table``)."""
    a, c = sf.o_coef[z]
    return a + m * c


def _o_coefficients(ctx: _Ctx, sf: _Stages) -> dict[int, tuple[float, float]]:
    """``O[z] = a + m x c`` seconds per ZeRO stage: the optimizer step plus the DP reduction and gather where they
    are fully exposed; Megatron-FSDP ``optim_grads`` (z 2) reduce-scatters in every micro-batch's backward, layer
    by layer, + the exposed weight gather: step_time.fsdp_exposed_s(0, rs, c, n) >= rs / n + (n - 1) / n x
    OVERLAP_COMPUTE_SLOWDOWN x rs for any compute c, n = the busiest rank's layers, between the fewest and the
    most layers per rank."""
    out = {}
    for z in sf.zs:
        zc = 1 if z else 0
        if z == 2 and ctx.framework == "megatron":
            n_hi = max(1, max(len(r) for r in sf.lay.ranges))
            n_lo = max(1, min(len(r) for r in sf.lay.ranges))
            out[z] = (sf.opt[zc] + sf.ag_t[zc],
                      sf.rs_t[zc] * (1 / n_hi + (1 - 1 / n_lo) * stm.OVERLAP_COMPUTE_SLOWDOWN))
        else:
            out[z] = (sf.opt[zc] + (sf.rs_t[zc] + sf.ag_t[zc] if z < 3 and sf.dp_full else 0.0), 0.0)
    return out


def _stored(ctx: _Ctx, mb: _MicroBatch, sp: bool, rc: str, stage: int, nd: int, nm: int, pp: int) -> float:
    """Stored activation bytes of one micro-batch on a stage with nd dense and nm MoE layers (token ids on the
    first stage, the MTP layers on the last: ``memory.estimate_memory``); full recompute keeps only each layer's
    input (the least of any recompute_num_layers)."""
    per_t, lin = mb.acts[(sp, rc)]
    if stage == pp - 1 and ctx.n_mtp:
        nd, nm = (nd, nm + ctx.n_mtp) if ctx.last_type else (nd + ctx.n_mtp, nm)
    stored = lin * (nd + nm) if rc == "full" else nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
    return stored + (TOKEN_ID_BYTES * mb.tok if stage == 0 else 0.0)


def _biggest(ctx: _Ctx, mb: _MicroBatch, sp: bool, rc: str, stage: int, nd: int, nm: int, pp: int) -> float:
    """The running layer's working set (bytes): the largest layer's activations, twice under full recompute (the
    recomputed layer and the gradients of its activations: ``memory.estimate_memory``)."""
    per_t, _ = mb.acts[(sp, rc)]
    if stage == pp - 1 and ctx.n_mtp:
        nd, nm = (nd, nm + ctx.n_mtp) if ctx.last_type else (nd + ctx.n_mtp, nm)
    big = max([per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t], default=0.0)
    return 2 * big if rc == "full" else big


def _min_recomputed_layers(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, rc: str, sp: bool, v: int) -> int:
    """A lower bound of N, the recomputed layers per model chunk (Megatron ``--recompute-num-layers``, the same
    for every chunk of every stage) of a full-recompute candidate at vpp ``v`` that fits: on every slot the
    memory lower bound ``w + (lin n + (L - n) a_min + token ids) x in-flight + 2 x largest layer`` must fit the
    limit, which needs n >= need recomputed layers of the stage (L its layers, MTP included on the last stage),
    and a stage of v chunks recomputes at most v N, so N >= ceil(need / v). 1 when the framework recomputes every
    layer or no headroom is given."""
    if rc != "full" or not ctx.partial_rc or ctx.mem_lim is None:
        return 1
    per_t, lin = mb.acts[(sp, rc)]
    pp = sf.st.pp
    need = 1
    for j, (stage, nd, nm, rg) in enumerate(sf.lay.groups):
        if stage == pp - 1 and ctx.n_mtp:
            nd, nm = (nd, nm + ctx.n_mtp) if ctx.last_type else (nd + ctx.n_mtp, nm)
        present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
        if not present:
            continue
        a_min, big = min(present), max(present)
        n_l = nd + nm
        w = min(sf.states[j][z] for z in sf.zs) + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0)
        infl = mb.inflight[v][j] if v in mb.inflight else _in_flight(ctx, pp, v, stage, mb.m)
        tid = TOKEN_ID_BYTES * mb.tok if stage == 0 else 0.0
        over = w + (n_l * a_min + tid) * infl + 2 * big - ctx.mem_lim
        if over <= 0 or a_min <= lin or infl <= 0:
            continue
        need = max(need, min(n_l, math.ceil(over / ((a_min - lin) * infl) - 1e-9)))
    return max(1, -(-need // v))


def _rank_fb(ctx: _Ctx, mb: _MicroBatch, rc: str, sp: bool, nlb: int):
    """``fb(nd, nm, nch=1)``: lower bounds of the forward and backward seconds per micro-batch of nd dense and nm
    MoE layers in ``nch`` model chunks under recompute ``rc``. Full recompute with a derivable N
    (planner.recompute) re-runs at least min(nlb, chunk layers) layers per chunk (``nlb`` a lower bound of N,
    chunks of at least floor(layers / nch)), every layer otherwise."""
    lt = mb.lay[sp]
    memo: dict[tuple, tuple[float, float]] = {}
    partial = ctx.partial_rc

    def fb(nd: int, nm: int, nch: int = 1) -> tuple[float, float]:
        key = (nd, nm, nch)
        if key not in memo:
            f = b = 0.0
            full_min = math.inf
            for t, n in ((0, nd), (1, nm)):
                if n and t in lt:
                    lf, lb, sel, full = lt[t][:4]
                    f += n * lf
                    b += n * (lb + (sel if rc == "selective" else full if rc == "full" and not partial else 0.0))
                    full_min = min(full_min, full)
            if rc == "full" and partial and full_min < math.inf:
                b += nch * min(nlb, (nd + nm) // nch) * full_min
            memo[key] = (f, b)
        return memo[key]
    fb.lay = lt
    return fb


def _pipeline_bound(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, fb, v: int, minima: list | None = None) -> float:
    """``P`` at vpp ``v``: max over ranks r of (the first micro-batch's forward + backward through the ranks before
    r, first chunk only) + m x (r's forward + backward). Ranks come in runs of equal (stage signature, first-chunk
    mix), along which the bound grows, so each run's last rank is its maximum. ``minima`` collects the smallest
    per-rank (forward, backward)."""
    pp = sf.st.pp
    best = pre = 0.0
    lf, lb = _end_extras(ctx, fb.lay, mb.lg, mb.ce)
    for g, nd0, nm0, cnt, r0 in _runs(ctx, sf.lay, pp, v):
        stage, nd, nm, rg = sf.lay.groups[g]
        f, b = fb(nd, nm, v)
        if r0 + cnt - 1 == pp - 1:
            f += lf
            b += lb
        if r0 == 0:
            f += mb.emb
            b += 2 * mb.emb
        if minima is not None:
            minima[0], minima[1] = min(minima[0], f), min(minima[1], b)
        f0, b0 = fb(nd0, nm0, 1)
        if r0 == 0:
            f0 += mb.emb
            b0 += 2 * mb.emb
        best = max(best, pre + (cnt - 1) * (f0 + b0) + mb.m * (f + b))
        pre += cnt * (f0 + b0)
    return best


def pipeline_table(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, rc: str):
    """``A[v]`` (0 where vpp v is valid) and ``P[sp][v]`` (seconds, ``_pipeline_bound``), and the smallest per-rank
    forward and backward lower bounds per micro-batch by sp (for ``dp_table``)."""
    A = [INVALID] * V
    for v in mb.vpps:
        A[v - 1] = 0.0
    P = [[INVALID] * V for _ in range(2)]
    fb_min = {}
    for sp in sf.sps:
        minima = [math.inf, math.inf]
        for v in mb.vpps:
            fb = _rank_fb(ctx, mb, rc, sp, _min_recomputed_layers(ctx, sf, mb, rc, sp, v))
            P[int(sp)][v - 1] = _pipeline_bound(ctx, sf, mb, fb, v, minima)
        fb_min[sp] = tuple(minima)
    return A, P, fb_min


def dp_table(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, P, fb_min):
    """``E[z]``, ``Z[sp][z]``, ``O[z]`` and ``D[z]`` (seconds) of the data-parallel / ZeRO terms.

    The step model adds to the pipeline makespan (>= m x (f_B + b_B) on the busiest rank B) the gathers and
    reductions that rank B's forward f_B / backward b_B cannot hide:

    * ZeRO-3: m x (max(0, ag - f_B) + max(0, ag + rs - b_B))  =>  step >= m (max(f_B, ag) + max(b_B, ag + rs));
    * overlapped DP: max(0, rs - b_B) + max(0, ag - f_B)  =>  step >= (m-1)(f_B + b_B) + max(f_B, ag) + max(b_B, rs)

    with f_B, b_B >= the smallest per-rank lower bounds (``_z_bound``), plus the optimizer step and the exposed
    DP terms (``_o_bound``); ``D`` (``_d_bound``) is added to the pipeline bound (step >= P + D + O). E adds
    max(D, what Z exceeds the largest P of this k by), so P + E stays below the step time for every (sp, vpp).
    """
    _comm_facts(ctx, sf)
    pmax = max((x for row in P for x in row if x != INVALID), default=0.0)
    E = [INVALID] * 4
    O = [INVALID] * 4
    D = [INVALID] * 4
    Zk = [[0.0] * 4 for _ in range(2)]
    for z in sf.zs:
        O[z] = _o_bound(ctx, sf, mb.m, z)
        D[z] = _d_bound(sf, mb.m, z)
        for sp in sf.sps:
            Zk[int(sp)][z] = _z_bound(sf, mb.m, z, *fb_min[sp])
        E[z] = O[z] + max(D[z], min(Zk[int(sp)][z] for sp in sf.sps) - pmax)
    return E, Zk, O, D


def memory_table(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, rc: str):
    """``W[slot][z]`` (model states + reserve + logits on the last stage) and ``X[slot][sp][v]`` (stored
    activations x in-flight micro-batches + the largest layer's working set), bytes."""
    pp = sf.st.pp
    Wk, Xk = [], []
    for j, (stage, nd, nm, rg) in enumerate(sf.lay.groups):
        Wk.append([sf.states[j][z] + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0) for z in ZEROS])
        xs = [[0.0] * V for _ in range(2)]
        for sp in sf.sps:
            stored = _stored(ctx, mb, sp, rc, stage, nd, nm, pp)
            biggest = _biggest(ctx, mb, sp, rc, stage, nd, nm, pp)
            for v in mb.vpps:
                xs[int(sp)][v - 1] = stored * mb.inflight[v][j] + biggest
        Xk.append(xs)
    return Wk, Xk


def add_group_tables(ctx: _Ctx, T: Tables, sf: _Stages, mbs: int) -> None:
    """Append the tables of every recompute setting of (structure ``sf``, micro-batch ``mbs``) to ``T``."""
    mb = _microbatch_facts(ctx, sf, mbs)
    _with_memory_facts(ctx, sf, mb)
    for rc in ctx.space.recompute:
        A, P, fb_min = pipeline_table(ctx, sf, mb, rc)
        E, Z, O, D = dp_table(ctx, sf, mb, P, fb_min)
        W, X = memory_table(ctx, sf, mb, rc)
        T.add((sf.st, mbs, rc), A, P, E, W, X, Z, O, D)


def build_tables(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                 space: SearchSpace = SearchSpace(), framework: str = "megatron",
                 memory_headroom: float | None = None) -> Tables:
    """Tabulate the factorized lower bounds of every structure and micro-batch of the space (module docstring):
    step-time bound = ``P[k, sp, v] + E[k, z]``, memory bound of stage slot j = ``W[k, j, z] + X[k, j, sp, v]``;
    both are <= the scalar model's values (``planner.evaluation.evaluate``), which is what makes the solver's re-scoring
    loop exact. ``memory_headroom`` sets the limit used to derive the fewest recomputed layers under full
    recompute (N_lb = 1 when None). The solver builds the same tables group by group (``add_group_tables``)."""
    from .space import structures
    ctx = context(model, cluster, job, space, framework, memory_headroom)
    T = Tables()
    for st in structures(model, cluster, job, num_gpus, space, framework):
        mbss = micro_batch_options(st, job, space)
        sf = _stage_facts(ctx, st) if mbss else None
        if sf is None:
            continue
        for mbs in mbss:
            add_group_tables(ctx, T, sf, mbs)
    return T
