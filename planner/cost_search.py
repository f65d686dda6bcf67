"""Searches that use the whole-run cost: the deadline objectives and the GPU-count sweep behind ``--plot``.

* ``fewest_gpus_by_deadline`` (``--objective min-gpus --deadline-days D``): the fewest GPUs whose best plan trains
  ``--train-tokens`` in at most D effective days (interruptions, restarts and checkpoints counted), by the same
  doubling-then-bisection over node counts as ``planner.search.fewest_gpus``.
* ``cheapest_by_deadline`` (``--objective cost --deadline-days D``): the plan with the fewest GPU-hours (on one
  cluster the price per GPU-hour is one number, so fewest GPU-hours is cheapest) among those that finish by D,
  plans within the at-risk margin of capacity after those that clear it (as ``plan`` ranks them). GPU
  counts tried: the fewest that meet the deadline, then the doubling ladder above it up to ``--gpus`` (more GPUs can
  be cheaper when fewer need recompute or a deep pipeline). Every returned plan meets the deadline.
* ``cost_sweep``: the best plan at each GPU count of the doubling ladder, with its days and cost (``--plot``).
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, TrainingJob
from model_zoo.spec import ModelSpec

from .cost import CostOptions, plan_cost
from .progress import Budget, Progress, no_progress
from .document import CostInfo
from .errors import NoFeasiblePlan
from .evaluation import Evaluation
from .ranking import rank_key
from .search import SearchResult, fewest_gpus, gpu_counts, run_search
from .space import SearchSpace


@dataclass(frozen=True)
class Problem:
    """One search problem on one cluster: everything but the GPU count."""

    model: ModelSpec
    cluster: ClusterSpec
    job: TrainingJob
    space: SearchSpace
    memory_headroom: float
    framework: str
    solver: str
    convention: FlopsConvention
    cost: CostOptions
    #: wall seconds the repeated searches may take, and the status line told each one (planner/progress.py)
    budget: Budget | None = None
    progress: Progress = no_progress
    #: plans within this fraction of capacity are at risk: feasible, ranked after those that clear it
    at_risk_margin: float | None = None

    def search(self, num_gpus: int, top_k: int) -> SearchResult:
        self.progress(f"planning on {num_gpus:,} GPUs")
        return run_search(self.model, self.cluster, self.job, num_gpus, top_k, self.space, self.memory_headroom,
                          self.framework, self.solver, convention=self.convention, at_risk_margin=self.at_risk_margin)

    def at_risk(self, ev: Evaluation) -> bool:
        """The plan's peak is within ``at_risk_margin`` of capacity (``planner.checks.memory_verdict`` at risk)."""
        m = self.at_risk_margin
        return m is not None and ev.memory is not None and ev.memory.peak_bytes > ev.memory.capacity_bytes * (1 - m)

    def cost_of(self, ev: Evaluation, num_gpus: int) -> CostInfo:
        return plan_cost(self.model, self.cluster, self.job, ev, num_gpus, self.cost)


def _deadline_missed(p: Problem, max_gpus: int, deadline_days: float,
                     fitting: list[Evaluation]) -> NoFeasiblePlan | None:
    """The error for a deadline no plan meets on up to ``max_gpus`` GPUs, from ``fitting``, the plans that fit on
    ``max_gpus`` best first (``SearchResult.missed``; None when nothing fits in memory at all: the caller explains
    that instead)."""
    if not fitting:
        return None
    best = fitting[0]
    c = p.cost_of(best, max_gpus)
    q = best.parallel
    return NoFeasiblePlan(
        f"deadline: no plan on up to {max_gpus} GPUs trains {c.train_tokens:.3g} tokens in {deadline_days:g} days; "
        f"the fastest (tp {q.tp} pp {q.pp} dp {q.dp} cp {q.cp} ep {q.ep}, {max_gpus} GPUs) takes "
        f"{c.effective_days:.1f} effective days (goodput {c.goodput_fraction:.1%}), {c.effective_days / deadline_days:.2f}x "
        f"the deadline: allow more GPUs (--gpus) or a later --deadline-days")


def fewest_gpus_by_deadline(p: Problem, max_gpus: int, top_k: int, deadline_days: float) -> tuple[SearchResult, int]:
    """Fewest GPUs (multiple of the node size, up to ``max_gpus``) whose plans finish by ``deadline_days`` effective
    days; returns the plans that do (best throughput first) and the count. Raises ``NoFeasiblePlan`` when the
    deadline cannot be met though plans fit; an empty result when nothing fits in memory."""
    def meets(ev: Evaluation, n: int) -> bool:
        return p.cost_of(ev, n).effective_days <= deadline_days

    res, n = fewest_gpus(p.model, p.cluster, p.job, max_gpus, top_k, p.space, p.memory_headroom, p.framework,
                         p.solver, convention=p.convention, meets=meets, at_risk_margin=p.at_risk_margin,
                         budget=p.budget, progress=p.progress)
    if not res.plans and res.note is None:
        err = _deadline_missed(p, max_gpus, deadline_days, res.missed)
        if err is not None:
            raise err
    return res, n


def cheapest_by_deadline(p: Problem, max_gpus: int, top_k: int, deadline_days: float) -> tuple[SearchResult, int]:
    """The GPU count and plans with the fewest GPU-hours that finish by ``deadline_days`` (module docstring);
    plans cheapest first, plans at risk (``Problem.at_risk``) after those that clear the margin, here and across GPU
    counts. Raises like ``fewest_gpus_by_deadline``."""
    res, n_min = fewest_gpus_by_deadline(p, max_gpus, top_k, deadline_days)
    if not res.plans:
        return res, n_min
    best: tuple[tuple[bool, float], int, SearchResult] | None = None
    for n in [n_min] + [c for c in gpu_counts(p.cluster, max_gpus) if c > n_min]:
        if n != n_min and p.budget is not None and p.budget.spent:
            best[2].note = (f"--objective cost stopped after {p.budget.elapsed_s:.0f} s, the time budget, before "
                            f"trying {n:,} GPUs and more (a cheaper plan may use more GPUs); raise --time-budget")
            break
        r = res if n == n_min else p.search(n, top_k)
        scored = [(p.cost_of(e, n), e) for e in r.plans]
        ok = sorted((((p.at_risk(e), c.gpu_hours, rank_key(e)), e) for c, e in scored
                     if c.effective_days <= deadline_days), key=lambda x: x[0])
        if ok and (best is None or ok[0][0][:2] < best[0]):
            r.plans = [e for _, e in ok]
            best = (ok[0][0][:2], n, r)
    assert best is not None  # n_min met the deadline
    return best[2], best[1]


@dataclass(frozen=True)
class SweepPoint:
    """The best plan at one GPU count of one cluster, with its whole-run cost."""

    cluster: str
    num_gpus: int
    plan: Evaluation
    cost: CostInfo


def cost_sweep(p: Problem, max_gpus: int) -> list[SweepPoint]:
    """The fastest plan at each GPU count of the doubling ladder up to ``max_gpus`` (``planner.search.gpu_counts``),
    with its cost; counts where nothing fits are left out."""
    out = []
    for n in gpu_counts(p.cluster, max_gpus):
        if p.budget is not None and p.budget.spent:  # the picture stops at the time budget: fewer points
            break
        r = p.search(n, 1)
        if r.plans:
            out.append(SweepPoint(p.cluster.name, n, r.plans[0], p.cost_of(r.plans[0], n)))
    return out


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better on each; ties kept once),
    sorted by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front, best_y = [], float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front
