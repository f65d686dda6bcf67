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
from cost_models.comm import collective_time
from cost_models.config import BYTES_16BIT, BYTES_FP32, TrainingJob
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
    slots: int = 1

    def add(self, key, A, P, E, W, X, Z, O) -> None:
        self.keys.append(key)
        for name, val in (("A", A), ("P", P), ("E", E), ("W", W), ("X", X), ("Z", Z), ("O", O)):
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
        """Per-cell step bound ``A + max(P, Z) + O`` over (k, sp, v, z): tighter than the additive ``A + P + E``
        that CP-SAT minimises (it keeps the max of the pipeline and the DP/ZeRO-3 bounds per cell)."""
        n = len(self.keys)
        Z = np.array(self.Z, dtype=float).reshape(n, 2, 4)
        O = np.array(self.O, dtype=float).reshape(n, 4)
        return A[:, None, :, None] + np.maximum(P[:, :, :, None], Z[:, :, None, :]) + O[:, None, None, :]


def _layer_lb(model, cluster, job, par, layer, groups, exposed_comm: bool = False):
    """Lower bounds of one layer's forward and backward seconds per micro-batch (no recompute) and its
    recompute seconds under (selective, full), from ``cost_models.step_time``'s per-layer costs (``_layer_cost``)
    with the framework with the fewest elementwise passes (Megatron) and no host-time floor. ``exposed_comm``: TP
    and EP communication fully exposed (the step model's defaults for Megatron-LM, DeepSpeed and torchtitan: TP
    overlap only for NeMo, EP overlap only on request); otherwise at their smallest exposed share. Falls back to
    zeros (a trivially valid bound) if the step model's internals change."""
    try:
        from cost_models import step_time as stm
        x = stm._layer_cost(model, cluster, job, par, layer, "megatron", groups)
        tp_exp = 1.0 if exposed_comm else min(1.0, float(getattr(stm, "TP_OVERLAP_EXPOSED", 0.0)))
        ep_exp = 1.0 if exposed_comm else min(1.0, float(getattr(stm, "EP_OVERLAP_EXPOSED", 0.0)))
    except Exception:  # pragma: no cover - depends on another module's private API
        return 0.0, 0.0, 0.0, 0.0
    comp_f = x.gemm + x.attn_f + x.mem
    comp_b = 2 * x.gemm + x.attn_b + 2 * x.mem
    comm_f = x.tp * tp_exp + x.cp + x.ep * ep_exp
    comm_b = x.tp * tp_exp + 2 * x.cp + x.ep * ep_exp
    return comp_f + comm_f, comp_b + comm_b, x.attn_f, comp_f + comm_f


@dataclass
class _Ctx:
    """Constants of one search (model, cluster, job, framework) and the per-layer caches."""

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
    lay_cache: dict = field(default_factory=dict)
    act_cache: dict = field(default_factory=dict)
    param_cache: dict = field(default_factory=dict)


def _context(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, space: SearchSpace, framework: str,
             memory_headroom: float | None) -> _Ctx:
    from cost_models import memory as mm
    from cost_models import step_time as stm
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
                framework.split("_")[0] in PARTIAL_RECOMPUTE_FRAMEWORKS)


@dataclass
class _Stages:
    """Per-structure facts: distinct stages (slots), their model states by ZeRO stage, optimizer and DP terms."""

    st: Structure
    zs: list[int]
    sps: list[bool]
    ranges: list[range]
    groups: list[tuple[int, int, int, range]]   # slot -> (first stage index, dense layers, MoE layers, range)
    sig_of: list[int]                           # stage -> slot
    states: list[list[float]]                   # [slot][z] bytes
    opt: dict[int, float]                       # ZeRO class (0 unsharded, 1 sharded) -> optimizer step seconds
    rs_t: dict[int, float]                      # ZeRO class -> gradient reduction seconds
    ag_t: dict[int, float]                      # ZeRO class -> parameter gather seconds
    rs3: float
    ag3: float
    shard: int
    edp: int
    dp_full: bool
    placements: dict[str, GroupPlacement]
    vocab: int
    runs: dict[int, list] = field(default_factory=dict)


