"""plan3d's planner: search, constraints, ranking, documents, emitters, and the Python API.

The API (``planner.api``, re-exported here) is what the ``plan3d`` CLI is built on::

    import planner
    doc = planner.plan("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048, seq_length=8192)
    doc.plans[0].parallel          # tp, pp, dp, cp, ep, vpp, micro_batch_size, zero_stage, ...
    doc.model_dump_json()          # byte-identical to ``plan3d plan ... --format json``
    planner.evaluate("llama3.1-70b", gpus=64, tp=8, pp=2, zero_stage=1)
    planner.memory("llama3.1-8b", gpus=8, micro_batch_size=2).estimate.peak_bytes
    planner.explain("llama3.1-405b", gpus=8).raise_if_infeasible()   # NoFeasiblePlan naming what binds
    planner.validate().mape
    planner.sweep({"models": ["llama3.1-8b"], "clusters": ["dgx-h100"], "gpus": [8, 16]})  # list[SweepRow]

Names are imported lazily, so ``import planner`` (and the CLI's start-up) stays light.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "plan": "api", "evaluate": "api", "memory": "api", "explain": "api", "validate": "api",
    "load_inputs": "api", "parallel_config": "api", "check_launchable": "api", "Inputs": "api", "SearchStats": "api",
    "MemoryReport": "api", "ExplainReport": "api", "compare": "api", "cost_sweep": "api",
    "ComparisonDocument": "comparison", "sweep": "sweeps", "Grid": "sweeps", "SweepRow": "sweeps",
    "PlanDocument": "document", "PlanInputError": "errors", "NoFeasiblePlan": "errors",
    "plan_pools": "pools", "PoolsDocument": "pools", "fallback": "fallback_plans", "FallbackDocument": "fallback_plans",
}
_FOREIGN = {"ModelSpecError": "model_zoo", "ClusterSpecError": "cluster_specs"}

__all__ = sorted([*_EXPORTS, *_FOREIGN])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _FOREIGN:
        return getattr(import_module(_FOREIGN[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
