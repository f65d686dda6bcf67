"""Explanations: every constraint of a given configuration with its slack (``plan3d explain``), and, when no
plan fits, which constraint binds, by how much, and the nearest changes that make the job feasible.
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM, Constraint, constraint_report
from .evaluate import Evaluation, evaluate


@dataclass
class Explanation:
    """A configuration's evaluation and all its constraints (satisfied and violated) with their slack."""

    evaluation: Evaluation
    constraints: list[Constraint]

    @property
    def binding(self) -> Constraint | None:
        """The violated constraint to fix first (structural before memory), else the tightest memory stage."""
        bad = [c for c in self.constraints if not c.ok]
        if bad:
            return bad[0]
        mem = [c for c in self.constraints if c.unit == "bytes"]
        return min(mem, key=lambda c: c.slack) if mem else None


def explain_config(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, num_gpus: int,
                   memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str = "megatron") -> Explanation:
    """Evaluate ``par`` and list every constraint with its slack."""
    ev = evaluate(model, cluster, job, par, num_gpus, memory_headroom, framework)
    cons = constraint_report(model, cluster, job, par, num_gpus, ev.memory, memory_headroom, framework)
    return Explanation(ev, cons)


def format_slack(c: Constraint) -> str:
    """Human slack: GiB for bytes, plain numbers otherwise."""
    if c.unit == "bytes":
        return f"{c.slack / 2**30:+.2f} GiB"
    if c.unit in ("", "remainder"):
        return "0" if c.ok else f"{c.slack:+g}"
    return f"{c.slack:+g} {c.unit}"


def explanation_rows(ex: Explanation) -> list[dict]:
    """JSON-ready rows, one per constraint (stable order)."""
    return [{"name": c.name, "ok": c.ok, "slack": c.slack, "unit": c.unit, "detail": c.detail} for c in ex.constraints]
