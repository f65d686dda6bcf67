"""The solver's lower bounds: the factorized tables, one function per table, and the two group bounds.

Built per structure (``planner.space.structures``: tp, pp, cp, dp, ep, etp, layer split) from the cost models' own
functions, evaluated once per layer *type* (dense / MoE) and once per distinct pipeline stage (stages with the same
layer mix share their terms; the lowest index holds the most in-flight micro-batches). With ``k = (structure,
micro-batch, recompute, pipeline schedule)`` (the default schedule's rows below; the framework's other schedules,
combined 1F1B / ZB-V / DualPipeV, get rows of their own, weaker for the V schedules, from ``schedule_rows``):

* ``pipeline_table`` -> ``P[k, sp, vpp]`` (seconds): the busiest rank's ``m x (forward + backward)`` plus the
  forward and backward of the first micro-batch through the ranks before it (no schedule can start rank r earlier
  or let rank 0 finish sooner), from ``cost_models.step_time``'s per-layer costs (``bound_facts.layer_lb``), the
  last stage with the output layer, the loss and the MTP modules;
* ``dp_table`` -> ``Z[k, sp, zero]``, ``O[k, zero]``, ``D[k, zero]``, ``F[k, zero]`` (seconds): the data-parallel
  reduction and ZeRO-3 gathers that an upper bound of the compute cannot hide (``Z``), the optimizer step and the
  fully exposed DP terms (``O``), the DP / ZeRO-3 time always added to the pipeline (``D``), the overlapped DP
  collectives (``F``, against ``K[k]`` x the pipeline); the per-cell bound is ``max(P + D, Z, K P + F) + O``
  (``Tables.tight``), and ``E`` is its additive relaxation (step >= ``P + E``, CP-SAT's objective);
* ``memory_table`` -> ``W[k, slot, zero] + X[k, slot, sp, vpp]`` (bytes): model states
  (``memory.model_state_terms``), reserve and logits, plus stored activations (MTP layers on the last stage) x
  in-flight micro-batches and the running layer's working set (``activations.activation_bytes_per_layer``,
  ``in_flight_microbatches``); buffers and transients are left out, so the bound stays below every phase's peak.

Full recompute (Megatron) is re-scored at the fewest recomputed layers per chunk N that fit
(``planner.recompute.fewest_recomputed_layers``; Megatron ``--recompute-method block``): its memory bound
recomputes every layer (the least memory of any N) and its time bound charges ``min(N_lb, chunk layers)``
recomputed layers per chunk, ``N_lb`` a lower bound of the N whose memory bound fits, so both stay below the
scalar values at the derived N.

Group bounds (one group = a structure and a micro-batch; the solver's branch and bound):
``busiest_rank_bounds`` <= ``group_bound`` <= the tight bound of every cell of the group (that fits, for
``group_bound``). tests/test_tables_bounds.py checks all of them against the scalar model.

Per-layer costs depend only on (tp, cp, ep, etp, micro-batch, sp, recompute) and the placement of the tp, cp and
ep groups, model states and DP terms only on (tp, pp, split, ep, etp) and the shard group's placement, not on how
dp x cp splits: each is computed once per such key (``_Ctx`` caches), which keeps a space with many splits, cp
degrees and micro-batch sizes cheap to bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models.config import TrainingJob
from cost_models.layout import holds_embedding, holds_output
from cost_models.activations import in_flight_microbatches
from cost_models.memory import TOKEN_ID_BYTES, stage_params
from cost_models.pipeline import PAIRING_SCHEDULES
from model_zoo.spec import ModelSpec

from .bound_facts import (INVALID, ZEROS, BoundContext, MicroBatchFacts, StructureFacts, context, end_extras,
                          microbatch_facts, model_state_bytes, p2p_seconds, structure_facts, with_comm,
                          with_memory_facts)
from .bound_terms import (d_bound, dp_facts, makespan_share, min_recomputed_layers, o_bound, overlapped_dp_s,
                          paired_dp_bound, paired_hidden, pipeline_bound, rank_fb, sends_around, stored_bytes,
                          working_bytes, z_bound)
from .space import MAX_VPP, SearchSpace, Structure, micro_batch_options, schedule_options, to_parallel

V = MAX_VPP


@dataclass
class Tables:
    """Factorized tables over ``k = (structure, mbs, recompute, schedule)`` (see module docstring). Seconds and
    bytes."""

    #: (structure, micro-batch, recompute, pipeline schedule); schedule None = the default (1F1B / interleaved)
    keys: list[tuple[Structure, int, str, str | None]] = field(default_factory=list)
    A: list = field(default_factory=list)  # [k][v]   0 where vpp v is valid, INVALID elsewhere
    P: list = field(default_factory=list)  # [k][sp][v] pipeline bound (s)
    E: list = field(default_factory=list)  # [k][z]   dp exposed + zero3 + optimizer (s)
    W: list = field(default_factory=list)  # [k][slot][z] states + logits + reserve (bytes)
    X: list = field(default_factory=list)  # [k][slot][sp][v] activations (bytes)
    Z: list = field(default_factory=list)  # [k][sp][z] bound on pipeline + hidden-DP/ZeRO-3 terms (s), 0 if none
    O: list = field(default_factory=list)  # [k][z] optimizer + fully exposed DP (s)
    D: list = field(default_factory=list)  # [k][z] DP / ZeRO-3 time always added to the pipeline (s)
    F: list = field(default_factory=list)  # [k][z] overlapped DP collectives (s): step >= K P + F + O
    K: list = field(default_factory=list)  # [k] makespan share K (``bound_terms.makespan_share``; 1 with F 0: none)
    slots: int = 1

    def add(self, key, A, P, E, W, X, Z, O, D, F=(0.0,) * 4, K=1.0) -> None:
        self.keys.append(key)
        for name, val in (("A", A), ("P", P), ("E", E), ("W", W), ("X", X), ("Z", Z), ("O", O), ("D", D),
                          ("F", list(F)), ("K", K)):
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
        """Per-cell step bound ``A + max(P + D, Z, K P + F) + O`` over (k, sp, v, z): tighter than the additive
        ``A + P + E`` that CP-SAT minimises (it keeps the max of the pipeline and the DP/ZeRO-3 bounds per cell;
        ``bound_terms.default_schedule_bound``)."""
        n = len(self.keys)
        Z = np.array(self.Z, dtype=float).reshape(n, 2, 4)
        O = np.array(self.O, dtype=float).reshape(n, 4)
        D = np.array(self.D, dtype=float).reshape(n, 4)
        F = np.array(self.F, dtype=float).reshape(n, 4)
        K = np.array(self.K, dtype=float).reshape(n)
        Pz = P[:, :, :, None]
        return A[:, None, :, None] + np.maximum(np.maximum(Pz + D[:, None, None, :], Z[:, :, None, :]),
                                                K[:, None, None, None] * Pz + F[:, None, None, :]) \
            + O[:, None, None, :]


def pipeline_table(ctx: BoundContext, sf: StructureFacts, mb: MicroBatchFacts, rc: str):
    """``A[v]`` (0 where vpp v is valid) and ``P[sp][v]`` (seconds, ``bound_terms.pipeline_bound``), and the
    smallest per-rank forward and backward lower bounds per micro-batch by sp (for ``dp_table``)."""
    A = [INVALID] * V
    for v in mb.vpps:
        A[v - 1] = 0.0
    P = [[INVALID] * V for _ in range(2)]
    fb_min = {}
    for sp in sf.sps:
        minima = [math.inf, math.inf]
        for v in mb.vpps:
            fb = rank_fb(ctx, mb, rc, sp, min_recomputed_layers(ctx, sf, mb, rc, sp, v))
            P[int(sp)][v - 1] = pipeline_bound(ctx, sf, mb, fb, v, minima)
        fb_min[sp] = tuple(minima)
    return A, P, fb_min


def dp_table(ctx: BoundContext, sf: StructureFacts, mb: MicroBatchFacts, P, fb_min):
    """``E[z]``, ``Z[sp][z]``, ``O[z]`` and ``D[z]`` (seconds) of the data-parallel / ZeRO terms.

    The step model adds to the pipeline makespan (>= m x (f_B + b_B) on the busiest rank B) the gathers and
    reductions that rank B's forward f_B / backward b_B cannot hide:

    * ZeRO-3: m x (max(0, ag - f_B) + max(0, ag + rs - b_B))  =>  step >= m (max(f_B, ag) + max(b_B, ag + rs));
    * overlapped DP: max(0, rs - b_B) + max(0, ag - f_B)  =>  step >= (m-1)(f_B + b_B) + max(f_B, ag) + max(b_B, rs)

    with f_B, b_B >= the smallest per-rank lower bounds (``bound_terms.z_bound``), plus the optimizer step and the
    exposed DP terms (``o_bound``); ``D`` (``d_bound``) is added to the pipeline bound (step >= P + D + O), and the
    overlapped collectives ``F`` to K x the pipeline bound (``bound_terms.makespan_share``). E adds max(D, what Z
    exceeds the largest P of this k by, F - (1 - K) x that P), so P + E stays below the step time for every (sp,
    vpp).
    """
    with_comm(ctx, sf)
    pmax = max((x for row in P for x in row if x != INVALID), default=0.0)
    E = [INVALID] * 4
    O = [INVALID] * 4
    D = [INVALID] * 4
    F = [0.0] * 4
    K = makespan_share(mb.m)
    Zk = [[0.0] * 4 for _ in range(2)]
    for z in sf.zs:
        O[z] = o_bound(ctx, sf, mb.m, z)
        D[z] = d_bound(sf, mb.m, z)
        F[z] = overlapped_dp_s(sf, z)
        for sp in sf.sps:
            Zk[int(sp)][z] = z_bound(sf, mb.m, z, *fb_min[sp])
        E[z] = O[z] + max(D[z], min(Zk[int(sp)][z] for sp in sf.sps) - pmax, F[z] - (1 - K) * pmax)
    return E, Zk, O, D, F, K


def memory_table(ctx: BoundContext, sf: StructureFacts, mb: MicroBatchFacts, rc: str):
    """``W[slot][z]`` (model states + reserve + logits on the last stage) and ``X[slot][sp][v]`` (stored
    activations x in-flight micro-batches + the largest layer's working set), bytes."""
    pp = sf.st.pp
    Wk, Xk = [], []
    for j, (stage, nd, nm, rg) in enumerate(sf.lay.groups):
        Wk.append([sf.states[j][z] + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0) for z in ZEROS])
        xs = [[0.0] * V for _ in range(2)]
        for sp in sf.sps:
            stored = stored_bytes(ctx, mb, sp, rc, stage, nd, nm, pp)
            biggest = working_bytes(ctx, mb, sp, rc, stage, nd, nm, pp)
            for v in mb.vpps:
                xs[int(sp)][v - 1] = stored * mb.inflight[v][j] + biggest
        Xk.append(xs)
    return Wk, Xk


