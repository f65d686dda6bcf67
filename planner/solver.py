"""The search of the whole space: bounds propose, the scalar cost model disposes.

How it works (DESIGN.md "The solver proposes, the scalar model disposes"):

1. **Groups.** The space (``planner.space``: every structure (tp, pp, cp, dp, ep, etp, layer split) and every
   micro-batch dividing the per-replica batch; vpp, sp, ZeRO stage and recompute per group by the framework
   rules) is split into groups (structure, micro-batch). Each group gets a cheap first bound
   (``bound_terms.busiest_rank_bounds``); the groups are kept in a heap.
2. **Branch and bound, best first.** Popping a group's first bound refines it (``bound_terms.group_bound``: the
   recompute, sp and ZeRO choices whose memory bound fits, the vpp-1 pipeline bound, the DP / ZeRO terms); popping
   a refined bound tabulates the group (``planner.tables``, one function per table): step seconds >= the tight
   bound ``max(P + D, Z) + O`` per (recompute, sp, vpp, zero) cell, memory per stage slot >= ``W + X`` bytes.
3. **Re-scoring.** The tabulated cells whose memory bound fits are evaluated by the scalar model
   (``planner.evaluation.evaluate``, which also runs the independent checker) in increasing order of their bound
   until the next bound exceeds the threshold: the K-th best scalar step time found (``headroom``: the best x
   (1 + within)). The threshold then cuts the heap: the search ends when its smallest bound exceeds it.
4. **CP-SAT** (OR-Tools) solves the table problem (choose k, vpp, sp, zero; every stage's memory bound <= capacity
   x (1 - headroom); minimise the additive bound ``A + P + E``) on the cells that can hold its optimum (bound <=
   the threshold; the numpy minimum of the same grid is its hint) and reports it (``table_best_step_s``); the
   answer does not depend on it.

**Why the answer is exactly the enumerator's top K** (``planner.search.enumerate_plans``, the oracle;
tests/test_solver_property.py checks it on random models, clusters, jobs and frameworks, and
tests/test_tables_bounds.py checks every bound below against the scalar model). Every cut is one of:

* *Bound above the threshold* (heap, re-scoring stop): for every candidate c of a group,
  first bound <= refined bound <= tight bound of c's cell <= scalar step time of c (each a lower bound of the
  next: the first bound drops recompute and memory, the refined bound keeps only cells whose memory bound fits,
  ``planner.tables``). The threshold is a scalar step time of a feasible plan found, so a candidate whose bound
  exceeds it is slower than K found plans and cannot enter the top K (ties: bounds are compared with a 1e-9
  relative margin, and an equal step time can only tie, which ``planner.ranking`` breaks as the enumerator does).
* *Memory bound above the capacity*: W + X <= the scalar peak of every phase (buffers and transients left out),
  so such a cell does not fit.
* *Dominated points, not listed by either search*: a point with a context-parallel twin (cp / c, dp x c,
  mbs / c; ``planner.space.dominated_by_cp_twin``: the twin runs the same tokens per rank, is never slower and
  never larger) and a full-recompute point whose no-recompute twin fits with no higher peak
  (``planner.recompute.dominated_by_no_recompute``). The twin is in the space, so the optimum never needs them.
* *Full recompute at the fewest recomputed layers per chunk that fit* (``planner.recompute``): time grows and
  memory falls with N, so the other N are slower or do not fit.

What is not a cut but the space's definition (``planner.space``, docstring): tp within the NVLink domain, etp
dividing tp (Megatron), end stages at most ``END_STAGE_LIGHTER`` layers lighter than the middle ones, vpp <=
``MAX_VPP``.

Adding a categorical knob (a pipeline schedule, say): give it a domain in ``planner.space`` (framework rules
there, a ``SearchSpace`` pin), make it part of ``k`` next to the recompute setting (``tables.add_group_tables``
loops over it and keys the tables by it; ``space.to_parallel`` takes it), bound its effect in the terms it changes
(``bound_terms.pipeline_bound`` for the bubble, ``bound_facts.in_flight`` for the memory), keep the two group
bounds below it (the least of its values) and add it to ``ranking.config_key``; the branch and bound, the
re-scoring and the enumerator then cover it unchanged, and tests/test_tables_bounds.py and the property test check
it.

If a re-scored value ever falls below its bound (the cost models changed under the tables), the bounds are scaled
down by the ratio seen x ``BOUND_FALLBACK`` and the search goes on (a memory bound above a scalar peak widens the
memory filter the same way); a bound that is wrong only for candidates never re-scored is what
tests/test_tables_bounds.py guards against. ``ortools`` is imported only when CP-SAT runs.
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from cost_models.memory import estimate_memory
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluation import Evaluation, evaluate
from .ranking import nearest_key, rank_plans
from .progress import Progress, no_progress
from .recompute import dominated_by_no_recompute, with_fewest_recomputed_layers
from .space import (SearchSpace, Structure, dominated_by_cp_twin, micro_batch_options, schedule_options, structures,
                    to_parallel, vpp_options)
from .bound_facts import MEM_MARGIN, context, structure_facts
from .bound_terms import busiest_rank_bounds, group_bound
from .tables import V, Tables, add_group_tables

MIB = 2**20
#: Groups tabulated in the first round of the branch and bound while no threshold is known (doubling after).
FIRST_BATCH = 32
#: If a re-scored value is ever below its bound, bounds are scaled by the ratio seen x this.
BOUND_FALLBACK = 0.9
#: CP-SAT parameters: one worker (the speed goals are per core); full LP relaxation, no presolve and no probing
#: were fastest on these small one-hot models with a feasible hint (measured: 405B on 16,384 GPUs 0.44 -> 0.09 s,
#: Llama-3.1-8B on 8,192 GPUs 1.1 -> 0.22 s; benchmarks/bench_search.py).
CPSAT_PARAMS: dict = {"num_workers": 1, "linearization_level": 2, "cp_model_probing_level": 0,
                      "cp_model_presolve": False}

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


@dataclass
class _Group:
    """One (structure, micro-batch): its first time bound (``tables.busiest_rank_bound``), its refined bound
    (``bound_terms.group_bound``, None until computed), its candidates and how many of them may fit."""

    st: Structure
    mbs: int
    lb0: float
    cells: int
    lb1: float | None = None
    fit_cells: int = 0
    built: bool = False


def _groups(ctx, num_gpus: int) -> tuple[list[_Group], dict, int]:
    """Every group of the space that is not dominated by a context-parallel twin (``space.dominated_by_cp_twin``)
    with its first bound, sorted by (bound, enumeration order); the structures' facts; the number of candidates
    of the whole space, dominated points included."""
    model, job, space, fw = ctx.model, ctx.job, ctx.space, ctx.framework
    out: list[_Group] = []
    facts = {}
    n_cand = 0
    vpp_memo: dict[tuple, tuple[list[int], int]] = {}  # -> (vpp options, candidates of the group)
    for st in structures(model, ctx.cluster, job, num_gpus, space, fw):
        mbss = micro_batch_options(st, job, space)
        sf = structure_facts(ctx, st) if mbss else None
        if sf is None:
            continue
        facts[st] = sf
        per_replica = job.global_batch_size // st.dp
        keep, cells, v1 = [], [], []
        unpinned = space.cp is None and space.micro_batch_size is None
        for mbs in mbss:
            m = per_replica // mbs
            whole = m % st.pp == 0
            # vpp_options depends on m only through m % pp == 0, schedule_options through m >= 2 pp
            key = (st.pp, st.first, st.last, st.ep > 1, whole, m >= 2 * st.pp, tuple(sf.zs), len(sf.sps))
            if key not in vpp_memo:
                vpps = vpp_options(model, st, m, fw, space)
                vpp_memo[key] = (vpps, len(sf.sps) * sum(len(schedule_options(model, st, m, v, z, rc, fw, space))
                                                        for v in vpps for z in sf.zs for rc in space.recompute))
            vpps, n = vpp_memo[key]
            n_cand += n
            if st.cp == 1 or (math.gcd(st.cp, mbs) == 1 if unpinned
                              else not dominated_by_cp_twin(st.cp, mbs, space)):
                keep.append(mbs)
                cells.append(n)
                v1.append(vpps == [1])
        for mbs, n, lb in zip(keep, cells, busiest_rank_bounds(ctx, sf, keep, v1)):
            out.append(_Group(st, mbs, lb, n))
    order = sorted(zip((g.lb0 for g in out), range(len(out))))
    return [out[i] for _, i in order], facts, n_cand


def solve(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, top_k: int = 5,
          space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
          framework: str = "megatron", convention: FlopsConvention = "megatron",
          objective: str = "throughput", within: float = 0.05,
          progress: Progress = no_progress, explain: bool = True) -> SolveResult:
    """Best ``top_k`` plans by the scalar model (module docstring), ranked by ``planner.ranking.rank_plans``.

    ``objective``: ``throughput`` (default) or ``headroom`` (most memory headroom among plans within
    ``within`` of the best step time). ``progress`` is told each phase (the candidate count, the plans re-scored so
    far, the CP-SAT certificate), so that a search over a large space says why it takes longer than usual.
    ``explain`` False: when nothing fits, the closest layouts (``nearest_infeasible``) are not searched for (a
    caller that tries other GPU counts explains only the last).
    """
    import time
    tm: dict[str, float] = {}
    t0 = time.perf_counter()
    progress(f"bounding every layout on {num_gpus:,} GPUs")
    ctx = context(model, cluster, job, space, framework, memory_headroom)
    limit = cluster.gpu.memory_bytes * (1 - memory_headroom)
    groups, facts, n_cand = _groups(ctx, num_gpus)
    tm["bounds"] = time.perf_counter() - t0
    if not groups:
        return SolveResult([], n_cand, 0, 0, "NO_CANDIDATES", None, timings_s=tm)
    T = Tables()
    cache: dict = {}
    seen: dict[tuple, Evaluation] = {}
    corr, mem_margin = 1.0, MEM_MARGIN
    # a full-recompute plan whose no-recompute twin fits with no higher peak is slower and no smaller: not listed
    drop_dominated = "none" in space.recompute
    batch = FIRST_BATCH
    t_refine = t_tables = t_rescore = 0.0
    feas: list[Evaluation] = []
    exhausted = False

    def threshold(steps: list[float]) -> float:
        """Step seconds above which nothing can enter the answer (inf while it is not known); ``steps``: the
        feasible step times found, sorted."""
        if objective == "headroom":
            return steps[0] * (1 + within) if steps else math.inf
        return steps[top_k - 1] if len(steps) >= top_k else math.inf

    def below(lb: float, thr: float) -> bool:
        return lb * corr * (1 - 1e-9) <= thr

    # Branch and bound, best first (module docstring): a heap of (bound, group, level); level 0 holds a group's
    # first bound, level 1 its refined bound. Popping a level-0 entry refines it; popping a level-1 entry queues
    # its tables. Queued tables are built ``batch`` at a time (doubling), then the built candidates are re-scored,
    # which lowers the threshold; the search ends when the heap's smallest bound exceeds the threshold.
    heap = [(g.lb0, i, 0) for i, g in enumerate(groups)]  # already in (lb0, index) order: a valid heap
    thr = math.inf
    while True:
        t1 = time.perf_counter()
        pending: list[_Group] = []
        while heap and below(heap[0][0], thr) and len(pending) < batch:
            _, i, level = heapq.heappop(heap)
            g = groups[i]
            if level == 0:
                t0r = time.perf_counter()
                g.lb1, g.fit_cells = group_bound(ctx, facts[g.st], g.mbs, limit * (1 + mem_margin))
                t_refine += time.perf_counter() - t0r
                if math.isfinite(g.lb1):
                    heapq.heappush(heap, (g.lb1, i, 1))
            else:
                pending.append(g)
        for g in pending:
            add_group_tables(ctx, T, facts[g.st], g.mbs)
            g.built = True
        batch *= 2
        t3 = time.perf_counter()
        t_tables += t3 - t1
        if not pending and cache:
            break  # nothing left below the threshold, and the built candidates are re-scored
        if not T.keys:
            break  # nothing fits the memory bound anywhere
        if pending or not cache:
            cache = _grids(T, limit)
        progress(f"{n_cand:,} layouts, {len(seen):,} checked in full")
        feas, restart, mem_ratio_lo, exhausted, corr = _rescore(
            model, cluster, job, num_gpus, T, cache, seen, limit, mem_margin, corr, top_k, memory_headroom,
            framework, convention, drop_dominated, threshold)
        t_rescore += time.perf_counter() - t3
        thr = threshold(sorted(e.step.step_s for e in feas))
        if restart:
            cache = {}  # re-score again with the scaled bounds
            continue
        # the memory filter is safe while no re-scored candidate's scalar memory fell below its bound
        if not (mem_ratio_lo * (1 + mem_margin) >= 1 - 1e-9 or mem_margin >= 4):
            mem_margin = max(mem_margin * 2, 1 / (mem_ratio_lo * BOUND_FALLBACK) - 1)
            for g in groups:  # refine again under the wider filter
                g.lb1 = None if not g.built else g.lb1
            heap = [(g.lb0, i, 0) for i, g in enumerate(groups) if not g.built]
            heapq.heapify(heap)
            cache = {}
    t_tables -= t_refine
    tm["refine"], tm["tables"], tm["rescore"] = t_refine, t_tables, t_rescore
    # candidates that may fit: the built ones whose memory bound fits, every candidate of the refined groups that
    # fits at vpp 1, every candidate of the others (an upper bound unless everything was re-scored)
    n_fit = int(cache["fits"].sum()) if cache else 0
    n_fit += sum(g.cells if g.lb1 is None else g.fit_cells for g in groups if not g.built)
    exhausted = exhausted and all(g.built or (g.lb1 is not None and g.fit_cells == 0) for g in groups)
    if exhausted:
        n_fit = len(feas)  # every candidate was re-scored: the exact count (else an upper bound)
    t1 = time.perf_counter()
    status, opt = "INFEASIBLE", None
    if cache and cache["n_fit"]:
        progress(f"{n_cand:,} layouts: CP-SAT certificate")
        status, opt = _table_optimum(cache, limit, threshold(sorted(e.step.step_s for e in feas)) / corr)
    tm["cpsat"] = time.perf_counter() - t1
    plans = rank_plans(feas, top_k, objective, within)
    near: list[Evaluation] = []
    if not plans and explain:
        t1 = time.perf_counter()
        for g in groups:  # the closest layouts: every group's tables (nothing fits; no speed goal)
            if not g.built:
                add_group_tables(ctx, T, facts[g.st], g.mbs)
        cache = _grids(T, limit)
        near = _nearest(model, cluster, job, num_gpus, T, cache["peak"], cache["valid"], limit, memory_headroom,
                        framework, convention)
        tm["nearest"] = time.perf_counter() - t1
    return SolveResult(plans, n_cand, n_fit, len(seen), status, opt, near, tm, exhausted)


def _table_optimum(cache: dict, limit: float, thr: float) -> tuple[str, float | None]:
    """CP-SAT's optimum of the built tables (the step-time bound ``A + P + E`` over the cells whose memory bound
    fits), posted on the cells whose bound is at most ``thr`` seconds: the hint (the grid's minimum) is one of
    them and is at most the best plan's scalar step time <= ``thr``, so the restriction keeps the optimum."""
    A, P, E, W, X = cache["arrays"]
    step = cache["step"]
    keep = np.flatnonzero((cache["fits"] & (step <= thr * (1 + 1e-9))).any(axis=(1, 2, 3)))
    if not keep.size:
        keep = np.array([cache["hint"][0]])
    fits = cache["fits"][keep] & (step[keep] <= thr * (1 + 1e-9))
    hk, hsp, hv, hz = cache["hint"]
    hint = (int(np.searchsorted(keep, hk)), hsp, hv, hz)
    if not fits[hint]:
        fits[hint] = True
    status, opt, _ = _cpsat_optimum(A[keep], P[keep], E[keep], W[keep], X[keep], limit * (1 + MEM_MARGIN),
                                    hint=hint, fits=fits)
    return status, opt


def _grids(T: Tables, limit: float) -> dict:
    """The (k, sp, v, z) grids of the built tables: step and memory bounds, validity, the tight bound, the hint."""
    A, P, E, W, X = T.arrays()
    step = A[:, None, :, None] + P[:, :, :, None] + E[:, None, None, :]          # (k, sp, v, z)
    mem = W[:, :, None, None, :] + X[:, :, :, :, None]                              # (k, j, sp, v, z)
    peak = mem.max(axis=1)                                                          # (k, sp, v, z)
    valid = np.isfinite(step)
    tight = np.where(valid, T.tight(A, P), np.inf)
    fits = valid & (peak <= limit * (1 + MEM_MARGIN))
    n_fit = int(fits.sum())
    hint = None
    if n_fit:
        hint = tuple(int(x) for x in np.unravel_index(np.argmin(np.where(fits, step, np.inf)), step.shape))
    return {"arrays": (A, P, E, W, X), "step": step, "peak": peak, "valid": valid, "tight": tight, "fits": fits,
            "n_fit": n_fit, "hint": hint}


def _rescore(model, cluster, job, num_gpus, T, cache, seen, limit, mem_margin, corr, top_k, headroom, framework,
             convention, drop_dominated, threshold):
    """Disposal: re-score the built candidates in increasing order of their step-time lower bound until the next
    bound exceeds the threshold (the K-th best scalar step time; ``headroom``: the best x (1 + within)). The tables
    are lower bounds of the scalar model, so no candidate past the stop can enter the answer. Should a re-scored
    value ever fall below its bound (the cost models changed under the tables), the bounds are scaled down by the
    worst ratio seen x BOUND_FALLBACK (``restart``), and the caller widens the memory filter the same way when a
    scalar peak falls below its memory bound (``mem_ratio_lo`` < 1).

    Returns (feasible evaluations, restart, lowest scalar / bound memory ratio, every candidate re-scored, corr)."""
    peak, tight, valid = cache["peak"], cache["tight"], cache["valid"]
    cand = valid & (peak <= limit * (1 + mem_margin))
    idx = np.argwhere(cand)
    prox = tight[cand]
    order = np.argsort(prox, kind="stable")
    feas: list[Evaluation] = []
    mem_ratio_lo = math.inf
    steps: list[float] = []  # sorted
    for o in order:
        bound = float(prox[o]) * corr * (1 - 1e-9)
        if bound > threshold(steps):
            return feas, False, mem_ratio_lo, False, corr
        ki, spi, vi, zi = (int(x) for x in idx[o])
        key = (ki, spi, vi, zi)
        ev = seen.get(key)
        if ev is None:
            st, mbs, rc, sched = T.keys[ki]
            par = to_parallel(st, mbs, vi + 1, zi, bool(spi), rc, sched)
            par = with_fewest_recomputed_layers(model, cluster, job, par, framework, headroom)
            # an infeasible candidate cannot enter the answer: its step time is not needed
            ev = evaluate(model, cluster, job, par, num_gpus, headroom, framework, convention, time_infeasible=False)
            seen[key] = ev
        if ev.step is not None and prox[o] > 0:
            r = ev.step.step_s / float(prox[o])
            if r * (1 + 1e-9) < corr:
                return feas, True, mem_ratio_lo, False, r * BOUND_FALLBACK
        if ev.memory is not None and peak[ki, spi, vi, zi] > 0:
            mem_ratio_lo = min(mem_ratio_lo, ev.memory.peak_bytes / peak[ki, spi, vi, zi])
        if ev.feasible and not (drop_dominated and dominated_by_no_recompute(
                model, cluster, job, ev.parallel, ev.memory.peak_bytes, headroom, framework)):
            feas.append(ev)
            bisect.insort(steps, ev.step.step_s)
    return feas, False, mem_ratio_lo, True, corr


def _nearest(model, cluster, job, num_gpus, T, peak, valid, limit, headroom, framework, convention,
             n: int = 3, max_exact: int = 20000) -> list[Evaluation]:
    """The ``n`` valid configurations with the smallest memory excess, ties by ``ranking.config_key``: the
    enumerator's answer. Candidates are taken in order of their memory lower bound (``peak``) and estimated
    exactly until the bound exceeds the n-th smallest exact peak (at most ``max_exact`` estimates)."""
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
        found.append((*nearest_key(estimate_memory(model, cluster, job, par).peak_bytes - limit, par), par))
        found.sort(key=lambda x: (x[0], x[1]))
        del found[n:]
    return [evaluate(model, cluster, job, par, num_gpus, headroom, framework, convention) for _, _, par in found]
