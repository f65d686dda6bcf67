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

from functools import lru_cache, wraps
from importlib import import_module
from inspect import isfunction
from typing import Any, Callable

_EXPORTS = {
    "plan": "api", "evaluate": "api", "memory": "api", "explain": "api", "validate": "api",
    "load_inputs": "api", "parallel_config": "api", "check_launchable": "api", "launchable_pins": "api",
    "Inputs": "api", "SearchStats": "api",
    "MemoryReport": "api", "ExplainReport": "api", "compare": "api", "cost_sweep": "api",
    "ComparisonDocument": "comparison", "sweep": "sweeps", "Grid": "sweeps", "SweepRow": "sweeps",
    "PlanDocument": "document", "PlanInputError": "errors", "NoFeasiblePlan": "errors",
    "plan_pools": "pools", "PoolsDocument": "pools", "fallback": "fallback_plans", "FallbackDocument": "fallback_plans",
}
_FOREIGN = {"ModelSpecError": "model_zoo", "ClusterSpecError": "cluster_specs"}

__all__ = sorted([*_EXPORTS, *_FOREIGN])


def _plain(value: Any) -> Any:
    """A numpy scalar (``np.int64(16)``, ``np.True_``) as the Python number or bool it holds; anything else as is."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


@lru_cache(maxsize=None)
def _api_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking numpy scalars for its options as the Python numbers they hold (the API's checks are exact about
    types: ``bool("false")`` is no false and ``np.int64`` no ``int``)."""
    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*(_plain(a) for a in args), **{k: _plain(v) for k, v in kwargs.items()})
    return call


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        obj = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        return _api_function(obj) if isfunction(obj) else obj
    if name in _FOREIGN:
        return getattr(import_module(_FOREIGN[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
