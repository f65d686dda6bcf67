"""The plausible range of a fitted step-time constant (``FitRange``), declared next to the constant.

Every constant of the step-time model that is fitted on published runs (``planner/calibration.py``) is a physical
quantity; its module lists it in ``FIT_RANGES`` (constant name, or ``NAME.key`` for one entry of a dict constant)
with the range the fit may use and where that range comes from. The fit never leaves the range.
"""
from __future__ import annotations

from typing import NamedTuple


class FitRange(NamedTuple):
    """``low`` <= value <= ``high`` in ``unit``; ``source``: why this range is physical (paper, datasheet, count).
    ``tied``: other entries of the same dict constant that always take the same value (e.g. NeMo = Megatron)."""

    low: float
    high: float
    unit: str
    source: str
    tied: tuple[str, ...] = ()
