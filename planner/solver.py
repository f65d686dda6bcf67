"""CP-SAT search over the whole space: the solver proposes, the scalar cost model disposes.

How it works (DESIGN.md "The solver proposes, the scalar model disposes"):

1. **Structures** (``planner.space.structures``): every (tp, pp, cp, dp, ep, layer split) with exact products and
   the divisibility rules; the other knobs (micro-batch, recompute, vpp, sequence parallel, ZeRO stage) range over
   ``planner.space``'s domains with its framework rules. A few hundred structures at most, even at 1M GPUs.
2. **Factorized tables of lower bounds**, built per structure from the cost models' own functions, evaluated once
   per layer *type* (dense / MoE) and once per distinct pipeline stage (stages with the same layer mix share their
   terms; the lowest index holds the most in-flight micro-batches). With ``k = (structure, micro-batch,
   recompute, pipeline schedule)`` (the default schedule's rows below; the framework's other schedules, combined
   1F1B / ZB-V / DualPipeV, get rows of weaker but valid bounds from ``_schedule_rows``):

   * step seconds >= ``P[k, sp, vpp] + E[k, zero]``: ``P`` bounds the pipeline makespan from the per-layer costs of
     ``cost_models.step_time`` (``_layer_cost``): the busiest rank's ``m x (forward + backward)`` plus the
     forward and backward of the first micro-batch through the ranks before it (no schedule can start rank r
     earlier or let rank 0 finish sooner); ``E`` is the optimizer step plus the data-parallel reduction (in full
     where the framework does not overlap it; otherwise what an upper bound of the compute cannot hide) and the
     ZeRO-3 per-micro-batch gathers (same upper-bound argument);
   * memory of stage slot ``j`` >= ``W[k, j, zero] + X[k, j, sp, vpp]`` bytes: model states
     (``memory.model_state_terms``), reserve and logits, plus stored activations x in-flight micro-batches and the
     largest layer's working set (``memory.activation_bytes_per_layer``, ``in_flight_microbatches``); buffers and
     transients are left out, so the bound stays below every phase's peak.
   * full recompute (Megatron) is re-scored at the fewest recomputed layers per chunk N that fit
     (``planner.recompute.fewest_recomputed_layers``; Megatron ``--recompute-method block``): its memory bound
     recomputes every layer (the least memory of any N) and its time bound charges ``min(N_lb, chunk layers)``
     recomputed layers per chunk, ``N_lb`` >= 1 the smallest N whose memory lower bound fits, so both stay below
     the scalar values at the derived N.

3. **CP-SAT** (OR-Tools) chooses ``k``, vpp, sp and zero (one-hot variables, one boolean per table cell, tied by
   marginal-consistency constraints), with every stage's memory bound <= capacity x (1 - headroom), minimising the
   step-time bound (integer units of 1e-6 of the largest table value). Its optimum, and a hint from the same
   tables, start the re-scoring.
4. **Re-scoring**: candidates are evaluated by the scalar model (``planner.evaluation.evaluate``, which also runs the
   independent checker) in increasing order of their bound until the next bound exceeds the K-th best scalar step
   time. Because the tables are lower bounds, the result is exactly the enumerator's top K (ties broken by
   ``search.rank_key``). If a re-scored value ever falls below its bound (the cost models changed under the
   tables), the bounds are scaled down by the ratio seen and the loop goes on, so correctness does not hinge on
   the bounds; only speed does.

The enumerator (``planner.search.enumerate_plans``) is the oracle: on every space small enough to enumerate both
return the same top K (tests/test_solver_property.py). ``ortools`` is imported only inside ``solve``.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models.comm import collective_time
from cost_models.config import BYTES_16BIT, BYTES_FP32, FlopsConvention, ParallelConfig, TrainingJob
from cost_models.layout import GroupPlacement, group_placement, stage_layer_ranges
from cost_models.memory import (TOKEN_ID_BYTES, activation_bytes_per_layer, estimate_memory,
                                in_flight_microbatches, layer_input_bytes, model_state_terms, stage_params)
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluation import Evaluation, evaluate
from .recompute import PARTIAL_RECOMPUTE_FRAMEWORKS, dominated_by_no_recompute, with_fewest_recomputed_layers
from .space import (MAX_VPP, SEARCH_SCHEDULES, SearchSpace, Structure, micro_batch_options, schedule_options,
                    sp_options, structures, to_parallel, vpp_options, zero_options)

ZEROS = (0, 1, 2, 3)
V = MAX_VPP
MIB = 2**20
#: The tables are lower bounds of the scalar model. MEM_MARGIN: relative slack of the memory filter (rounding);
#: BOUND_FALLBACK: if a re-scored value is ever below its bound, bounds are scaled by the ratio seen x this.
MEM_MARGIN = 1e-6
BOUND_FALLBACK = 0.9
#: CP-SAT parameters: one worker (the speed goals are per core); full LP relaxation, no presolve and no probing
#: were fastest on these small one-hot models with a feasible hint (measured: 405B on 16,384 GPUs 0.44 -> 0.09 s,
#: Llama-3.1-8B on 8,192 GPUs 1.1 -> 0.22 s; benchmarks/bench_search.py).
CPSAT_PARAMS: dict = {"num_workers": 1, "linearization_level": 2, "cp_model_probing_level": 0,
                      "cp_model_presolve": False}
#: Sentinel for an invalid table cell (seconds or bytes); any value at or above it is excluded.
INVALID = float("inf")


@dataclass
class _Types:
    """Per-model facts by layer type (0 = dense MLP, 1 = MoE): a representative layer index, and the prefix count of
    MoE layers (``moe_prefix[i]`` = MoE layers among the first ``i``)."""

    rep: dict[int, int]
    moe_prefix: list[int]


def _layer_types(model: ModelSpec) -> _Types:
    rep: dict[int, int] = {}
    prefix = [0]
    for i in range(model.num_layers):
        t = 1 if model.is_moe_layer(i) else 0
        rep.setdefault(t, i)
        prefix.append(prefix[-1] + t)
    return _Types(rep, prefix)


@dataclass
class Tables:
    """Factorized tables over ``k = (structure, mbs, recompute, pipeline schedule)`` (see module docstring; schedule
    None is the default 1F1B / interleaved, the others' rows come from ``_schedule_rows``). Seconds and bytes."""

    keys: list[tuple[Structure, int, str, str | None]] = field(default_factory=list)  # + pipeline schedule
    A: list = field(default_factory=list)  # [k][v]   compute + bubble (s)
    P: list = field(default_factory=list)  # [k][sp][v] pipeline p2p (s)
    E: list = field(default_factory=list)  # [k][z]   dp exposed + zero3 + optimizer (s)
    W: list = field(default_factory=list)  # [k][slot][z] states + buffers + logits + reserve (bytes)
    X: list = field(default_factory=list)  # [k][slot][sp][v] activations (bytes)
    Z: list = field(default_factory=list)  # [k][sp][z] bound on pipeline + hidden-DP/ZeRO-3 terms (s), 0 if none
    O: list = field(default_factory=list)  # [k][z] optimizer + fully exposed DP (s)
    slots: int = 1

    def add(self, key: tuple, A, P, E, W, X, Z, O) -> None:
        """Append the row of ``key`` = (structure, mbs, recompute, schedule)."""
        for attr, row in zip(("keys", "A", "P", "E", "W", "X", "Z", "O"), (key, A, P, E, W, X, Z, O)):
            getattr(self, attr).append(row)

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


@lru_cache(maxsize=4096)
def _in_flight(pp: int, m: int, v: int) -> tuple[int, int, int]:
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


def build_tables(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                 space: SearchSpace = SearchSpace(), framework: str = "megatron",
                 memory_headroom: float | None = None) -> Tables:
    """Tabulate the factorized lower bounds of every structure (see the module docstring).

    Full recompute (Megatron): the re-scoring runs it at the fewest recomputed layers per chunk N that fit
    (``planner.recompute``), so its time bound charges ``min(N_lb, chunk layers)`` recomputed layers per chunk,
    where ``N_lb`` >= 1 is the smallest N whose memory lower bound (this table's terms with N layers keeping only
    their input and the others at least the smallest per-layer activations) fits ``memory_headroom``'s limit
    (N_lb = 1 when no headroom is given).

    Step-time bound = pipeline bound ``P[k, sp, v]`` + optimizer step ``E[k, z]``; memory bound of stage slot j =
    ``W[k, j, z] + X[k, j, sp, v]``. Both are <= the scalar model's values (``planner.evaluation.evaluate``), which is
    what makes the re-scoring loop exact.
    """
    from cost_models import memory as mm
    from cost_models import step_time as stm
    ty = _layer_types(model)
    dom = cluster.node.nvlink_domain_size
    s, h, L = job.seq_length, model.hidden_size, model.num_layers
    reserve = float(cluster.calibration.memory_reserve_bytes)
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s
    try:
        hbm = stm._hbm(cluster)
        rate = stm._gemm_rate(cluster, job.precision)
    except Exception:  # pragma: no cover
        rate = math.inf
    el = 1.0 if job.precision == "fp8" else float(BYTES_16BIT)
    ce_passes = float(getattr(stm, "CE_PASSES", 0.0))
    # the memory model's framework is the job's (``TrainingJob.framework``); the planner's framework too, in case
    # the evaluation passes it: the bound takes the smaller of the two
    known = set(getattr(mm, "FRAMEWORKS", ("megatron",)))
    fws = sorted({getattr(job, "framework", None) or "megatron", framework} & known) or ["megatron"]
    lbpe = getattr(mm, "LOGITS_BYTES_PER_ELEMENT", {})
    logit_bpe = min([lbpe.get(fw, 0) for fw in getattr(mm, "FRAMEWORKS", ("megatron",)) if fw in fws] or [0])
    # fp32 training: fp32 model states without a master copy (memory.state_bytes), 4-byte Megatron logits
    fp32 = job.precision == "fp32"
    if fp32:
        logit_bpe = min(logit_bpe, 4)
    adam = float(getattr(stm, "ADAM_HBM_BYTES_PER_PARAM", 0.0))
    T = Tables()
    for st in structures(model, cluster, job, num_gpus, space, framework):
        mbss = micro_batch_options(st, job, space)
        zs = zero_options(st, framework, space, model.moe is not None)
        sps = sp_options(st, job, framework, space)
        if not mbss or not zs or not sps:
            continue
        par0 = to_parallel(st, 1, 1, 0, False, "none")
        tp, cp, pp = st.tp, st.cp, st.pp
        # the framework's other pipeline schedules (space.SEARCH_SCHEDULES) need rows of their own (_schedule_rows)
        other_sched = (framework == "megatron" and model.moe is not None and st.ep > 1) or (
            framework == "torchtitan" and pp > 1 and st.first is None and L % (2 * pp) == 0)
        vocab = model.padded_vocab_size(tp)
        ranges = stage_layer_ranges(L, par0)
        # distinct stages: (n layers, n moe layers, first?, last?) -> first stage index with that signature; the
        # lowest index of a signature holds the most in-flight micro-batches, so it bounds the others' memory
        sig_of, groups = [], []  # groups: (stage, n_dense, n_moe, range)
        seen_sig: dict[tuple, int] = {}
        for i, r in enumerate(ranges):
            nm = ty.moe_prefix[r.stop] - ty.moe_prefix[r.start]
            sig = (len(r), nm, i == 0, i == pp - 1)
            if sig not in seen_sig:
                seen_sig[sig] = len(groups)
                groups.append((i, len(r) - nm, nm, r))
            sig_of.append(seen_sig[sig])
        T.slots = max(T.slots, len(groups))
        sparams = [stage_params(model, par0, stage, r, vocab) for stage, _, _, r in groups]
        shard, edp = st.dp * cp, par0.expert_dp
        states = []  # [slot][z]: min over frameworks of weights + gradients + optimizer (memory.model_state_terms)
        for sp_ in sparams:
            row = []
            for z in ZEROS:
                best = math.inf
                for fw in fws:
                    try:
                        a = (sum(model_state_terms(fw, z, sp_.dense, shard, fp32=fp32))
                             + sum(model_state_terms(fw, z, sp_.expert, edp, fp32=fp32)))
                    except Exception:  # pragma: no cover
                        a = 0.0
                    best = min(best, a)
                row.append(best)
            states.append(row)
        # optimizer step (step_time: memory-bound Adam over the most loaded stage's local parameters)
        smax = max(sparams, key=lambda x: x.total)
        opt = {zc: adam * (smax.dense / (shard if zc else 1) + smax.expert / (edp if zc else 1)) / hbm
               for zc in (0, 1)}
        groups_pl = {d: group_placement(d, par0, dom) for d in ("tp", "cp", "ep", "dp", "pp")}
        # data-parallel gradient reduction (+ parameter all-gather under ZeRO 1/2), fully exposed in Megatron-LM
        # without --overlap-grad-reduce (the step model's default for framework megatron); bounded by 0 for the
        # frameworks that overlap it and for ZeRO-3 (per-micro-batch gathers hidden behind compute)
        cp_g, dp_g = groups_pl["cp"], groups_pl["dp"]
        dpg = GroupPlacement(shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
            if shard > 1 else GroupPlacement(1, 1)
        ag3 = rs3 = 0.0
        if shard > 1:
            rs3 = collective_time("reduce_scatter", BYTES_FP32 * smax.dense, dpg, cluster)
            ag3 = collective_time("all_gather", BYTES_16BIT * smax.dense, dpg, cluster)
        if edp > 1 and smax.expert > 0:
            eg = GroupPlacement(edp, max(1, min(edp, dom // max(1, par0.expert_tp * st.ep))))
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
                eg = GroupPlacement(edp, max(1, min(edp, dom // max(1, par0.expert_tp * st.ep))))
                rs_t[zc] += collective_time("reduce_scatter" if zc else "all_reduce", BYTES_FP32 * smax.expert, eg,
                                            cluster)
                if zc:
                    ag_t[zc] += collective_time("all_gather", BYTES_16BIT * smax.expert, eg, cluster)
        # exposed in full without overlap (Megatron-LM's default; DeepSpeed's pipeline engine); otherwise only what
        # the busiest rank's backward / forward cannot hide (bounded with the compute upper bounds below)
        dp_full = framework == "megatron" or (framework == "deepspeed" and pp > 1)
        # full recompute re-scores at the fewest recomputed layers per chunk that fit (planner.recompute): its time
        # bound charges one recomputed layer per chunk (N >= 1), its memory bound every layer recomputed (least)
        partial_rc = framework.split("_")[0] in PARTIAL_RECOMPUTE_FRAMEWORKS
        mem_lim = (cluster.gpu.memory_bytes * (1 - memory_headroom) * (1 + MEM_MARGIN)
                   if memory_headroom is not None else None)
        run_cache: dict[int, list] = {}

        def runs_of(v, ranges=ranges, sig_of=sig_of, pp=pp, run_cache=run_cache):
            """Ranks grouped in runs of equal (signature, first-chunk dense/MoE counts); rank 0 and the last rank
            are always runs of their own: (group, first-chunk dense, first-chunk MoE, ranks, first rank)."""
            if v not in run_cache:
                out: list[list] = []
                for r in range(pp):
                    c0 = ranges[r][: len(ranges[r]) // v]
                    nm0 = ty.moe_prefix[c0.stop] - ty.moe_prefix[c0.start] if len(c0) else 0
                    key = (sig_of[r], len(c0) - nm0, nm0)
                    if out and tuple(out[-1][:3]) == key and r not in (1, pp - 1):
                        out[-1][3] += 1
                    else:
                        out.append([*key, 1, r])
                run_cache[v] = [tuple(x) for x in out]
            return run_cache[v]

        for mbs in mbss:
            m = job.global_batch_size // (mbs * st.dp)
            vpps = vpp_options(model, st, m, framework, space)
            tok = mbs * s / cp
            lg = stm.gemm_time(tok, h, vocab / tp, rate, hbm, el) if hasattr(stm, "gemm_time") else 0.0
            ce = ce_passes * tok * vocab / tp / hbm
            emb = 2 * BYTES_16BIT * tok * h / hbm
            logits_b = tok * vocab / tp * logit_bpe
            inflight = {}
            for v in vpps:
                pv = to_parallel(st, mbs, v, 0, False, "none")
                inflight[v] = [in_flight_microbatches(pv, stage, m) for stage, _, _, _ in groups]
            lay = {}   # sp -> type -> (f, b, rc_sel, rc_full)
            slot_fb: dict[tuple, list] = {}  # (sp, v) -> per slot (f, b, MoE layers) of one micro-batch
            fb_min = {}  # (sp, rc) -> smallest per-rank forward and backward lower bounds per micro-batch
            acts = {}  # (sp, rc) -> (type -> min bytes, layer input bytes)
            for sp in sps:
                pr = to_parallel(st, mbs, 1, 0, sp, "none")
                lay[sp] = {t: _layer_lb(model, cluster, job, pr, i, groups_pl, True) for t, i in ty.rep.items()}
                for rc in space.recompute:
                    prc = to_parallel(st, mbs, 1, 0, sp, rc)
                    per_t = {}
                    for t, i in ty.rep.items():
                        vals = []
                        for fw in fws:
                            try:
                                vals.append(activation_bytes_per_layer(model, job, prc, i, fw))
                            except TypeError:  # pragma: no cover - older signature
                                vals.append(activation_bytes_per_layer(model, job, prc, i))
                        per_t[t] = min(vals)
                    acts[(sp, rc)] = (per_t, layer_input_bytes(model, job, prc))
            for rc in space.recompute:
                A = [INVALID] * V
                for v in vpps:
                    A[v - 1] = 0.0
                P = [[INVALID] * V for _ in range(2)]
                for sp in sps:
                    lt = lay[sp]
                    # activation send to the next stage (step_time: BYTES_16BIT x tokens x h, / tp under SP): the
                    # simulation adds it to every cross-stage dependency, so the first micro-batch's forward into
                    # rank r and the last one's backward out of it each pay it once per preceding rank
                    p2p = collective_time("p2p", BYTES_16BIT * tok * h / (tp if sp else 1), groups_pl["pp"],
                                          cluster) if pp > 1 else 0.0

                    def fb(nd, nm, nch, nlb):
                        # nch: model chunks in these layers. Full recompute with a derivable N
                        # (planner.recompute) re-runs at least min(nlb, chunk layers) layers per chunk, every layer
                        # otherwise
                        f = b = 0.0
                        full_min = math.inf
                        for t, n in ((0, nd), (1, nm)):
                            if n and t in lt:
                                lf, lb, sel, full = lt[t]
                                f += n * lf
                                b += n * (lb + (sel if rc == "selective" else
                                                full if rc == "full" and not partial_rc else 0.0))
                                full_min = min(full_min, full)
                        if rc == "full" and partial_rc and full_min < math.inf:
                            b += nch * min(nlb, (nd + nm) // nch) * full_min
                        return f, b
                    memo: dict[tuple, tuple[float, float]] = {}

                    def fbm(nd, nm, nch=1, nlb=1):
                        key = (nd, nm, nch, nlb)
                        if key not in memo:
                            memo[key] = fb(nd, nm, nch, nlb)
                        return memo[key]

                    def min_rc_layers(v, sp=sp):
                        # smallest N whose memory lower bound fits on every stage slot j (per slot:
                        # w + (lin N + (L - N) a_min + token ids) x in-flight + largest layer <= limit)
                        if rc != "full" or not partial_rc or mem_lim is None:
                            return 1
                        per_t, lin = acts[(sp, rc)]
                        need = 1
                        for j, (stage, nd, nm, rg) in enumerate(groups):
                            present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
                            if not present:
                                continue
                            a_min, big = min(present), max(present)
                            n_l = nd + nm
                            w = min(states[j][z] for z in zs) + reserve + (logits_b if stage == pp - 1 else 0.0)
                            infl = inflight[v][j]
                            tid = TOKEN_ID_BYTES * tok if stage == 0 else 0.0
                            over = w + (n_l * a_min + tid) * infl + big - mem_lim
                            if over <= 0 or a_min <= lin or infl <= 0:
                                continue
                            need = max(need, min(n_l, math.ceil(over / ((a_min - lin) * infl) - 1e-9)))
                        return need
                    fmin = bmin = math.inf
                    for v in vpps:
                        nlb = min_rc_layers(v)
                        # ranks in runs of equal (stage signature, first-chunk mix): the bound pre_r + m (f_r + b_r)
                        # grows along a run, so its last rank is the run's maximum
                        best = 0.0
                        pre = rt = 0.0
                        for g, nd0, nm0, cnt, r0 in runs_of(v):
                            stage, nd, nm, rg = groups[g]
                            f, b = fbm(nd, nm, v, nlb)
                            if r0 + cnt - 1 == pp - 1:
                                f += lg + ce
                                b += 2 * lg + ce
                            if r0 == 0:
                                f += emb
                                b += 2 * emb
                            fmin, bmin = min(fmin, f), min(bmin, b)
                            f0, b0 = fbm(nd0, nm0, 1, nlb)
                            if r0 == 0:
                                f0 += emb
                                b0 += 2 * emb
                            best = max(best, pre + (cnt - 1) * (f0 + b0 + 2 * p2p) + m * (f + b))
                            pre += cnt * (f0 + b0 + 2 * p2p)
                            rt += cnt * (f + b)
                        if pp > 1:  # at most K micro-batches in flight on rank 0, each needing a round trip
                            kk, m_eff, hops = _in_flight(pp, m, v)
                            best = max(best, m_eff / kk * (rt + 2 * hops * p2p))
                        P[int(sp)][v - 1] = best
                        # per slot forward / backward bounds of one micro-batch (no embedding / output layer),
                        # for the rows of the other pipeline schedules (_schedule_rows)
                        if other_sched:
                            slot_fb[(sp, v)] = [(*fbm(nd, nm, v, nlb), nm) for _, nd, nm, _ in groups]
                    fb_min[sp] = (fmin, bmin)
                # DP / ZeRO-3 terms. The step model adds to the pipeline makespan (>= m x (f_B + b_B) on the busiest
                # rank B) the gathers and reductions that rank B's forward f_B / backward b_B cannot hide:
                #   ZeRO-3: m x (max(0, ag - f_B) + max(0, ag + rs - b_B))
                #       =>  step >= m (max(f_B, ag) + max(b_B, ag + rs))
                #   overlapped DP: max(0, rs - b_B) + max(0, ag - f_B)
                #       =>  step >= (m-1)(f_B + b_B) + max(f_B, ag) + max(b_B, rs)
                # with f_B, b_B >= the smallest per-rank lower bounds. E adds what exceeds the largest P of this k, so
                # P + E stays below the step time for every (sp, vpp).
                pmax = max((x for row in P for x in row if x != INVALID), default=0.0)
                E = [INVALID] * 4
                O = [INVALID] * 4
                Zk = [[0.0] * 4 for _ in range(2)]
                for z in zs:
                    zc = 1 if z else 0
                    if z == 2 and framework == "megatron":
                        # Megatron-FSDP optim_grads: a reduce-scatter in every micro-batch's backward, layer by
                        # layer, + the exposed weight gather. step_time.fsdp_exposed_s(0, rs, c, n) >= rs / n +
                        # (n - 1) / n x OVERLAP_COMPUTE_SLOWDOWN x rs for any compute c, n = the busiest rank's
                        # layers, between the fewest and the most layers per rank
                        n_hi = max(1, max(len(r) for r in ranges))
                        n_lo = max(1, min(len(r) for r in ranges))
                        rs_mb = rs_t[zc] * (1 / n_hi + (1 - 1 / n_lo) * stm.OVERLAP_COMPUTE_SLOWDOWN)
                        O[z] = opt[zc] + ag_t[zc] + m * rs_mb
                    else:
                        O[z] = opt[zc] + (rs_t[zc] + ag_t[zc] if z < 3 and dp_full else 0.0)
                    zz = {}
                    for sp in sps:
                        f0, b0 = fb_min[sp]
                        if z < 3 and not dp_full and shard * edp > 1:
                            zz[sp] = (m - 1) * (f0 + b0) + max(f0, ag_t[zc]) + max(b0, rs_t[zc])
                        elif z >= 3 and (shard > 1 or edp > 1):
                            zz[sp] = m * (max(f0, ag3) + max(b0, ag3 + rs3))
                        else:
                            zz[sp] = 0.0
                        Zk[int(sp)][z] = zz[sp]
                    E[z] = O[z] + max(0.0, min(zz.values()) - pmax)
                Wk, Xk = [], []
                for j, (stage, nd, nm, rg) in enumerate(groups):
                    w = [states[j][z] + reserve + (logits_b if stage == pp - 1 else 0.0) for z in ZEROS]
                    Wk.append(w)
                    xs = [[0.0] * V for _ in range(2)]
                    for sp in sps:
                        per_t, lin = acts[(sp, rc)]
                        present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
                        biggest = max(present, default=0.0)
                        if rc == "full":
                            stored = lin * (nd + nm)
                        else:
                            stored = nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
                        if stage == 0:
                            stored += TOKEN_ID_BYTES * tok
                        for v in vpps:
                            xs[int(sp)][v - 1] = stored * inflight[v][j] + biggest
                    Xk.append(xs)
                # a --pipeline-schedule pin may exclude the default schedule (1f1b / interleaved) at some vpp
                for v in vpps:
                    if None not in schedule_options(model, st, m, v, zs[0], rc, framework, space):
                        A[v - 1] = INVALID
                if any(a != INVALID for a in A):
                    T.add((st, mbs, rc, None), A, P, E, Wk, Xk, Zk, O)
                if other_sched:
                    _schedule_rows(T, model, job, st, mbs, m, rc, vpps, zs, sps, groups, slot_fb, acts, O, fws, shard,
                                   edp, vocab, reserve, logit_bpe, tok, (lg + ce, 2 * lg + ce), emb, framework, space,
                                   lambda: _ep_s(model, cluster, job, to_parallel(st, mbs, 1, 0, sps[0], "none"),
                                                 ty.rep.get(1), groups_pl),
                                   lambda par: [in_flight_microbatches(par, stage, m) for stage, _, _, _ in groups])
    return T


def _ep_s(model, cluster, job, par, layer, groups) -> float:
    """Seconds of one MoE layer's EP all-to-all (dispatch + combine) in forward, from ``cost_models.step_time``
    (``_layer_cost``); 0 without MoE layers or expert parallelism."""
    if layer is None or par.ep <= 1:
        return 0.0
    try:
        from cost_models import step_time as stm
        return float(stm._layer_cost(model, cluster, job, par, layer, "megatron", groups).ep)
    except Exception:  # pragma: no cover - depends on another module's private API
        return 0.0


def _schedule_rows(T: Tables, model, job, st, mbs, m, rc, vpps, zs, sps, groups, slot_fb, acts, O, fws, shard, edp,
                   vocab, reserve, logit_bpe, tok, head_fb_s, emb_s, framework, space, ep_of, inflight_of) -> None:
    """Table rows ``k = (structure, mbs, recompute, schedule)`` of the framework's other pipeline schedules
    (``space.schedule_options``: combined 1F1B, ZB-V, DualPipeV). Lower bounds, schedule by schedule:

    ``ep_of()``: one MoE layer's EP all-to-all seconds (forward; computed only when a pairing schedule is possible).
    ``head_fb_s``: the output layer's (forward, backward) seconds, as the default rows charge them (the backward
    runs the logits GEMM twice and the fused cross-entropy once).

    * time: each rank is busy at least ``m`` x its chunks' forward + backward, less the EP all-to-all an
      overlapped pair hides (``pipeline_ops.fb_seconds`` >= F + B - hide_F - hide_B; hide = (1 - EP_OVERLAP_EXPOSED)
      of each MoE layer's all-to-all, forward and backward), with the embedding and the output layer on the ranks
      the schedule puts them (``layout.holds_embedding`` / ``holds_output``); no start-up term and no DP tightening
      (``E = O``, ``Z = 0``): weaker than the default rows', still below the scalar model;
    * memory: the default rows' terms with the schedule's own placement (a V puts the embedding and the output
      layer's weights and logits on rank 0) and in-flight micro-batches (its op order).
    """
    from cost_models import step_time as stm
    from cost_models.layout import holds_embedding, holds_output
    from cost_models.pipeline import PAIRING_SCHEDULES

    for sched in SEARCH_SCHEDULES.get(framework, ()):
        vz = {(v, z) for v in vpps for z in zs
              if sched in schedule_options(model, st, m, v, z, rc, framework, space)}
        if not vz:
            continue
        vs, zz = sorted({v for v, _ in vz}), sorted({z for _, z in vz})
        pars = {v: to_parallel(st, mbs, v, 0, False, rc, sched) for v in vs}
        pv = pars[vs[0]]
        hide = (1.0 - float(getattr(stm, "EP_OVERLAP_EXPOSED", 1.0))) if sched in PAIRING_SCHEDULES else 0.0
        ep_s = ep_of() if hide else 0.0
        A = [INVALID] * V
        P = [[INVALID] * V for _ in range(2)]
        for v in vs:
            A[v - 1] = 0.0
            for sp in sps:
                best = 0.0
                for j, (stage, nd, nm, rg) in enumerate(groups):
                    f, b, n_moe = slot_fb[(sp, v)][j]
                    e, o = holds_embedding(pv, stage), holds_output(pv, stage)
                    # the output layer: logits GEMM + cross-entropy forward, 2 x the GEMM + the cross-entropy backward
                    f += (emb_s if e else 0.0) + (head_fb_s[0] if o else 0.0)
                    b += (2 * emb_s if e else 0.0) + (head_fb_s[1] if o else 0.0)
                    best = max(best, m * (f + b - 2 * hide * n_moe * ep_s))
                P[int(sp)][v - 1] = best
        E = [O[z] if z in zz else INVALID for z in ZEROS]
        sparams = [stage_params(model, pv, stage, r, vocab) for stage, _, _, r in groups]
        Wk, Xk = [], []
        for j, (stage, nd, nm, rg) in enumerate(groups):
            fp32 = job.precision == "fp32"  # fp32 states (memory.state_bytes), as build_tables'
            states = [min(sum(model_state_terms(fw, z, sparams[j].dense, shard, fp32=fp32))
                          + sum(model_state_terms(fw, z, sparams[j].expert, edp, fp32=fp32)) for fw in fws)
                      for z in ZEROS]
            logits = tok * vocab / pv.tp * logit_bpe if holds_output(pv, stage) else 0.0
            Wk.append([states[z] + reserve + logits for z in ZEROS])
            xs = [[0.0] * V for _ in range(2)]
            for sp in sps:
                per_t, lin = acts[(sp, rc)]
                present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
                stored = lin * (nd + nm) if rc == "full" else nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
                if holds_embedding(pv, stage):
                    stored += TOKEN_ID_BYTES * tok
                for v in vs:
                    xs[int(sp)][v - 1] = stored * inflight_of(pars[v])[j] + max(present, default=0.0)
            Xk.append(xs)
        T.add((st, mbs, rc, sched), A, P, E, Wk, Xk, [[0.0] * 4 for _ in range(2)], O)


@dataclass
class SolveResult:
    """Top plans (scalar-evaluated, best first), the table optimum and bookkeeping."""

    plans: list[Evaluation]
    num_candidates: int
    num_feasible: int
    num_rescored: int
    solver_status: str
    table_best_step_s: float | None
    nearest_infeasible: list[Evaluation] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    num_feasible_exact: bool = False


def _import_cp_model():
    """``ortools.sat.python.cp_model`` without loading pandas (~0.3 s of start-up; the CLI's speed goal).

    cp_model imports pandas only to annotate and type-check its pandas-based helpers (``pd.Index``, ``pd.Series``;
    OR-Tools 9.15), which the solver never calls. If pandas is not loaded yet, a stub module with those two names
    stands in during the import and is removed right after, so a later ``import pandas`` gets the real package.
    """
    import sys
    import types
    if "pandas" in sys.modules or "ortools.sat.python.cp_model" in sys.modules:
        from ortools.sat.python import cp_model
        return cp_model
    stub = types.ModuleType("pandas")
    stub.Index = type("Index", (), {})
    stub.Series = type("Series", (), {})
    sys.modules["pandas"] = stub
    try:
        from ortools.sat.python import cp_model
    finally:
        if sys.modules.get("pandas") is stub:
            del sys.modules["pandas"]
    return cp_model


def _cpsat_optimum(A, P, E, W, X, valid_mem_limit: float, time_limit_s: float = 10.0, hint=None, fits=None):
    """CP-SAT: choose (k, vpp, sp, zero) minimising A + P + E subject to every slot's W + X <= limit.

    Returns (status name, optimum in seconds or None, chosen indices or None). Integer units: seconds are
    scaled by ``scale`` so the largest finite table value is 1e6 (relative rounding 1e-6 of the largest; the
    result is only a proposal, re-scored by the scalar model); bytes are rounded to MiB.
    """
    cp_model = _import_cp_model()

    n, J = W.shape[0], W.shape[1]
    fin = np.concatenate([A[np.isfinite(A)], P[np.isfinite(P)], E[np.isfinite(E)]])
    top = float(fin.max()) if fin.size else 1.0
    scale = 1e6 / max(top, 1e-30)
    big = 4 * 10**6

    def q(arr):
        a = np.where(np.isfinite(arr), np.round(arr * scale), big)
        return [int(x) for x in a.ravel()]

    mdl = cp_model.CpModel()
    qa, qp, qe = q(A), q(P), q(E)
    # one boolean per valid cell of each factor table, linked through the one-hot choice of k, vpp, sp, zero
    xk = [mdl.NewBoolVar(f"k{i}") for i in range(n)]
    yv = [mdl.NewBoolVar(f"v{i}") for i in range(V)]
    ys = [mdl.NewBoolVar(f"s{i}") for i in range(2)]
    yz = [mdl.NewBoolVar(f"z{i}") for i in range(4)]
    for grp in (xk, yv, ys, yz):
        mdl.AddExactlyOne(grp)
    # cells that can appear in a solution: some completion of them fits in memory (``fits``: (k, sp, v, z))
    if fits is None:
        fits = np.ones((n, 2, V, 4), dtype=bool)
    fa, fp, fe = fits.any(axis=(1, 3)), fits.any(axis=3), fits.any(axis=(1, 2))
    ua, up, ue = {}, {}, {}
    for i in range(n):
        for vi in range(V):
            if qa[i * V + vi] < big and fa[i, vi]:
                ua[i, vi] = mdl.NewBoolVar("")
            for si in range(2):
                if qp[(i * 2 + si) * V + vi] < big and qa[i * V + vi] < big and fp[i, si, vi]:
                    up[i, si, vi] = mdl.NewBoolVar("")
        for zi in range(4):
            if qe[i * 4 + zi] < big and fe[i, zi]:
                ue[i, zi] = mdl.NewBoolVar("")

    def link(cells, dims):
        # marginal consistency: for every dimension and value, the cells with that value sum to its choice
        # (a tight LP relaxation; each cell also implies its coordinates)
        mdl.AddExactlyOne(cells.values())
        for d, var in enumerate(dims):
            by: dict[int, list] = {}
            for key, b in cells.items():
                by.setdefault(key[d], []).append(b)
            for val, lit in enumerate(var):
                mdl.Add(sum(by.get(val, [])) == lit)
    link(ua, (xk, yv))
    link(up, (xk, ys, yv))
    link(ue, (xk, yz))
    obj = (sum(qa[i * V + vi] * b for (i, vi), b in ua.items())
           + sum(qp[(i * 2 + si) * V + vi] * b for (i, si, vi), b in up.items())
           + sum(qe[i * 4 + zi] * b for (i, zi), b in ue.items()))
    lim = int(math.floor(valid_mem_limit / MIB)) + 2  # MiB, 2 MiB of rounding slack; the scalar check decides
    for j in range(J):
        mdl.Add(sum(int(round(W[i, j, zi] / MIB)) * b for (i, zi), b in ue.items())
                + sum(int(round(X[i, j, si, vi] / MIB)) * b for (i, si, vi), b in up.items()) <= lim)
    mdl.Minimize(obj)
    if hint is not None:  # a feasible start (the best cell of the same tables); CP-SAT proves or improves it
        hk, hsp, hv, hz = hint
        for grp, val in ((xk, hk), (ys, hsp), (yv, hv), (yz, hz)):
            for i, b in enumerate(grp):
                mdl.AddHint(b, i == val)
        for cells, key in ((ua, (hk, hv)), (up, (hk, hsp, hv)), (ue, (hk, hz))):
            for kk, b in cells.items():
                mdl.AddHint(b, kk == key)
    solver = cp_model.CpSolver()
    for k, v in CPSAT_PARAMS.items():
        setattr(solver.parameters, k, v)
    solver.parameters.max_time_in_seconds = time_limit_s
    st = solver.Solve(mdl)
    name = solver.StatusName(st)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return name, None, None
    pick = lambda grp: next(i for i, b in enumerate(grp) if solver.Value(b))  # noqa: E731
    return name, solver.ObjectiveValue() / scale, (pick(xk), pick(yv), pick(ys), pick(yz))


def solve(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, top_k: int = 5,
          space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
          framework: str = "megatron", convention: FlopsConvention = "megatron",
          objective: str = "throughput", within: float = 0.05) -> SolveResult:
    """Best ``top_k`` plans by the scalar model; CP-SAT finds the table optimum (see module docstring).

    ``objective``: ``throughput`` (default) or ``headroom`` (most memory headroom among plans within
    ``within`` of the best step time).
    """
    from .search import rank_key

    import time
    tm: dict[str, float] = {}
    t0 = time.perf_counter()
    T = build_tables(model, cluster, job, num_gpus, space, framework, memory_headroom)
    if not T.keys:
        return SolveResult([], 0, 0, 0, "NO_CANDIDATES", None)
    A, P, E, W, X = T.arrays()
    limit = cluster.gpu.memory_bytes * (1 - memory_headroom)
    # the full (k, sp, v, z) grid of table values: step seconds and per-slot memory (bytes)
    step = A[:, None, :, None] + P[:, :, :, None] + E[:, None, None, :]          # (k, sp, v, z)
    mem = W[:, :, None, None, :] + X[:, :, :, :, None]                              # (k, j, sp, v, z)
    peak = mem.max(axis=1)                                                          # (k, sp, v, z)
    valid = np.isfinite(step)
    tight = np.where(valid, T.tight(A, P), np.inf)
    n_cand = int(valid.sum())
    fits = valid & (peak <= limit * (1 + MEM_MARGIN))
    n_fit = int(fits.sum())
    tm["tables"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hint = None
    if n_fit:
        hint = tuple(int(x) for x in np.unravel_index(np.argmin(np.where(fits, step, np.inf)), step.shape))
    status, opt, _ = (_cpsat_optimum(A, P, E, W, X, limit * (1 + MEM_MARGIN), hint=hint, fits=fits) if n_fit
                      else ("INFEASIBLE", None, None))
    tm["cpsat"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if opt is None or n_fit == 0:
        near = _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, memory_headroom, framework,
                        convention)
        tm["rescore"] = time.perf_counter() - t0
        return SolveResult([], n_cand, 0, 0, status, None, near, tm)
    # Disposal: re-score candidates in increasing order of their step-time lower bound until the next bound
    # exceeds the K-th best scalar step time (``headroom``: the best x (1 + within)). The tables are lower bounds
    # of the scalar model, so this returns exactly the enumerator's top K. Should a re-scored value ever fall below
    # its bound (the cost models changed under the tables), the bounds are scaled down by the worst ratio seen
    # x BOUND_FALLBACK and the loop continues, and the memory filter is widened the same way.
    mem_margin = MEM_MARGIN
    # a full-recompute plan whose no-recompute twin fits with no higher peak is slower and no smaller: not listed
    drop_dominated = "none" in space.recompute
    seen: dict[tuple, Evaluation] = {}
    corr = 1.0
    while True:
        cand = valid & (peak <= limit * (1 + mem_margin))
        idx = np.argwhere(cand)
        prox = tight[cand]
        order = np.argsort(prox, kind="stable")
        feas: list[Evaluation] = []
        kth: list[float] = []  # max-heap (negated) of the top_k smallest scalar step times of ``feas``
        best_step = math.inf
        mem_ratio_lo = math.inf
        pos = 0
        restart = exhausted = False
        while pos < len(order):
            o = order[pos]
            pos += 1
            bound = float(prox[o]) * corr * (1 - 1e-9)
            if objective == "headroom" and feas:
                # nothing beyond the best x (1 + within) can enter, however many plans are in the band
                if bound > best_step * (1 + within):
                    break
            elif len(feas) >= top_k:
                if bound > -kth[0]:  # the K-th best so far (sorting feas here made re-scoring quadratic)
                    break
            ki, spi, vi, zi = (int(x) for x in idx[o])
            key = (ki, spi, vi, zi)
            ev = seen.get(key)
            if ev is None:
                st, mbs, rc, sched = T.keys[ki]
                par = to_parallel(st, mbs, vi + 1, zi, bool(spi), rc, sched)
                par = with_fewest_recomputed_layers(model, cluster, job, par, framework, memory_headroom)
                ev = evaluate(model, cluster, job, par, num_gpus, memory_headroom, framework, convention)
                seen[key] = ev
            if ev.step is not None and prox[o] > 0:
                r = ev.step.step_s / float(prox[o])
                if r * (1 + 1e-9) < corr:
                    corr = r * BOUND_FALLBACK
                    restart = True
            if ev.memory is not None and peak[ki, spi, vi, zi] > 0:
                mem_ratio_lo = min(mem_ratio_lo, ev.memory.peak_bytes / peak[ki, spi, vi, zi])
            if ev.feasible and not (drop_dominated and dominated_by_no_recompute(
                    model, cluster, job, ev.parallel, ev.memory.peak_bytes, memory_headroom, framework)):
                feas.append(ev)
                heapq.heappush(kth, -ev.step.step_s)
                best_step = min(best_step, ev.step.step_s)
                if len(kth) > top_k:
                    heapq.heappop(kth)
            if restart:
                break
        else:
            exhausted = True  # every candidate re-scored
        if restart:
            continue
        # the memory filter is safe while no re-scored candidate's scalar memory fell below its bound
        if mem_ratio_lo * (1 + mem_margin) >= 1 - 1e-9 or mem_margin >= 4:
            break
        mem_margin = max(mem_margin * 2, 1 / (mem_ratio_lo * BOUND_FALLBACK) - 1)
    if exhausted:
        n_fit = len(feas)  # every candidate was re-scored: the exact count (else the memory-bound count, an upper bound)
    if objective == "headroom" and feas:
        best = min(e.step.step_s for e in feas)
        feas = [e for e in feas if e.step.step_s <= best * (1 + within)]
        feas.sort(key=lambda e: (round(e.memory.peak_bytes), rank_key(e)))
    else:
        feas.sort(key=rank_key)
    near = [] if feas else _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, memory_headroom,
                                    framework, convention)
    tm["rescore"] = time.perf_counter() - t0
    return SolveResult(feas[:top_k], n_cand, n_fit, len(seen), status, opt, near, tm, exhausted)


def _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, headroom, framework, convention,
             n: int = 3, max_exact: int = 20000) -> list[Evaluation]:
    """The ``n`` valid configurations with the smallest memory excess, ties by ``search.config_key``: the
    enumerator's answer. Candidates are taken in order of their memory lower bound (``peak``) and estimated
    exactly until the bound exceeds the n-th smallest exact peak (at most ``max_exact`` estimates)."""
    from .search import config_key
    if not valid.any():
        return []
    lb = np.where(valid, peak, np.inf)
    order = np.argsort(lb, axis=None, kind="stable")
    found: list[tuple[float, tuple, ParallelConfig]] = []
    keys: set = set()
    for count, f in enumerate(order):
        bound = float(lb.flat[f])
        if not math.isfinite(bound) or count >= max_exact:
            break
        if len(found) >= n and bound / (1 + MEM_MARGIN) > found[n - 1][0] + limit:
            break
        ki, spi, vi, zi = np.unravel_index(f, lb.shape)
        st, mbs, rc, sched = T.keys[ki]
        par = to_parallel(st, mbs, int(vi) + 1, int(zi), bool(spi), rc, sched)
        if par in keys:
            continue
        keys.add(par)
        found.append((estimate_memory(model, cluster, job, par).peak_bytes - limit, config_key(par), par))
        found.sort(key=lambda x: (x[0], x[1]))
        del found[n:]
    return [evaluate(model, cluster, job, par, num_gpus, headroom, framework, convention) for _, _, par in found]
