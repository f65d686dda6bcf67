"""Pipeline-parallel schedules: bubble fraction (closed forms, formulas.md Sec. 5).

Bubble ratio (idle / ideal compute) for ``p`` stages, ``m`` micro-batches, ``v`` chunks per rank:
GPipe and 1F1B ``(p-1)/m`` (Huang et al. 2019; Narayanan et al. SC21 Sec. 2.2.1), interleaved 1F1B
``(p-1)/(v*m)`` (SC21 Sec. 2.2.2), ZB-H1 ``(p-1)/(3m)`` when ``t_F = t_B = t_W`` (Qi et al. 2024, Table 1).
"""
from __future__ import annotations

from .config import Schedule


def bubble_ratio(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> float:
    """Pipeline idle time divided by ideal compute time (dimensionless)."""
    if pp <= 1 or m <= 0:
        return 0.0
    if schedule == "interleaved":
        return (pp - 1) / (vpp * m)
    if schedule == "zb-h1":
        return (pp - 1) / (3 * m)
    return (pp - 1) / m


def bubble_fraction(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> float:
    """Fraction of the pipeline's total time that is bubble: ``r / (1 + r)`` with ``r`` the bubble ratio."""
    r = bubble_ratio(schedule, pp, m, vpp)
    return r / (1 + r)
