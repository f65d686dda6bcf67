"""CP-SAT search over the whole space: the solver proposes, the scalar cost model disposes.

How it works (DESIGN.md "The solver proposes, the scalar model disposes"):

1. **Structures** (``planner.space.structures``): every (tp, pp, cp, dp, ep, layer split) with exact products
   and the divisibility rules. A few hundred at most, even at a million GPUs.
2. **Factorized cost tables**, built per structure from the scalar cost models' own functions
   (``cost_models.memory.stage_params`` terms, ``activation_bytes_per_layer``, ``in_flight_microbatches``,
   ``cost_models.comm.collective_time``, ``cost_models.pipeline.bubble_ratio``, ...) evaluated once per layer
   *type* (dense / MoE) instead of once per layer, and once per distinct pipeline stage (stages with the same
   layer mix share their terms; the one with the lowest index holds the most in-flight micro-batches). With
   ``k = (structure, micro-batch, recompute)``:

   * step seconds = ``A[k, vpp] + P[k, sp, vpp] + E[k, zero]`` where ``A`` is compute plus bubble
     (``m * t_mb * (1 + bubble_ratio)``), ``P`` the pipeline point-to-point transfers and ``E`` the exposed
     data-parallel reduction, ZeRO-3 gathers and the optimizer step (``cost_models.step_time``, term by term);
   * memory of stage slot ``j`` = ``W_j[k, zero] + X_j[k, sp, vpp]`` bytes: model states, ZeRO-3 buffers,
     logits and reserve, plus stored activations x in-flight micro-batches (``cost_models.memory``).

3. **CP-SAT** (OR-Tools) chooses ``k``, vpp, sp and zero with element constraints on these tables, every stage's
   memory <= capacity x (1 - headroom), and minimises the step time (integer units, ``UNIT`` below).
4. **Re-scoring**: every configuration whose table step time lies within the top-K band (plus a rounding
   tolerance) is re-evaluated by the scalar model (``planner.evaluate.evaluate``) and re-checked by the
   independent checker; plans are ranked by the scalar result with ``search.rank_key`` (deterministic). If a
   re-scored step time differs from its table value by more than the tolerance, the band is widened, so a
   mismatch between tables and scalar model cannot silently drop the optimum.

The enumerator (``planner.search.enumerate_plans``) is the oracle: on every space small enough to enumerate both
return the same optimum (tests/test_solver_property.py). ``ortools`` is imported only inside ``solve``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models.comm import collective_time
from cost_models.config import BYTES_16BIT, BYTES_FP32, FlopsConvention, TrainingJob
from cost_models.flops import attention_core_flops_per_token, layer_gemm_flops_per_token, logits_flops_per_token
from cost_models.layout import GroupPlacement, group_placement, stage_layer_ranges
from cost_models.memory import (GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM, TOKEN_ID_BYTES,
                                WEIGHT_BYTES_PER_PARAM, activation_bytes_per_layer, in_flight_microbatches,
                                layer_input_bytes)
from cost_models.pipeline import bubble_ratio
from cost_models.step_time import ADAM_HBM_BYTES_PER_PARAM
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluate import Evaluation, evaluate
from .space import (MAX_VPP, SearchSpace, Structure, micro_batch_options, sp_options, structures, to_parallel,
                    vpp_options, zero_options)

RECOMPUTES = ("none", "selective", "full")
ZEROS = (0, 1, 2, 3)
V = MAX_VPP
MIB = 2**20
#: The tables are a proxy of the scalar model (same terms, per layer type, closed-form pipeline bubble); these
#: margins keep the proxy conservative: candidates whose proxy memory is up to MEM_MARGIN over the limit are
#: re-scored, and re-scoring stops only when proxy step x (lowest observed scalar/proxy ratio) x STEP_SAFETY
#: exceeds the K-th best scalar step. Both are widened automatically when re-scored candidates show a larger gap.
MEM_MARGIN = 0.15
MEM_SAFETY = 0.97
STEP_SAFETY = 0.97
#: Sentinel for an invalid table cell (seconds or bytes); any value at or above it is excluded.
INVALID = float("inf")


@dataclass
class _Types:
    """Per-model facts by layer type (0 = dense MLP, 1 = MoE): a representative layer index and its params."""

    rep: dict[int, int]
    moe_prefix: list[int]
    lp: dict[int, object]
    gemm: dict[int, float]


def _layer_types(model: ModelSpec) -> _Types:
    rep: dict[int, int] = {}
    prefix = [0]
    for i in range(model.num_layers):
        t = 1 if model.is_moe_layer(i) else 0
        rep.setdefault(t, i)
        prefix.append(prefix[-1] + t)
    lp = {t: model.layer_params(i) for t, i in rep.items()}
    gemm = {t: layer_gemm_flops_per_token(model, i) for t, i in rep.items()}
    return _Types(rep, prefix, lp, gemm)


def _rates(cluster: ClusterSpec, precision: str) -> tuple[float, float]:
    """Achievable GEMM rate of ``precision`` and of the 16-bit dtype (FLOP/s): dense peak (datasheet, cluster
    spec) x the cluster's calibrated GEMM efficiency."""
    cal = cluster.calibration.gemm_efficiency
    half = "bf16" if "bf16" in cluster.gpu.peak_flops else "fp16"
    half_rate = cluster.gpu.peak_flops[half] * cal.get(half, min(cal.values()))
    prec = precision if cluster.gpu.peak_flops.get(precision) else half
    gemm = cluster.gpu.peak_flops[prec] * cal.get(prec, cal.get(half, 0.5))
    return gemm, half_rate


