"""ZB-V op order (Qi et al., "Pipeline Parallelism with Controllable Memory", arXiv 2405.15362; the V-shape
zero-bubble schedule of "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, Sec. 6).

Transcribed from torch's ``ScheduleZBVZeroBubble._calculate_single_rank_operations``
(``torch/distributed/pipelining/schedules.py``, torch 2.13), which torchtitan runs as ``ZBVZeroBubble``: ``p``
ranks, ``2p`` stages in a V (rank ``r`` holds stages ``r`` and ``2p-1-r``), the backward split into input gradient
``I`` and weight gradient ``W``. Warm-up ``2(p-r)-1`` forwards of chunk 0, ``r`` pairs (F1, F0), ``p-r`` triples
(F1, I1, W1); steady state F0 I0 W0 F1 I1 W1; cool-down ``r`` pairs (I0, I1), ``p-r`` pairs (I0, W0), then the
remaining W. The order is built for ``max(2p-1, m)`` micro-batches and the ops of micro-batches ``>= m`` are
dropped, as torch does.

With ``F = I = W`` no rank idles once it has started (the paper's "zero bubble", across steps with its optimizer
post-validation); per step the ``(p-1) F`` start-up of the parallelogram remains (tests/test_schedules.py).
Activation memory as 1F1B (``2p`` half-stage chunks = ``p`` micro-batches of a whole rank's layers).
"""
from __future__ import annotations

from functools import lru_cache

from .dualpipe import dualpipev_placement
from .pipeline_ops import OpT, Placement


def zbv_placement(p: int) -> Placement:
    """The V: stage k on rank k for k < p, else on rank 2p-1-k (torch ``generate_stage_to_rank_mapping``
    style "v")."""
    return dualpipev_placement(p)


def _rank_ops(p: int, n: int, r: int) -> list[OpT]:
    s0, s1 = r, 2 * p - 1 - r
    ops: list[OpT] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):
        ops.append(("F", s0, f0))
        f0 += 1
    for _ in range(r):
        ops += [("F", s1, f1), ("F", s0, f0)]
        f1 += 1
        f0 += 1
    for _ in range(p - r):
        ops += [("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        f1 += 1
        b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append(("F", s0, f0))
            f0 += 1
        ops += [("I", s0, b0), ("W", s0, b0), ("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        b0 += 1
        f1 += 1
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(r):
        ops += [("I", s0, b0), ("I", s1, b1)]
        b0 += 1
        b1 += 1
    for _ in range(p - r):
        ops += [("I", s0, b0), ("W", s0, w0)]
        b0 += 1
        w0 += 1
    ops += [("W", s1, k) for k in range(w1, b1)]
    ops += [("W", s0, k) for k in range(w0, b0)]
    return ops


@lru_cache(maxsize=64)
def zbv_orders(p: int, m: int) -> tuple[tuple[OpT, ...], ...]:
    """Per-rank op orders of ZB-V on ``p`` ranks (``2p`` stages) with ``m`` micro-batches.

    Raises:
        ValueError: ``p`` or ``m`` below 1.
    """
    if p < 1 or m < 1:
        raise ValueError(f"ZB-V needs pp >= 1 and micro-batches >= 1, got pp {p}, m {m}")
    n = max(2 * p - 1, m)
    return tuple(tuple(op for op in _rank_ops(p, n, r) if op[2] < m) for r in range(p))
