"""Exhaustive search (the enumerator): every candidate of the space, memory-filtered, ranked by throughput.

Ranking key (deterministic): higher tokens/s first; ties broken by lower peak memory, then by the
configuration's knobs in a fixed order, so the same input always gives the same order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from cost_models.memory import estimate_memory
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM
from .evaluate import Evaluation, evaluate
from .space import SearchSpace, candidates

RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


def config_key(p: ParallelConfig) -> tuple:
    """Stable tie-break key of a configuration (smaller = preferred at equal throughput)."""
    return (p.tp, p.pp, p.cp, p.ep, p.vpp, -p.micro_batch_size, p.zero_stage, RECOMPUTE_ORDER[p.recompute],
            not p.sequence_parallel, p.dp)


def rank_key(e: Evaluation) -> tuple:
    return (-round(e.step.tokens_per_s, 6), round(e.memory.peak_bytes), config_key(e.parallel))


@dataclass
class SearchResult:
    """Top plans (best first), how many candidates were examined, and the closest infeasible ones."""

    plans: list[Evaluation]
    num_candidates: int
    num_feasible: int
    nearest_infeasible: list[Evaluation]


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, top_k: int = 5,
                    space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                    framework: str = "megatron", convention: FlopsConvention = "megatron",
                    progress: Callable[[int], None] | None = None) -> SearchResult:
    """Evaluate every candidate; keep the ``top_k`` feasible ones by throughput."""
    feasible: list[Evaluation] = []
    near: list[tuple[float, Evaluation]] = []
    n = 0
    limit = cluster.gpu.memory_bytes * (1 - memory_headroom)
    for par in candidates(model, cluster, job, num_gpus, space):
        n += 1
        if progress and n % 256 == 0:
            progress(n)
        if framework == "deepspeed" and par.pp > 1 and par.zero_stage >= 2:
            continue
        mem = estimate_memory(model, cluster, job, par)
        if mem.peak_bytes > limit:
            near.append((mem.peak_bytes - limit, par))
            continue
        ev = evaluate(model, cluster, job, par, num_gpus, memory_headroom, framework, convention)
        if ev.feasible:
            feasible.append(ev)
    feasible.sort(key=rank_key)
    near.sort(key=lambda x: (x[0], config_key(x[1])))
    nearest = [evaluate(model, cluster, job, p, num_gpus, memory_headroom, framework, convention)
               for _, p in near[:3]]
    return SearchResult(feasible[:top_k], n, len(feasible), nearest)
