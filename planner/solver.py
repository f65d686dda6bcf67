"""CP-SAT search over the whole space: the solver proposes, the scalar cost model disposes.

How it works (DESIGN.md "The solver proposes, the scalar model disposes"):

1. **Structures** (``planner.space.structures``): every (tp, pp, cp, dp, ep, etp, layer split) with exact products
   and the divisibility rules; the other knobs (micro-batch, recompute, vpp, sequence parallel, ZeRO stage) range
   over ``planner.space``'s domains with its framework rules.
2. **Factorized tables of lower bounds** (``planner.tables``, one function per table) over ``k = (structure,
   micro-batch, recompute)``: step seconds >= ``P[k, sp, vpp] + E[k, zero]`` and memory of stage slot ``j`` >=
   ``W[k, j, zero] + X[k, j, sp, vpp]`` bytes.
3. **CP-SAT** (OR-Tools) chooses ``k``, vpp, sp and zero (one-hot variables, one boolean per table cell, tied by
   marginal-consistency constraints), with every stage's memory bound <= capacity x (1 - headroom), minimising the
   step-time bound (integer units of 1e-6 of the largest table value). Its optimum, and a hint from the same
   tables, start the re-scoring.
4. **Re-scoring**: candidates are evaluated by the scalar model (``planner.evaluate.evaluate``, which also runs the
   independent checker) in increasing order of their bound until the next bound exceeds the K-th best scalar step
   time. Because the tables are lower bounds, the result is exactly the enumerator's top K (ranked by
   ``planner.ranking``). If a re-scored value ever falls below its bound (the cost models changed under the
   tables), the bounds are scaled down by the ratio seen and the loop goes on, so correctness does not hinge on
   the bounds; only speed does.

The enumerator (``planner.search.enumerate_plans``) is the oracle: on every space small enough to enumerate both
return the same top K (tests/test_solver_property.py). ``ortools`` is imported only inside ``solve``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from cost_models.memory import estimate_memory
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluate import Evaluation, evaluate
from .ranking import nearest_key, rank_plans
from .recompute import dominated_by_no_recompute, with_fewest_recomputed_layers
from .space import SearchSpace, to_parallel
from .tables import MEM_MARGIN, V, build_tables

MIB = 2**20
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


def solve(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, top_k: int = 5,
          space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
          framework: str = "megatron", convention: FlopsConvention = "megatron",
          objective: str = "throughput", within: float = 0.05) -> SolveResult:
    """Best ``top_k`` plans by the scalar model; CP-SAT finds the table optimum (see module docstring).

    ``objective``: ``throughput`` (default) or ``headroom`` (most memory headroom among plans within
    ``within`` of the best step time).
    """
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
        mem_ratio_lo = math.inf
        pos = 0
        restart = exhausted = False
        while pos < len(order):
            o = order[pos]
            pos += 1
            bound = float(prox[o]) * corr * (1 - 1e-9)
            if objective == "headroom" and feas:
                # nothing beyond the best x (1 + within) can enter, however many plans are in the band
                if bound > min(e.step.step_s for e in feas) * (1 + within):
                    break
            elif len(feas) >= top_k:
                if bound > sorted(e.step.step_s for e in feas)[top_k - 1]:
                    break
            ki, spi, vi, zi = (int(x) for x in idx[o])
            key = (ki, spi, vi, zi)
            ev = seen.get(key)
            if ev is None:
                st, mbs, rc = T.keys[ki]
                par = to_parallel(st, mbs, vi + 1, zi, bool(spi), rc)
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
    feas = rank_plans(feas, top_k, objective, within)
    near = [] if feas else _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, memory_headroom,
                                    framework, convention)
    tm["rescore"] = time.perf_counter() - t0
    return SolveResult(feas, n_cand, n_fit, len(seen), status, opt, near, tm, exhausted)


def _nearest(model, cluster, job, num_gpus, T, step, peak, valid, limit, headroom, framework, convention,
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
        st, mbs, rc = T.keys[ki]
        par = to_parallel(st, mbs, int(vi) + 1, int(zi), bool(spi), rc)
        if par in keys:
            continue
        keys.add(par)
        found.append((*nearest_key(estimate_memory(model, cluster, job, par).peak_bytes - limit, par), par))
        found.sort(key=lambda x: (x[0], x[1]))
        del found[n:]
    return [evaluate(model, cluster, job, par, num_gpus, headroom, framework, convention) for _, _, par in found]