@dataclass
class Tables:
    """Factorized tables over ``k = (structure, mbs, recompute)`` (see module docstring). Seconds and bytes."""

    keys: list[tuple[Structure, int, str]] = field(default_factory=list)
    A: list = field(default_factory=list)  # [k][v]   compute + bubble (s)
    P: list = field(default_factory=list)  # [k][sp][v] pipeline p2p (s)
    E: list = field(default_factory=list)  # [k][z]   dp exposed + zero3 + optimizer (s)
    W: list = field(default_factory=list)  # [k][slot][z] states + buffers + logits + reserve (bytes)
    X: list = field(default_factory=list)  # [k][slot][sp][v] activations (bytes)
    slots: int = 1

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


def build_tables(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                 space: SearchSpace = SearchSpace(), framework: str = "megatron") -> Tables:
    """Tabulate the factorized cost terms of every structure (mirrors ``cost_models`` term by term)."""
    ty = _layer_types(model)
    gemm_rate, half_rate = _rates(cluster, job.precision)
    dom = cluster.node.nvlink_domain_size
    s, h, L = job.seq_length, model.hidden_size, model.num_layers
    attn_fwd = attention_core_flops_per_token(model, s, causal_halved=True)
    kv_w = (model.num_kv_heads * model.head_dim if model.mla is None
            else model.num_attention_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim))
    reserve = float(cluster.calibration.memory_reserve_bytes)
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s
    T = Tables()
    for st in structures(model, cluster, job, num_gpus, space):
        mbss = micro_batch_options(st, job, space)
        if not mbss:
            continue
        zs = zero_options(st, framework, space)
        sps = sp_options(st, job, framework, space)
        if not zs or not sps:
            continue
        par0 = to_parallel(st, 1, 1, 0, False, "none")
        tp, cp, pp = st.tp, st.cp, st.pp
        ets = st.ep * par0.expert_tp
        vocab = model.padded_vocab_size(tp)
        ranges = stage_layer_ranges(L, par0)
        # distinct stages: (n layers, n moe layers, first?, last?) -> first stage index with that signature
        groups: list[tuple[int, int, int]] = []  # (stage, n_dense, n_moe)
        seen = set()
        for i, r in enumerate(ranges):
            nm = ty.moe_prefix[r.stop] - ty.moe_prefix[r.start]
            sig = (len(r), nm, i == 0, i == pp - 1)
            if sig not in seen:
                seen.add(sig)
                groups.append((i, len(r) - nm, nm))
        T.slots = max(T.slots, len(groups))
        # parameters per GPU of each distinct stage (memory.stage_params, by layer type)
        d_t = {t: lp.tp_sharded / tp + lp.replicated for t, lp in ty.lp.items()}
        e_t = {t: lp.expert / ets for t, lp in ty.lp.items()}
        emb_table = vocab * h / tp
        sparams = []
        for stage, nd, nm in groups:
            dense = nd * d_t.get(0, 0.0) + nm * d_t.get(1, 0.0)
            expert = nd * e_t.get(0, 0.0) + nm * e_t.get(1, 0.0)
            largest = max([d_t[t] + e_t[t] for t, n in ((0, nd), (1, nm)) if n], default=0.0)
            if stage == 0:
                dense += emb_table + model.embedding_params() - model.vocab_size * h
            if stage == pp - 1:
                out = model.output_params()
                dense += out - (0 if model.tie_word_embeddings else model.vocab_size * h)
                if not model.tie_word_embeddings or pp > 1:
                    dense += emb_table
            sparams.append((dense, expert, largest))
        shard = st.dp * cp
        edp = par0.expert_dp
        # model states (+ ZeRO-3 buffers) per slot per zero stage
        states = []
        for dense, expert, largest in sparams:
            row = []
            for z in ZEROS:
                wd, we = (shard, edp) if z >= 3 else (1, 1)
                gd, ge = (shard, edp) if z >= 2 else (1, 1)
                od, oe = (shard, edp) if z >= 1 else (1, 1)
                v = (WEIGHT_BYTES_PER_PARAM * (dense / wd + expert / we) + GRAD_BYTES_PER_PARAM * (dense / gd + expert / ge)
                     + OPTIMIZER_BYTES_PER_PARAM * (dense / od + expert / oe))
                if z >= 3:
                    v += 2 * BYTES_16BIT * largest
                row.append(v)
            states.append(row)
        # data-parallel time, optimizer (step_time.estimate_step)
        tp_g = group_placement("tp", par0, dom)
        cp_g = group_placement("cp", par0, dom)
        ep_g = group_placement("ep", par0, dom)
        dp_g = group_placement("dp", par0, dom)
        pp_g = group_placement("pp", par0, dom)
        imax = max(range(len(sparams)), key=lambda i: sparams[i][0] + sparams[i][1])
        smax_d, smax_e, _ = sparams[imax]
        dp_group = GroupPlacement(shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
            if shard > 1 else GroupPlacement(1, 1)
        dp_time = {}
        for zc in (0, 1):
            t = 0.0
            if shard > 1:
                gb = BYTES_FP32 * smax_d
                if zc == 0:
                    t = collective_time("all_reduce", gb, dp_group, cluster)
                else:
                    t = collective_time("reduce_scatter", gb, dp_group, cluster)
                    t += collective_time("all_gather", BYTES_16BIT * smax_d, dp_group, cluster)
            if edp > 1 and smax_e > 0:
                eg = GroupPlacement(edp, max(1, min(edp, dom // (par0.expert_tp * st.ep))))
                t += collective_time("reduce_scatter" if zc else "all_reduce", BYTES_FP32 * smax_e, eg, cluster)
            dp_time[zc] = t
        ag3 = collective_time("all_gather", BYTES_16BIT * smax_d, dp_group, cluster) if shard > 1 else 0.0
        opt = {zc: ADAM_HBM_BYTES_PER_PARAM * (smax_d / (shard if zc else 1) + smax_e / (edp if zc else 1)) / hbm
               for zc in (0, 1)}
        L0 = max(1, len(ranges[0]))
        for mbs in mbss:
            m = job.global_batch_size // (mbs * st.dp)
            vpps = vpp_options(model, st, m, framework, space)
            tokens_mb = mbs * s
            act_bytes = BYTES_16BIT * tokens_mb * h / cp
            tp_pl = 4 * collective_time("all_reduce", act_bytes, tp_g, cluster) if tp > 1 else 0.0
            cp_pl = 0.0
            if cp > 1:
                kvb = 2 * BYTES_16BIT * tokens_mb / cp * kv_w / tp
                cp_pl = max(0.0, 3 * (cp - 1) * collective_time("p2p", kvb, cp_g, cluster)
                            - 3 * attn_fwd * tokens_mb / cp / tp / half_rate)
            a2a_t = 0.0
            if st.ep > 1 and model.moe is not None:
                a2a = BYTES_16BIT * tokens_mb / cp * model.moe.top_k * h / tp
                a2a_t = 4 * collective_time("all_to_all", a2a, ep_g, cluster)
            p2p1 = {}
            for sp in (False, True):
                p2p1[sp] = collective_time("p2p", act_bytes / (tp if sp else 1), pp_g, cluster) if pp > 1 else 0.0
            tokens_loc = s / cp * mbs
            logits_b = tokens_loc * vocab / tp * (BYTES_16BIT + BYTES_FP32)
            inflight = {}
            for v in vpps:
                pv = to_parallel(st, mbs, v, 0, False, "none")
                inflight[v] = [in_flight_microbatches(pv, stage, m) for stage, _, _ in groups]
            # activations per layer type for (sp, rc): one call per type (memory.activation_bytes_per_layer)
            acts = {}
            for sp in (False, True):
                if sp not in sps:
                    continue
                for rc in space.recompute:
                    key_rc = rc if (not job.flash_attention) else ("x" if rc != "full" else "full")
                    pr = to_parallel(st, mbs, 1, 0, sp, rc)
                    per_t = {t: activation_bytes_per_layer(model, job, pr, i) for t, i in ty.rep.items()}
                    acts[(sp, rc)] = (per_t, layer_input_bytes(model, job, pr), key_rc)
            for rc in space.recompute:
                # stage times (identical for stages of one signature)
                t_mb = 0.0
                for stage, nd, nm in groups:
                    n = nd + nm
                    gemm = (nd * ty.gemm.get(0, 0.0) + nm * ty.gemm.get(1, 0.0)) * tokens_mb / (tp * cp)
                    attn = n * attn_fwd * tokens_mb / (tp * cp)
                    if stage == pp - 1:
                        gemm += logits_flops_per_token(model, vocab) * tokens_mb / (tp * cp)
                    fwd = gemm / gemm_rate + attn / half_rate
                    rct = attn / half_rate if rc == "selective" else (fwd if rc == "full" else 0.0)
                    t = 3 * fwd + rct + n * tp_pl + n * cp_pl + (nm * a2a_t if st.ep > 1 else 0.0)
                    t_mb = max(t_mb, t)
                compute = m * t_mb
                A = [INVALID] * V
                for v in vpps:
                    sched = "interleaved" if v > 1 else "1f1b"
                    A[v - 1] = compute + bubble_ratio(sched, pp, m, v) * compute
                P = [[INVALID] * V for _ in range(2)]
                for sp in sps:
                    for v in vpps:
                        P[int(sp)][v - 1] = 2 * (pp - 1) * v * p2p1[sp] if pp > 1 else 0.0
                E = [INVALID] * 4
                for z in zs:
                    zc = 1 if z else 0
                    dpx = max(dp_time[zc] / L0, dp_time[zc] - 2 * t_mb / 3)
                    z3 = max(0.0, m * 2 * ag3 - compute) if (z >= 3 and shard > 1) else 0.0
                    E[z] = dpx + z3 + opt[zc]
                Wk, Xk = [], []
                for j, (stage, nd, nm) in enumerate(groups):
                    w = [states[j][z] + reserve + (logits_b if stage == pp - 1 else 0.0) for z in ZEROS]
                    Wk.append(w)
                    xs = [[0.0] * V for _ in range(2)]
                    for sp in sps:
                        per_t, lin, _ = acts[(sp, rc)]
                        n = nd + nm
                        if rc == "full":
                            stored = lin * n
                            working = max([per_t[t] for t, c in ((0, nd), (1, nm)) if c], default=0.0)
                        else:
                            stored = nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
                            working = 0.0
                        if stage == 0:
                            stored += TOKEN_ID_BYTES * tokens_loc + (tokens_loc * h if job.dropout else 0) / (
                                tp if sp else 1)
                        for v in vpps:
                            xs[int(sp)][v - 1] = stored * inflight[v][j] + working
                    Xk.append(xs)
                T.keys.append((st, mbs, rc))
                T.A.append(A)
                T.P.append(P)
                T.E.append(E)
                T.W.append(Wk)
                T.X.append(Xk)
    return T


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


def _cpsat_optimum(A, P, E, W, X, valid_mem_limit: float, time_limit_s: float = 10.0, hint=None, fits=None):
    """CP-SAT: choose (k, vpp, sp, zero) minimising A + P + E subject to every slot's W + X <= limit.

    Returns (status name, optimum in seconds or None, chosen indices or None). Integer units: seconds are
    scaled by ``scale`` so the largest finite table value is 1e6 (relative rounding 1e-6 of the largest; the
    result is only a proposal, re-scored by the scalar model); bytes are rounded to MiB.
    """
    from ortools.sat.python import cp_model

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
    solver.parameters.num_workers = 1
    solver.parameters.linearization_level = 2  # full LP relaxation: fastest on these one-hot models (measured)
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
    T = build_tables(model, cluster, job, num_gpus, space, framework)
    if not T.keys:
        return SolveResult([], 0, 0, 0, "NO_CANDIDATES", None)
    A, P, E, W, X = T.arrays()
    limit = cluster.gpu.memory_bytes * (1 - memory_headroom)
    # the full (k, sp, v, z) grid of table values: step seconds and per-slot memory (bytes)
    step = A[:, None, :, None] + P[:, :, :, None] + E[:, None, None, :]          # (k, sp, v, z)
    mem = W[:, :, None, None, :] + X[:, :, :, :, None]                              # (k, j, sp, v, z)
    peak = mem.max(axis=1)                                                          # (k, sp, v, z)
    valid = np.isfinite(step)
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
    # Disposal: re-score in increasing proxy step time until no unscored candidate can beat the K-th best.
    ratio_lo = None  # min over re-scored candidates of scalar step / table step
    mem_margin = MEM_MARGIN
    seen: dict[tuple, Evaluation] = {}
    while True:
        cand = valid & (peak <= limit * (1 + mem_margin))
        idx = np.argwhere(cand)
        prox = step[cand]
        order = np.argsort(prox, kind="stable")
        feas: list[Evaluation] = []
        mem_ratio_lo = math.inf
        for o in order:
            ki, spi, vi, zi = (int(x) for x in idx[o])
            key = (ki, spi, vi, zi)
            ps = float(prox[o])
            if len(feas) >= top_k and ratio_lo is not None:
                kth = sorted(e.step.step_s for e in feas)[top_k - 1]
                if objective == "headroom":
                    if ps * ratio_lo * STEP_SAFETY > kth * (1 + within):
                        break
                elif ps * ratio_lo * STEP_SAFETY > kth:
                    break
            ev = seen.get(key)
            if ev is None:
                st, mbs, rc = T.keys[ki]
                par = to_parallel(st, mbs, vi + 1, zi, bool(spi), rc)
                ev = evaluate(model, cluster, job, par, num_gpus, memory_headroom, framework, convention)
                seen[key] = ev
            if ev.step is not None and ps > 0:
                r = ev.step.step_s / ps
                ratio_lo = r if ratio_lo is None else min(ratio_lo, r)
            if ev.memory is not None and peak[ki, spi, vi, zi] > 0:
                mem_ratio_lo = min(mem_ratio_lo, ev.memory.peak_bytes / peak[ki, spi, vi, zi])
            if ev.feasible:
                feas.append(ev)
        # the proxy memory filter is safe if no re-scored candidate's scalar memory fell below proxy/(1+margin)
        if mem_ratio_lo * (1 + mem_margin) >= 1 / MEM_SAFETY or mem_margin >= 4:
            break
        mem_margin = max(mem_margin * 2, 1 / (mem_ratio_lo * MEM_SAFETY) - 1)
    if objective == "headroom" and feas:
        best = min(e.step.step_s for e in feas)
        feas = [e for e in feas if e.step.step_s <= best * (1 + within)]
        feas.sort(key=lambda e: (round(e.memory.peak_bytes), rank_key(e)))
    else:
        feas.sort(key=rank_key)
    near = [] if feas else _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, memory_headroom,
                                    framework, convention)
    tm["rescore"] = time.perf_counter() - t0
    return SolveResult(feas[:top_k], n_cand, n_fit, len(seen), status, opt, near, tm)


def _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, headroom, framework, convention,
             n: int = 3) -> list[Evaluation]:
    """The ``n`` valid configurations with the smallest memory excess (scalar-evaluated)."""
    if not valid.any():
        return []
    exc = np.where(valid, peak - limit, np.inf)
    flat = np.argsort(exc, axis=None, kind="stable")[: n * 4]
    out, keys = [], set()
    for f in flat:
        ki, spi, vi, zi = np.unravel_index(f, exc.shape)
        st, mbs, rc = T.keys[ki]
        par = to_parallel(st, mbs, int(vi) + 1, int(zi), bool(spi), rc)
        if par in keys:
            continue
        keys.add(par)
        out.append(evaluate(model, cluster, job, par, num_gpus, headroom, framework, convention))
    out.sort(key=lambda e: (e.memory.peak_bytes if e.memory else math.inf))
    return out[:n]
