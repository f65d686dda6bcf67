"""Exhaustive search (the enumerator): every candidate of the space, memory-filtered, ranked by
``planner.ranking`` (the same order as the solver's), and the dispatch between the enumerator and the solver.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from cost_models.memory import estimate_memory
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluation import Evaluation, evaluate
from .progress import Budget, Progress, no_progress
from .ranking import nearest_key, rank_plans
from .recompute import dominated_by_no_recompute, with_fewest_recomputed_layers
from .solver import solve
from .space import SearchSpace, candidates, dominated_by_cp_twin


@dataclass
class SearchResult:
    """Top plans (best first), how many candidates were examined, and the closest infeasible ones."""

    plans: list[Evaluation]
    num_candidates: int
    num_feasible: int
    nearest_infeasible: list[Evaluation]
    #: False when ``num_feasible`` counts the candidates whose memory lower bound fits (CP-SAT stopped re-scoring
    #: early): an upper bound of the feasible count
    num_feasible_exact: bool = True
    #: one line when the search stopped at its time budget (``fewest_gpus``): what was and was not tried
    note: str | None = None
    #: ``fewest_gpus`` when no count meets the target: the plans that fit on the largest count tried (``max_gpus``)
    #: but miss it, best first, for the caller's explanation
    missed: list[Evaluation] = field(default_factory=list)


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, top_k: int = 5,
                    space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                    framework: str = "megatron", convention: FlopsConvention = "megatron",
                    progress: Callable[[int], None] | None = None, objective: str = "throughput",
                    within: float = 0.05) -> SearchResult:
    """Evaluate every candidate; keep the ``top_k`` feasible ones by ``planner.ranking.rank_plans``. Candidates
    with an at-least-as-good context-parallel twin (``planner.space.dominated_by_cp_twin``) are counted, not
    evaluated or listed, as in the solver. A full-recompute candidate that fits with every layer recomputed is
    evaluated at the fewest recomputed layers per chunk that fit (``planner.recompute.fewest_recomputed_layers``)."""
    feasible: list[Evaluation] = []
    near: list[tuple[tuple, ParallelConfig]] = []
    n = 0
    limit = cluster.gpu.memory_bytes * (1 - memory_headroom)
    drop_dominated = "none" in space.recompute  # as the solver (planner.recompute.dominated_by_no_recompute)
    if getattr(job, "framework", framework) != framework:  # the memory model of ``evaluate`` uses ``framework``
        job = job.model_copy(update={"framework": framework})
    for par in candidates(model, cluster, job, num_gpus, space, framework):
        n += 1
        if progress and n % 256 == 0:
            progress(n)
        if dominated_by_cp_twin(par.cp, par.micro_batch_size, space):
            continue  # a context-parallel twin is at least as good (planner.space.dominated_by_cp_twin)
        mem = estimate_memory(model, cluster, job, par)
        if mem.peak_bytes > limit:
            near.append((nearest_key(mem.peak_bytes - limit, par), par))
            continue
        # full recompute: the fewest recomputed layers per chunk that fit (planner.recompute)
        par = with_fewest_recomputed_layers(model, cluster, job, par, framework, memory_headroom)
        ev = evaluate(model, cluster, job, par, num_gpus, memory_headroom, framework, convention)
        if ev.feasible and not (drop_dominated and dominated_by_no_recompute(
                model, cluster, job, par, ev.memory.peak_bytes, memory_headroom, framework)):
            feasible.append(ev)
    near.sort(key=lambda x: x[0])
    nearest = [evaluate(model, cluster, job, p, num_gpus, memory_headroom, framework, convention)
               for _, p in near[:3]]
    return SearchResult(rank_plans(feasible, top_k, objective, within), n, len(feasible), nearest)


def run_search(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, top_k: int = 5,
               space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
               framework: str = "megatron", solver: str = "cpsat", objective: str = "throughput",
               within: float = 0.05, convention: FlopsConvention = "megatron",
               at_risk_margin: float | None = None, progress: Progress = no_progress,
               explain: bool = True) -> SearchResult:
    """Dispatch to the CP-SAT solver (default) or the enumerator; both return a ``SearchResult``.

    ``objective`` ``headroom``: among plans within ``within`` (fraction) of the best step time, most memory
    headroom first. ``convention`` names the model FLOPs behind the reported TFLOP/s and MFU (it does not change
    the ranking, which is by step time).

    ``at_risk_margin`` (wider than ``memory_headroom``): plans whose peak clears it come first (searched with it as
    the memory limit, so recompute and micro-batch choices are made to clear it); the plans within it, which fit
    the headroom but are at risk (``planner.checks.memory_verdict``), only fill the remaining ranks.

    ``explain`` False: no ``nearest_infeasible`` when nothing fits (CP-SAT solver; ``solver.solve``).
    """
    if at_risk_margin is not None and at_risk_margin > memory_headroom:
        safe = run_search(model, cluster, job, num_gpus, top_k, space, at_risk_margin, framework, solver, objective,
                          within, convention, progress=progress, explain=False)
        if len(safe.plans) >= top_k:
            return safe
        risky = run_search(model, cluster, job, num_gpus, top_k, space, memory_headroom, framework, solver,
                           objective, within, convention, progress=progress, explain=explain)
        seen = {e.parallel for e in safe.plans}
        risky.plans = (safe.plans + [e for e in risky.plans if e.parallel not in seen])[:top_k]
        return risky
    if solver == "enumerate":
        def counted(n: int) -> None:
            progress(f"--solver enumerate (brute force): {n:,} candidates evaluated")
        return enumerate_plans(model, cluster, job, num_gpus, top_k, space, memory_headroom, framework, convention,
                               counted, objective=objective, within=within)
    r = solve(model, cluster, job, num_gpus, top_k, space, memory_headroom, framework, convention,
              objective=objective, within=within, progress=progress, explain=explain)
    return SearchResult(r.plans, r.num_candidates, r.num_feasible, r.nearest_infeasible, r.num_feasible_exact)


def gpu_counts(cluster: ClusterSpec, max_gpus: int) -> list[int]:
    """Candidate world sizes up to ``max_gpus``: the node size times 1, 2, 4, ... (and ``max_gpus`` itself)."""
    gpn = cluster.node.gpus_per_node
    out, n = [], gpn
    while n < max_gpus:
        out.append(n)
        n *= 2
    out.append(max_gpus)
    return out


def fewest_gpus(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, max_gpus: int, top_k: int = 5,
                space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                framework: str = "megatron", solver: str = "cpsat", target_step_s: float | None = None,
                target_tokens_per_day: float | None = None,
                convention: FlopsConvention = "megatron",
                meets: Callable[[Evaluation, int], bool] | None = None,
                at_risk_margin: float | None = None, budget: Budget | None = None,
                progress: Progress = no_progress) -> tuple[SearchResult, int]:
    """Fewest GPUs (a multiple of the node size, up to ``max_gpus``) whose best plan meets the target (step
    seconds, or tokens per day = tokens/s x 86,400, or ``meets(plan, gpus)``, e.g. a deadline: planner/cost_search.py).
    Returns the plans that meet it and the GPU count. Each count is searched as ``run_search`` does with
    ``at_risk_margin``: plans within it of capacity are feasible (they count as meeting the target) but rank after
    the plans that clear it.

    Doubling from one node brackets the answer between the last count that misses and the first that meets it;
    bisection over node counts then narrows it (assuming, as the cost model does almost everywhere, that the best
    throughput does not fall when GPUs are added inside the bracket: the answer meets the target and the node count
    just below it was tried and missed). Each count tried is one search, reported to ``progress``; when ``budget``
    (wall seconds) is spent the search stops and ``note`` says so: with a count that meets the target, that count
    (it may not be the fewest); without, no plan. When no count meets the target, ``missed`` holds the plans that fit
    on ``max_gpus`` (the last count tried) but miss it.
    """
    gpn = cluster.node.gpus_per_node
    budget = budget or Budget(None)

    def attempt(n):
        progress(f"min-gpus: planning on {n:,} GPUs")
        # only the largest count's closest layouts explain a miss (planner.explanation.why_infeasible)
        res = run_search(model, cluster, job, n, top_k, space, memory_headroom, framework, solver,
                         convention=convention, at_risk_margin=at_risk_margin, explain=n == max_gpus)
        ok = [e for e in res.plans if (target_step_s is None or e.step.step_s <= target_step_s) and
              (target_tokens_per_day is None or e.step.tokens_per_s * 86400 >= target_tokens_per_day) and
              (meets is None or meets(e, n))]
        return res, ok

    def spent(what: str) -> str | None:
        if not budget.spent:
            return None
        return (f"--objective min-gpus stopped after {budget.elapsed_s:.0f} s, the time budget, {what}; raise "
                f"--time-budget to try them")

    lo, hit = 0, None  # lo: largest node count known to miss
    res = None
    for n in gpu_counts(cluster, max_gpus):
        note = spent(f"before trying {n:,} GPUs and more")
        if note:
            res = res or SearchResult([], 0, 0, [])
            res.plans, res.note = [], note
            return res, max_gpus
        res, ok = attempt(n)
        if ok:
            res.plans = ok
            hit = (res, n)
            break
        lo = n // gpn
    if hit is None:
        res.missed, res.plans = res.plans, []
        return res, max_gpus
    hi = hit[1] // gpn
    while hi - lo > 1:
        note = spent(f"with {hi * gpn:,} GPUs meeting the target and {(lo + 1) * gpn:,}-{(hi - 1) * gpn:,} not all "
                     f"tried (the answer may be fewer)")
        if note:
            hit[0].note = note
            break
        mid = (lo + hi) // 2
        res, ok = attempt(mid * gpn)
        if ok:
            res.plans = ok
            hit, hi = (res, mid * gpn), mid
        else:
            lo = mid
    return hit