def add_group_tables(ctx: BoundContext, T: Tables, sf: StructureFacts, mbs: int) -> None:
    """Append the tables of every recompute setting and pipeline schedule of (structure ``sf``, micro-batch
    ``mbs``) to ``T``: the default schedule's rows, then the framework's other schedules' (``schedule_rows``)."""
    mb = microbatch_facts(ctx, sf, mbs)
    with_memory_facts(ctx, sf, mb)
    st = sf.st
    for rc in ctx.space.recompute:
        A, P, fb_min = pipeline_table(ctx, sf, mb, rc)
        E, Z, O, D, F, K = dp_table(ctx, sf, mb, P, fb_min)
        W, X = memory_table(ctx, sf, mb, rc)
        # a --pipeline-schedule pin may exclude the default schedule (1f1b / interleaved) at some vpp
        for v in mb.vpps:
            if None not in schedule_options(ctx.model, st, mb.m, v, sf.zs[0], rc, ctx.framework, ctx.space):
                A[v - 1] = INVALID
        if any(a != INVALID for a in A):
            T.add((st, mbs, rc, None), A, P, E, W, X, Z, O, D, F, K)
        if sf.other_schedules:
            schedule_rows(ctx, T, sf, mb, rc, O)


def schedule_rows(ctx: BoundContext, T: Tables, sf: StructureFacts, mb: MicroBatchFacts, rc: str, O) -> None:
    """Table rows ``k = (structure, mbs, recompute, schedule)`` of the framework's other pipeline schedules
    (``space.schedule_options``: combined 1F1B, ZB-V, DualPipeV). Lower bounds, schedule by schedule:

    * time: each rank is busy at least ``m`` x its chunks' forward + backward, less the EP all-to-all an
      overlapped pair hides (``pipeline_ops.fb_seconds`` >= F + B - hide_F - hide_B; hide = (1 - EP_OVERLAP_EXPOSED)
      of each MoE layer's all-to-all, forward and backward; ``bound_terms.paired_microbatches``), plus the sends
      outside the rank's busy time (``bound_terms.sends_around``), with the embedding
      and the output layer on the ranks the schedule puts them (``layout.holds_embedding`` / ``holds_output``); the
      ZeRO-3 time every schedule adds (``D``, ``bound_terms.d_bound``: the step model adds the FSDP gathers to any
      makespan, and a rank holds at most ``n_hi`` layers);
    * every schedule: the default rows' DP / ZeRO-3 tightening with its own per-rank forward / backward bounds,
      less the most any rank's pairs hide (``Z``, ``bound_terms.paired_dp_bound``);
    * combined 1F1B (Megatron's interleaved placement) also: with pp > 1 the start-up and drain of the default
      rows' pipeline bound, less what the pairs hide (``bound_terms.pipeline_bound`` with ``hidden``: every rank
      starts with a lone forward and ends with a lone backward of the same last micro-batch);
    * ZB-V and DualPipeV: no start-up term (a V moves the embedding and the output layer, and ZB-V ends ranks with
      weight-gradient ops): weaker, still below the scalar model;
    * memory: the default rows' terms with the schedule's own placement (a V puts the embedding and the output
      layer's weights and logits on rank 0) and in-flight micro-batches (its op order).
    """
    model, st, m = ctx.model, sf.st, mb.m
    for sched in sf.other_schedules:
        vz = {(v, z) for v in mb.vpps for z in sf.zs
              if sched in schedule_options(model, st, m, v, z, rc, ctx.framework, ctx.space)}
        if not vz:
            continue
        vs, zz = sorted({v for v, _ in vz}), sorted({z for _, z in vz})
        pars = {v: to_parallel(st, mb.mbs, v, 0, False, rc, sched) for v in vs}
        pv = pars[vs[0]]
        pairing = sched in PAIRING_SCHEDULES
        lf, lb = end_extras(ctx, {}, mb.lg, mb.ce)  # the output layer and loss (the MTP layers are left out)
        A = [INVALID] * V
        P = [[INVALID] * V for _ in range(2)]
        Zk = [[0.0] * 4 for _ in range(2)]
        for sp in sf.sps:
            fb = rank_fb(ctx, mb, rc, sp, 1)  # at least one recomputed layer per chunk (any in-flight count)
            ep_s = mb.lay[sp][1][6] if 1 in mb.lay[sp] else 0.0
            p2p = p2p_seconds(ctx, st, mb.tok, sp)
            f0 = b0 = math.inf
            hid = 0.0
            for v in vs:
                A[v - 1] = 0.0
                best = 0.0
                for stage, nd, nm, _ in sf.lay.groups:
                    f, b = fb(nd, nm, v)
                    if holds_embedding(pv, stage):
                        f, b = f + mb.emb, b + 2 * mb.emb
                    if holds_output(pv, stage):
                        f, b = f + lf, b + lb
                    h = paired_hidden(sf, nm, ep_s, m, v) if pairing else 0.0
                    best = max(best, m * (f + b) - h + sends_around(stage) * p2p)
                    f0, b0, hid = min(f0, f), min(b0, b), max(hid, h)
                if sched == "combined-1f1b" and st.pp > 1:  # the default placement's start-up and drain
                    best = max(best, pipeline_bound(ctx, sf, mb, fb, v, hidden=lambda nm, v=v: paired_hidden(
                        sf, nm, ep_s, m, v)))
                P[int(sp)][v - 1] = best
            # every schedule adds the same DP / ZeRO-3 exposure to its makespan (bound_terms.paired_dp_bound)
            Zk[int(sp)] = [paired_dp_bound(dp_facts(ctx, sf, sched), m, z, f0, b0, hid) if z in zz else 0.0
                           for z in ZEROS]
        D = [d_bound(dp_facts(ctx, sf, sched), m, z) for z in ZEROS]
        pmax = max((x for row in P for x in row if x != INVALID), default=0.0)
        E = [O[z] + max(D[z], min(Zk[int(sp)][z] for sp in sf.sps) - pmax) if z in zz else INVALID
             for z in ZEROS]
        vocab, tok = sf.vocab, mb.tok
        Wk, Xk = [], []
        for stage, nd, nm, r in sf.lay.groups:
            sp_ = stage_params(model, pv, stage, r, vocab)
            states = [min(model_state_bytes(ctx, fw, z, sp_.dense, sf.shard)
                          + model_state_bytes(ctx, fw, z, sp_.expert, sf.edp)
                          for fw in ctx.fws)
                      if z in sf.zs else INVALID for z in ZEROS]
            logits = tok * vocab / pv.tp * ctx.logit_bpe if holds_output(pv, stage) else 0.0
            Wk.append([states[z] + ctx.reserve + logits for z in ZEROS])
            xs = [[0.0] * V for _ in range(2)]
            for sp in sf.sps:
                per_t, lin = mb.acts[(sp, rc)]
                present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
                stored = lin * (nd + nm) if rc == "full" else nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
                if holds_embedding(pv, stage):
                    stored += TOKEN_ID_BYTES * tok
                for v in vs:
                    infl = in_flight_microbatches(pars[v], stage, m)
                    xs[int(sp)][v - 1] = stored * infl + max(present, default=0.0)
            Xk.append(xs)
        T.add((st, mb.mbs, rc, sched), A, P, E, Wk, Xk, Zk, O, D)


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
        sf = structure_facts(ctx, st) if mbss else None
        if sf is None:
            continue
        for mbs in mbss:
            add_group_tables(ctx, T, sf, mbs)
    return T
