"""Several clusters at once: the same job planned on each, ranked in one table by time and by cost.

``--cluster dgx-h100,dgx-h200,dgx-b200`` (names or YAML paths separated by commas) is a list of alternative
clusters, each planned on its own (this module). ``--cluster dgx-h100:64,dgx-a100-80g:32`` (``name:nodes``) will
be the pools of ONE mixed-GPU cluster (issue 12); ``parse_cluster_option`` tells the two apart and refuses a mix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from .document import SCHEMA_VERSION, PlanDocument, _Strict, dumps_finite
from .errors import PlanInputError


@dataclass(frozen=True)
class ClusterChoice:
    """What ``--cluster`` names: one cluster, alternatives to compare, or the pools of one mixed cluster
    (``pools``: (name, nodes) pairs)."""

    kind: Literal["single", "alternatives", "pools"]
    names: tuple[str, ...]
    pools: tuple[tuple[str, int], ...] = ()


def parse_cluster_option(value: str | None) -> ClusterChoice:
    """Split ``--cluster``: ``a`` is one cluster, ``a,b,c`` alternatives, ``a:64,b:32`` pools of one cluster
    (name:nodes). Raises ``PlanInputError`` for an empty entry, a repeated name, a bad node count, or a list
    mixing plain names with name:nodes entries (ambiguous)."""
    if value is None or ("," not in value and ":" not in value):
        return ClusterChoice("single", () if value is None else (value,))
    entries = [e.strip() for e in value.split(",")]
    if any(not e for e in entries):
        raise PlanInputError(f"--cluster {value!r}: empty entry; give NAME[,NAME...] to compare clusters or "
                             f"NAME:NODES[,NAME:NODES...] for the pools of one cluster")
    pooled = [":" in e for e in entries]
    if any(pooled) and not all(pooled):
        raise PlanInputError(f"--cluster {value!r} mixes names and NAME:NODES pools: give NAME,NAME,... to compare "
                             f"clusters, or NAME:NODES for every pool of one mixed cluster")
    if len(set(e.split(":")[0] for e in entries)) != len(entries):
        raise PlanInputError(f"--cluster {value!r}: a cluster is named twice")
    if not all(pooled):
        return ClusterChoice("alternatives", tuple(entries))
    from cluster_specs import ClusterSpecError
    from cluster_specs.pools import parse_pools
    try:
        pools = parse_pools(value)
    except ClusterSpecError as e:
        raise PlanInputError(str(e)) from None
    return ClusterChoice("pools", tuple(n for n, _ in pools), tuple(pools))


class ComparisonRow(_Strict):
    """One cluster of a comparison: its plan document (best plan first, each with its ``cost``) or why it has
    none, and its rank by effective days and by US dollars (None without a plan or a price)."""

    cluster: str
    rank_by_time: int | None
    rank_by_cost: int | None
    reason: str | None = Field(description="why the cluster has no plan (None when it has one)")
    document: PlanDocument | None


class ComparisonDocument(_Strict):
    """``plan3d plan --cluster A,B,C --train-tokens T --format json``: rows in rank order (by cost with
    ``--objective cost``, else by time); clusters without a plan last."""

    schema_version: str = SCHEMA_VERSION
    model: str
    train_tokens: float
    objective: str
    deadline_days: float | None
    rows: list[ComparisonRow]

    def model_dump_json(self, **kwargs: Any) -> str:
        """Deterministic, strict JSON (as ``PlanDocument.model_dump_json``: a non-finite number is an internal error
        naming the field)."""
        return super().model_dump_json(**kwargs) if kwargs else dumps_finite(self.model_dump(mode="json"),
                                                                             "comparison document", indent=2) + "\n"


def _ranks(values: list[float | None]) -> list[int | None]:
    order = sorted((v, i) for i, v in enumerate(values) if v is not None)
    out: list[int | None] = [None] * len(values)
    for r, (_, i) in enumerate(order, 1):
        out[i] = r
    return out


def build_comparison(model_name: str, objective: str, train_tokens: float, deadline_days: float | None,
                     results: list[tuple[str, PlanDocument | None, str | None]]) -> ComparisonDocument:
    """Rank ``results`` ((cluster, document or None, reason)) by the best plan's effective days and dollars."""
    best = [d.plans[0].cost if d is not None and d.plans else None for _, d, _ in results]
    by_time = _ranks([c.effective_days if c else None for c in best])
    by_cost = _ranks([c.usd if c else None for c in best])
    rows = [ComparisonRow(cluster=name, rank_by_time=t, rank_by_cost=u, reason=why, document=doc)
            for (name, doc, why), t, u in zip(results, by_time, by_cost)]
    key = (lambda r: (r.rank_by_cost is None, r.rank_by_cost or 0, r.rank_by_time or 0)) if objective == "cost" \
        else (lambda r: (r.rank_by_time is None, r.rank_by_time or 0))
    rows.sort(key=key)
    return ComparisonDocument(model=model_name, train_tokens=train_tokens, objective=objective,
                              deadline_days=deadline_days, rows=rows)
