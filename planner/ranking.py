"""The one ranking of plans, shared by the enumerator (``planner.search``) and the solver (``planner.solver``).

Order (deterministic, so the same input always gives byte-identical JSON):

* ``throughput`` (default): higher tokens/s first; ties by lower peak memory (bytes), then by the configuration's
  knobs in a fixed order (``config_key``: smaller tp, pp, cp, ep, vpp first, larger micro-batch, lower ZeRO
  stage, less recompute, sequence parallel on, ...).
* ``headroom``: among the plans within ``within`` (a fraction) of the best step time, lower peak memory first,
  then the throughput order.
* closest infeasible layouts (when nothing fits): smallest memory excess (bytes), then ``config_key``.
"""
from __future__ import annotations

from typing import Sequence

from cost_models.config import ParallelConfig

from .evaluation import Evaluation

RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
OBJECTIVES = ("throughput", "headroom")


def config_key(p: ParallelConfig) -> tuple:
    """Stable tie-break key of a configuration (smaller = preferred at equal throughput and memory). Total over the
    searched knobs: two distinct candidates of the space never share a key."""
    return (p.tp, p.pp, p.cp, p.ep, p.vpp, -p.micro_batch_size, p.zero_stage, RECOMPUTE_ORDER[p.recompute],
            not p.sequence_parallel, p.dp, p.expert_tp, p.first_stage_layers or 0, p.last_stage_layers or 0,
            p.account_for_embedding_in_pipeline_split, p.recompute_num_layers or 0, p.schedule or "")


def rank_key(e: Evaluation) -> tuple:
    """Throughput order of a feasible evaluation: (-tokens/s rounded to 1e-6, peak bytes, ``config_key``)."""
    return (-round(e.step.tokens_per_s, 6), round(e.memory.peak_bytes), config_key(e.parallel))


def headroom_key(e: Evaluation) -> tuple:
    """Headroom order: lower peak bytes first, then ``rank_key``."""
    return (round(e.memory.peak_bytes), rank_key(e))


def nearest_key(excess_bytes: float, p: ParallelConfig) -> tuple:
    """Order of the closest infeasible layouts: smallest memory excess (bytes), then ``config_key``."""
    return (excess_bytes, config_key(p))


def rank_plans(feasible: Sequence[Evaluation], top_k: int, objective: str = "throughput",
               within: float = 0.05) -> list[Evaluation]:
    """The ``top_k`` best of ``feasible`` under ``objective`` (module docstring). ``within`` (fraction of the best
    step time) applies to ``headroom`` only.

    Raises:
        ValueError: unknown objective.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: allowed {', '.join(OBJECTIVES)}")
    if objective == "headroom" and feasible:
        best = min(e.step.step_s for e in feasible)
        keep = [e for e in feasible if e.step.step_s <= best * (1 + within)]
        return sorted(keep, key=headroom_key)[:top_k]
    return sorted(feasible, key=rank_key)[:top_k]
