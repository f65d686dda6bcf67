"""The solver's lower bounds: the factorized tables, one function per table, and the two group bounds.

Built per structure (``planner.space.structures``: tp, pp, cp, dp, ep, etp, layer split) from the cost models' own
functions, evaluated once per layer *type* (dense / MoE) and once per distinct pipeline stage (stages with the same
layer mix share their terms; the lowest index holds the most in-flight micro-batches). With ``k = (structure,
micro-batch, recompute)``:

* ``pipeline_table`` -> ``P[k, sp, vpp]`` (seconds): the busiest rank's ``m x (forward + backward)`` plus the
  forward and backward of the first micro-batch through the ranks before it (no schedule can start rank r earlier
  or let rank 0 finish sooner), from ``cost_models.step_time``'s per-layer costs (``bound_facts.layer_lb``), the
  last stage with the output layer, the loss and the MTP modules;
* ``dp_table`` -> ``Z[k, sp, zero]``, ``O[k, zero]``, ``D[k, zero]`` (seconds): the data-parallel reduction and
  ZeRO-3 gathers that an upper bound of the compute cannot hide (``Z``), the optimizer step and the fully exposed
  DP terms (``O``), the ZeRO-3 time always added to the pipeline (``D``); the per-cell bound is
  ``max(P + D, Z) + O`` (``Tables.tight``), and ``E`` is its additive relaxation (step >= ``P + E``, CP-SAT's
  objective);
* ``memory_table`` -> ``W[k, slot, zero] + X[k, slot, sp, vpp]`` (bytes): model states
  (``memory.model_state_terms``), reserve and logits, plus stored activations (MTP layers on the last stage) x
  in-flight micro-batches and the running layer's working set (``memory.activation_bytes_per_layer``,
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
from model_zoo.spec import ModelSpec

from .bound_facts import (INVALID, ZEROS, BoundContext, MicroBatchFacts, StructureFacts, context, microbatch_facts,
                          structure_facts, with_comm, with_memory_facts)
from .bound_terms import (d_bound, min_recomputed_layers, o_bound, pipeline_bound, rank_fb, stored_bytes,
                          working_bytes, z_bound)
from .space import MAX_VPP, SearchSpace, Structure, micro_batch_options

V = MAX_VPP


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
    exposed DP terms (``o_bound``); ``D`` (``d_bound``) is added to the pipeline bound (step >= P + D + O). E adds
    max(D, what Z exceeds the largest P of this k by), so P + E stays below the step time for every (sp, vpp).
    """
    with_comm(ctx, sf)
    pmax = max((x for row in P for x in row if x != INVALID), default=0.0)
    E = [INVALID] * 4
    O = [INVALID] * 4
    D = [INVALID] * 4
    Zk = [[0.0] * 4 for _ in range(2)]
    for z in sf.zs:
        O[z] = o_bound(ctx, sf, mb.m, z)
        D[z] = d_bound(sf, mb.m, z)
        for sp in sf.sps:
            Zk[int(sp)][z] = z_bound(sf, mb.m, z, *fb_min[sp])
        E[z] = O[z] + max(D[z], min(Zk[int(sp)][z] for sp in sf.sps) - pmax)
    return E, Zk, O, D


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
    """Append the tables of every recompute setting of (structure ``sf``, micro-batch ``mbs``) to ``T``."""
    mb = microbatch_facts(ctx, sf, mbs)
    with_memory_facts(ctx, sf, mb)
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
        sf = structure_facts(ctx, st) if mbss else None
        if sf is None:
            continue
        for mbs in mbss:
            add_group_tables(ctx, T, sf, mbs)
    return T
