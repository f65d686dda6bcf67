"""Near misses: the global batches and GPU counts nearest to a job that no layout divides (issue 11 item 2).

A global batch B plans only if some layout's data-parallel size dp divides it (the micro-batch divides the
per-replica batch B / dp). When none does (5,128 GPUs = 8 x 641 with B = 2,520: every dp of a valid layout is a
multiple of the prime 641), ``nearest_batches`` names the feasible batches nearest to B on both sides: the
multiples of the layouts' dp just below and just above B, tried nearest first with the full search (the first that
plans wins, so memory is checked too). ``nearest_gpu_counts`` does the same over whole nodes: the node counts
nearest to the request whose layouts divide B. Each answer carries its best plan, so the caller can show the
predicted throughput. Every search is one step of the caller's time budget (``planner.progress``: none starts once
it is spent) and is reported to its progress line. ``choose_batch`` is ``plan --global-batch-size-tolerance F``: the request if it plans,
else the nearest feasible batch within a fraction F of it (equal distance: the higher throughput).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cluster_specs.spec import MAX_GPUS, ClusterSpec
from cost_models.config import FlopsConvention, TrainingJob
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluation import Evaluation
from .progress import Budget, Progress, no_progress
from .space import SearchSpace, structures

#: Feasibility searches per side before giving up (each is one full search at a changed batch or GPU count).
MAX_TRIES = 6
#: Whole-node counts scanned per side for a GPU count whose layouts divide the batch: at least this many nodes,
#: or a quarter of the request's nodes.
MIN_NODE_SCAN = 64


@dataclass(frozen=True)
class NearMiss:
    """A changed job that plans: global batch (sequences), GPU count, and its best plan."""

    global_batch_size: int
    num_gpus: int
    plan: Evaluation

    @property
    def tokens_per_s(self) -> float:
        return self.plan.step.tokens_per_s


def _best(model, cluster, job, num_gpus, space, headroom, framework, solver, convention,
          at_risk_margin) -> Evaluation | None:
    from .search import run_search
    res = run_search(model, cluster, job, num_gpus, 1, space, headroom, framework, solver, convention=convention,
                     at_risk_margin=at_risk_margin)
    return res.plans[0] if res.plans else None


def _data_parallel_sizes(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                         space: SearchSpace, framework: str) -> list[int]:
    """The data-parallel sizes of the layouts of ``num_gpus`` (structures; the batch does not enter them)."""
    return sorted({st.dp for st in structures(model, cluster, job, num_gpus, _lean(space), framework)})


def _lean(space: SearchSpace) -> SearchSpace:
    """``space`` with one expert-parallel size: the data-parallel sizes of the layouts do not depend on ep (ep is
    carved from dp x cp x tp, and the first allowed ep, 1 unless pinned, exists whenever any does)."""
    return replace(space, ep=(space.ep or (1,))[:1], etp=None)


def nearest_batches(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                    space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                    framework: str = "megatron", solver: str = "cpsat", convention: FlopsConvention = "megatron",
                    lo: int = 1, hi: int | None = None, at_risk_margin: float | None = None,
                    budget: Budget | None = None,
                    progress: Progress = no_progress) -> tuple[NearMiss | None, NearMiss | None]:
    """The feasible global batches nearest to ``job.global_batch_size``, (below, above), each within [lo, hi]
    (sequences) and with its best plan (``plan``'s, at ``at_risk_margin``); None on a side where none plans within
    ``MAX_TRIES`` searches or before ``budget`` is spent."""
    budget = budget or Budget(None)
    b = job.global_batch_size
    dps = _data_parallel_sizes(model, cluster, job, num_gpus, space, framework)
    below = sorted({(b - 1) // d * d for d in dps if lo <= (b - 1) // d * d}, reverse=True)
    above = sorted({(b // d + 1) * d for d in dps if hi is None or (b // d + 1) * d <= hi})
    out = []
    for side in (below, above):
        hit = None
        for gbs in side[:MAX_TRIES]:
            if budget.spent:
                break
            progress(f"no layout divides the batch; trying global batch {gbs:,}")
            e = _best(model, cluster, job.model_copy(update={"global_batch_size": gbs}), num_gpus, space,
                      memory_headroom, framework, solver, convention, at_risk_margin)
            if e is not None:
                hit = NearMiss(gbs, num_gpus, e)
                break
        out.append(hit)
    return out[0], out[1]


def nearest_gpu_counts(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                       space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                       framework: str = "megatron", solver: str = "cpsat", convention: FlopsConvention = "megatron",
                       at_risk_margin: float | None = None, budget: Budget | None = None,
                       progress: Progress = no_progress) -> tuple[NearMiss | None, NearMiss | None]:
    """The whole-node GPU counts nearest to ``num_gpus`` (below, above) at which the job plans, each with its best
    plan; None on a side where none plans (counts whose layouts divide the batch, scanned ``MIN_NODE_SCAN`` nodes
    or a quarter of the request's nodes away, at most ``MAX_TRIES`` searches, none once ``budget`` is spent)."""
    budget = budget or Budget(None)
    gpn = cluster.node.gpus_per_node
    nodes = max(1, num_gpus // gpn)
    reach = max(MIN_NODE_SCAN, nodes // 4)
    b = job.global_batch_size
    lean = _lean(space)
    out = []
    for step in (-1, 1):
        hit, tries = None, 0
        for k in range(nodes + step, nodes + step * (reach + 1), step):
            if k < 1 or k * gpn > MAX_GPUS or tries >= MAX_TRIES or budget.spent:
                break  # none above plan3d's own GPU limit: it would be refused
            n = k * gpn
            if not any(b % st.dp == 0 for st in structures(model, cluster, job, n, lean, framework)):
                continue
            tries += 1
            progress(f"no layout divides the batch; trying {n:,} GPUs")
            e = _best(model, cluster, job, n, space, memory_headroom, framework, solver, convention, at_risk_margin)
            if e is not None:
                hit = NearMiss(b, n, e)
                break
        out.append(hit)
    return out[0], out[1]


def choose_batch(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, tolerance: float,
                 space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                 framework: str = "megatron", solver: str = "cpsat", convention: FlopsConvention = "megatron",
                 at_risk_margin: float | None = None, budget: Budget | None = None,
                 progress: Progress = no_progress) -> int | None:
    """The global batch ``plan --global-batch-size-tolerance`` plans for when the requested one does not plan:
    the nearest feasible batch within ``tolerance`` (a fraction) of the request, the higher throughput at equal
    distance; None when none plans in that window."""
    b = job.global_batch_size
    lo, hi = max(1, math.ceil(b * (1 - tolerance))), math.floor(b * (1 + tolerance))
    below, above = nearest_batches(model, cluster, job, num_gpus, space, memory_headroom, framework, solver,
                                   convention, lo, hi, at_risk_margin, budget, progress)
    hits = [h for h in (below, above) if h is not None]
    if not hits:
        return None
    return min(hits, key=lambda h: (abs(h.global_batch_size - b), -h.tokens_per_s)).global_batch_size


def describe(below: NearMiss | None, above: NearMiss | None, what: str, gpus_per_node: int) -> str:
    """One clause naming the near misses with their predicted throughput, e.g. ``nearest feasible global batches:
    1,923 (162,767 tokens/s, step 24.20 s) below, 2,564 (210,987 tokens/s, step 24.89 s) above``; ``what`` is
    "global batches" or "GPU counts"."""
    def one(h: NearMiss, side: str) -> str:
        perf = f"{h.tokens_per_s:,.0f} tokens/s, step {h.plan.step.step_s:.2f} s"
        if what == "global batches":
            return f"{h.global_batch_size:,} ({perf}) {side}"
        return f"{h.num_gpus:,} ({h.num_gpus // gpus_per_node:,} nodes; {perf}) {side}"
    parts = [one(h, side) for h, side in ((below, "below"), (above, "above")) if h is not None]
    if not parts:
        return f"no feasible {what} nearby"
    return f"nearest feasible {what}: " + ", ".join(parts)