def _stage_facts(ctx: _Ctx, st: Structure) -> _Stages | None:
    """The structure's stage slots, model states and optimizer / data-parallel terms (None when the framework
    rules leave it no ZeRO stage or no sequence-parallel setting)."""
    model, cluster, framework = ctx.model, ctx.cluster, ctx.framework
    zs = zero_options(st, framework, ctx.space, model.moe is not None)
    sps = sp_options(st, ctx.job, framework, ctx.space)
    if not zs or not sps:
        return None
    dom = cluster.node.nvlink_domain_size
    par0 = to_parallel(st, 1, 1, 0, False, "none")
    tp, cp, pp = st.tp, st.cp, st.pp
    vocab = model.padded_vocab_size(tp)
    ranges = stage_layer_ranges(model.num_layers, par0)
    # distinct stages: (n layers, n moe layers, first?, last?) -> first stage index with that signature; the
    # lowest index of a signature holds the most in-flight micro-batches, so it bounds the others' memory
    sig_of, groups = [], []
    seen_sig: dict[tuple, int] = {}
    for i, r in enumerate(ranges):
        nm = ctx.moe_prefix[r.stop] - ctx.moe_prefix[r.start]
        sig = (len(r), nm, i == 0, i == pp - 1)
        if sig not in seen_sig:
            seen_sig[sig] = len(groups)
            groups.append((i, len(r) - nm, nm, r))
        sig_of.append(seen_sig[sig])
    sparams = []
    for stage, nd, nm, r in groups:
        key = (tp, st.ep, par0.expert_tp, pp, stage == 0, stage == pp - 1, nd, nm)
        if key not in ctx.param_cache:
            ctx.param_cache[key] = stage_params(model, par0, stage, r, vocab)
        sparams.append(ctx.param_cache[key])
    shard, edp = st.dp * cp, par0.expert_dp
    states = []  # [slot][z]: min over frameworks of weights + gradients + optimizer (memory.model_state_terms)
    for sp_ in sparams:
        row = []
        for z in ZEROS:
            best = math.inf
            for fw in ctx.fws:
                try:
                    a = (sum(model_state_terms(fw, z, sp_.dense, shard))
                         + sum(model_state_terms(fw, z, sp_.expert, edp)))
                except Exception:  # pragma: no cover
                    a = 0.0
                best = min(best, a)
            row.append(best)
        states.append(row)
    # optimizer step (step_time: memory-bound Adam over the most loaded stage's local parameters)
    smax = max(sparams, key=lambda x: x.total)
    opt = {zc: ctx.adam * (smax.dense / (shard if zc else 1) + smax.expert / (edp if zc else 1)) / ctx.hbm
           for zc in (0, 1)}
    pl = {d: group_placement(d, par0, dom) for d in ("tp", "cp", "ep", "dp", "pp")}
    # data-parallel gradient reduction (+ parameter all-gather under ZeRO 1/2), fully exposed in Megatron-LM
    # without --overlap-grad-reduce (the step model's default for framework megatron); bounded by 0 for the
    # frameworks that overlap it and for ZeRO-3 (per-micro-batch gathers hidden behind compute)
    cp_g, dp_g = pl["cp"], pl["dp"]
    dpg = GroupPlacement(shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
        if shard > 1 else GroupPlacement(1, 1)
    ag3 = rs3 = 0.0
    if shard > 1:
        rs3 = collective_time("reduce_scatter", BYTES_FP32 * smax.dense, dpg, cluster)
        ag3 = collective_time("all_gather", BYTES_16BIT * smax.dense, dpg, cluster)
    eg = GroupPlacement(edp, max(1, min(edp, dom // max(1, par0.expert_tp * st.ep))))
    if edp > 1 and smax.expert > 0:
        rs3 += collective_time("reduce_scatter", BYTES_FP32 * smax.expert, eg, cluster)
        ag3 += collective_time("all_gather", BYTES_16BIT * smax.expert, eg, cluster)
    # gradient reduction (rs) and parameter gather (ag) seconds by ZeRO class (0: all-reduce; 1, 2: distributed
    # optimizer reduce-scatter + all-gather), dense and expert groups (step_time)
    rs_t, ag_t = {0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0}
    for zc in (0, 1):
        if shard > 1:
            if zc == 0:
                rs_t[zc] = collective_time("all_reduce", BYTES_FP32 * smax.dense, dpg, cluster)
            else:
                rs_t[zc] = collective_time("reduce_scatter", BYTES_FP32 * smax.dense, dpg, cluster)
                ag_t[zc] = collective_time("all_gather", BYTES_16BIT * smax.dense, dpg, cluster)
        if edp > 1 and smax.expert > 0:
            rs_t[zc] += collective_time("reduce_scatter" if zc else "all_reduce", BYTES_FP32 * smax.expert, eg,
                                        cluster)
            if zc:
                ag_t[zc] += collective_time("all_gather", BYTES_16BIT * smax.expert, eg, cluster)
    # exposed in full without overlap (Megatron-LM's default; DeepSpeed's pipeline engine); otherwise only what
    # the busiest rank's backward / forward cannot hide (bounded with the compute upper bounds below)
    dp_full = framework == "megatron" or (framework == "deepspeed" and pp > 1)
    return _Stages(st, zs, sps, ranges, groups, sig_of, states, opt, rs_t, ag_t, rs3, ag3, shard, edp, dp_full,
                   pl, vocab)


def _runs(ctx: _Ctx, sf: _Stages, v: int) -> list[tuple]:
    """Ranks grouped in runs of equal (slot, first-chunk dense/MoE counts); rank 0 and the last rank are always
    runs of their own: (slot, first-chunk dense, first-chunk MoE, ranks, first rank)."""
    if v not in sf.runs:
        pp = sf.st.pp
        out: list[list] = []
        for r in range(pp):
            c0 = sf.ranges[r][: len(sf.ranges[r]) // v]
            nm0 = ctx.moe_prefix[c0.stop] - ctx.moe_prefix[c0.start] if len(c0) else 0
            key = (sf.sig_of[r], len(c0) - nm0, nm0)
            if out and tuple(out[-1][:3]) == key and r not in (1, pp - 1):
                out[-1][3] += 1
            else:
                out.append([*key, 1, r])
        sf.runs[v] = [tuple(x) for x in out]
    return sf.runs[v]


@dataclass
class _MicroBatch:
    """Per (structure, micro-batch) facts: micro-batches, vpp choices, end-stage extras, per-layer costs."""

    mbs: int
    m: int
    vpps: list[int]
    tok: float
    lg: float          # output-layer GEMM forward seconds
    ce: float          # cross-entropy seconds
    emb: float         # embedding seconds
    logits_b: float    # logits bytes
    inflight: dict[int, list[float]]                         # vpp -> per slot
    lay: dict[bool, dict[int, tuple]]                        # sp -> type -> (f, b, rc_sel, rc_full) seconds
    acts: dict[tuple[bool, str], tuple[dict[int, float], float]]  # (sp, rc) -> (type -> bytes, layer input bytes)


def _microbatch_facts(ctx: _Ctx, sf: _Stages, mbs: int) -> _MicroBatch:
    from cost_models import step_time as stm
    model, job, st = ctx.model, ctx.job, sf.st
    m = job.global_batch_size // (mbs * st.dp)
    vpps = vpp_options(model, st, m, ctx.framework, ctx.space)
    tok = mbs * job.seq_length / st.cp
    h, vocab, tp = model.hidden_size, sf.vocab, st.tp
    lg = stm.gemm_time(tok, h, vocab / tp, ctx.rate, ctx.hbm, ctx.el) if hasattr(stm, "gemm_time") else 0.0
    ce = ctx.ce_passes * tok * vocab / tp / ctx.hbm
    emb = 2 * BYTES_16BIT * tok * h / ctx.hbm
    logits_b = tok * vocab / tp * ctx.logit_bpe
    inflight = {}
    for v in vpps:
        pv = to_parallel(st, mbs, v, 0, False, "none")
        inflight[v] = [in_flight_microbatches(pv, stage, m) for stage, _, _, _ in sf.groups]
    pl = sf.placements
    lay, acts = {}, {}
    for sp in sf.sps:
        key = (tp, st.cp, st.ep, st.etp, mbs, sp, pl["tp"], pl["cp"], pl["ep"])
        if key not in ctx.lay_cache:
            pr = to_parallel(st, mbs, 1, 0, sp, "none")
            ctx.lay_cache[key] = {t: _layer_lb(model, ctx.cluster, job, pr, i, pl, True) for t, i in ctx.rep.items()}
        lay[sp] = ctx.lay_cache[key]
        for rc in ctx.space.recompute:
            akey = (tp, st.cp, st.ep, st.etp, mbs, sp, rc)
            if akey not in ctx.act_cache:
                prc = to_parallel(st, mbs, 1, 0, sp, rc)
                per_t = {}
                for t, i in ctx.rep.items():
                    vals = []
                    for fw in ctx.fws:
                        try:
                            vals.append(activation_bytes_per_layer(model, job, prc, i, fw))
                        except TypeError:  # pragma: no cover - older signature
                            vals.append(activation_bytes_per_layer(model, job, prc, i))
                    per_t[t] = min(vals)
                ctx.act_cache[akey] = (per_t, layer_input_bytes(model, job, prc))
            acts[(sp, rc)] = ctx.act_cache[akey]
    return _MicroBatch(mbs, m, vpps, tok, lg, ce, emb, logits_b, inflight, lay, acts)


def _min_recomputed_layers(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, rc: str, sp: bool, v: int) -> int:
    """Smallest N (full recompute, recomputed layers per chunk) whose memory lower bound fits on every slot j
    (per slot: w + (lin N + (L - N) a_min + token ids) x in-flight + largest layer <= limit); 1 when the
    framework recomputes every layer or no headroom is given."""
    if rc != "full" or not ctx.partial_rc or ctx.mem_lim is None:
        return 1
    per_t, lin = mb.acts[(sp, rc)]
    pp = sf.st.pp
    need = 1
    for j, (stage, nd, nm, rg) in enumerate(sf.groups):
        present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
        if not present:
            continue
        a_min, big = min(present), max(present)
        n_l = nd + nm
        w = min(sf.states[j][z] for z in sf.zs) + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0)
        infl = mb.inflight[v][j]
        tid = TOKEN_ID_BYTES * mb.tok if stage == 0 else 0.0
        over = w + (n_l * a_min + tid) * infl + big - ctx.mem_lim
        if over <= 0 or a_min <= lin or infl <= 0:
            continue
        need = max(need, min(n_l, math.ceil(over / ((a_min - lin) * infl) - 1e-9)))
    return need


def pipeline_table(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, rc: str):
    """``A[v]`` (0 where vpp v is valid) and ``P[sp][v]`` (seconds, module docstring), and the smallest per-rank
    forward and backward lower bounds per micro-batch by sp (for ``dp_table``)."""
    pp = sf.st.pp
    A = [INVALID] * V
    for v in mb.vpps:
        A[v - 1] = 0.0
    P = [[INVALID] * V for _ in range(2)]
    fb_min = {}
    for sp in sf.sps:
        lt = mb.lay[sp]
        memo: dict[tuple, tuple[float, float]] = {}

        def fb(nd, nm, nch=1, nlb=1, lt=lt, memo=memo):
            # nch: model chunks in these layers. Full recompute with a derivable N (planner.recompute) re-runs
            # at least min(nlb, chunk layers) layers per chunk, every layer otherwise
            key = (nd, nm, nch, nlb)
            if key not in memo:
                f = b = 0.0
                full_min = math.inf
                for t, n in ((0, nd), (1, nm)):
                    if n and t in lt:
                        lf, lb, sel, full = lt[t]
                        f += n * lf
                        b += n * (lb + (sel if rc == "selective" else
                                        full if rc == "full" and not ctx.partial_rc else 0.0))
                        full_min = min(full_min, full)
                if rc == "full" and ctx.partial_rc and full_min < math.inf:
                    b += nch * min(nlb, (nd + nm) // nch) * full_min
                memo[key] = (f, b)
            return memo[key]

        fmin = bmin = math.inf
        for v in mb.vpps:
            nlb = _min_recomputed_layers(ctx, sf, mb, rc, sp, v)
            # ranks in runs of equal (stage signature, first-chunk mix): the bound pre_r + m (f_r + b_r) grows
            # along a run, so its last rank is the run's maximum
            best = pre = 0.0
            for g, nd0, nm0, cnt, r0 in _runs(ctx, sf, v):
                stage, nd, nm, rg = sf.groups[g]
                f, b = fb(nd, nm, v, nlb)
                if r0 + cnt - 1 == pp - 1:
                    f += mb.lg + mb.ce
                    b += 2 * mb.lg + mb.ce
                if r0 == 0:
                    f += mb.emb
                    b += 2 * mb.emb
                fmin, bmin = min(fmin, f), min(bmin, b)
                f0, b0 = fb(nd0, nm0, 1, nlb)
                if r0 == 0:
                    f0 += mb.emb
                    b0 += 2 * mb.emb
                best = max(best, pre + (cnt - 1) * (f0 + b0) + mb.m * (f + b))
                pre += cnt * (f0 + b0)
            P[int(sp)][v - 1] = best
        fb_min[sp] = (fmin, bmin)
    return A, P, fb_min


def dp_table(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, P, fb_min):
    """``E[z]``, ``Z[sp][z]`` and ``O[z]`` (seconds) of the data-parallel / ZeRO terms.

    The step model adds to the pipeline makespan (>= m x (f_B + b_B) on the busiest rank B) the gathers and
    reductions that rank B's forward f_B / backward b_B cannot hide:

    * ZeRO-3: m x (max(0, ag - f_B) + max(0, ag + rs - b_B))  =>  step >= m (max(f_B, ag) + max(b_B, ag + rs));
    * overlapped DP: max(0, rs - b_B) + max(0, ag - f_B)  =>  step >= (m-1)(f_B + b_B) + max(f_B, ag) + max(b_B, rs)

    with f_B, b_B >= the smallest per-rank lower bounds. E adds what exceeds the largest P of this k, so P + E stays
    below the step time for every (sp, vpp).
    """
    from cost_models import step_time as stm
    m = mb.m
    pmax = max((x for row in P for x in row if x != INVALID), default=0.0)
    E = [INVALID] * 4
    O = [INVALID] * 4
    Zk = [[0.0] * 4 for _ in range(2)]
    for z in sf.zs:
        zc = 1 if z else 0
        if z == 2 and ctx.framework == "megatron":
            # Megatron-FSDP optim_grads: a reduce-scatter in every micro-batch's backward, layer by layer, + the
            # exposed weight gather. step_time.fsdp_exposed_s(0, rs, c, n) >= rs / n + (n - 1) / n x
            # OVERLAP_COMPUTE_SLOWDOWN x rs for any compute c, n = the busiest rank's layers, between the fewest
            # and the most layers per rank
            n_hi = max(1, max(len(r) for r in sf.ranges))
            n_lo = max(1, min(len(r) for r in sf.ranges))
            rs_mb = sf.rs_t[zc] * (1 / n_hi + (1 - 1 / n_lo) * stm.OVERLAP_COMPUTE_SLOWDOWN)
            O[z] = sf.opt[zc] + sf.ag_t[zc] + m * rs_mb
        else:
            O[z] = sf.opt[zc] + (sf.rs_t[zc] + sf.ag_t[zc] if z < 3 and sf.dp_full else 0.0)
        zz = {}
        for sp in sf.sps:
            f0, b0 = fb_min[sp]
            if z < 3 and not sf.dp_full and sf.shard * sf.edp > 1:
                zz[sp] = (m - 1) * (f0 + b0) + max(f0, sf.ag_t[zc]) + max(b0, sf.rs_t[zc])
            elif z >= 3 and (sf.shard > 1 or sf.edp > 1):
                zz[sp] = m * (max(f0, sf.ag3) + max(b0, sf.ag3 + sf.rs3))
            else:
                zz[sp] = 0.0
            Zk[int(sp)][z] = zz[sp]
        E[z] = O[z] + max(0.0, min(zz.values()) - pmax)
    return E, Zk, O


def memory_table(ctx: _Ctx, sf: _Stages, mb: _MicroBatch, rc: str):
    """``W[slot][z]`` (model states + reserve + logits on the last stage) and ``X[slot][sp][v]`` (stored
    activations x in-flight micro-batches + the largest layer's working set), bytes."""
    pp = sf.st.pp
    Wk, Xk = [], []
    for j, (stage, nd, nm, rg) in enumerate(sf.groups):
        Wk.append([sf.states[j][z] + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0) for z in ZEROS])
        xs = [[0.0] * V for _ in range(2)]
        for sp in sf.sps:
            per_t, lin = mb.acts[(sp, rc)]
            present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
            biggest = max(present, default=0.0)
            if rc == "full":
                stored = lin * (nd + nm)
            else:
                stored = nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
            if stage == 0:
                stored += TOKEN_ID_BYTES * mb.tok
            for v in mb.vpps:
                xs[int(sp)][v - 1] = stored * mb.inflight[v][j] + biggest
        Xk.append(xs)
    return Wk, Xk


def build_tables(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                 space: SearchSpace = SearchSpace(), framework: str = "megatron",
                 memory_headroom: float | None = None, structures=None) -> Tables:
    """Tabulate the factorized lower bounds of every structure (module docstring): step-time bound =
    ``P[k, sp, v] + E[k, z]``, memory bound of stage slot j = ``W[k, j, z] + X[k, j, sp, v]``; both are <= the
    scalar model's values (``planner.evaluate``), which is what makes the solver's re-scoring loop exact.

    ``structures``: the structures to tabulate (default: all of ``planner.space.structures``).
    ``memory_headroom`` sets the limit used to derive the fewest recomputed layers under full recompute (N_lb = 1
    when None).
    """
    from .space import structures as all_structures
    ctx = _context(model, cluster, job, space, framework, memory_headroom)
    T = Tables()
    sts = all_structures(model, cluster, job, num_gpus, space, framework) if structures is None else structures
    for st in sts:
        mbss = micro_batch_options(st, job, space)
        if not mbss:
            continue
        sf = _stage_facts(ctx, st)
        if sf is None:
            continue
        for mbs in mbss:
            mb = _microbatch_facts(ctx, sf, mbs)
            for rc in space.recompute:
                A, P, fb_min = pipeline_table(ctx, sf, mb, rc)
                E, Z, O = dp_table(ctx, sf, mb, P, fb_min)
                W, X = memory_table(ctx, sf, mb, rc)
                T.add((st, mbs, rc), A, P, E, W, X, Z, O)
    return T
