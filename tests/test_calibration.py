"""The constants' fit (``planner/calibration.py``): a function of the rows and the documented ranges alone."""
from __future__ import annotations

import pytest

from planner.calibration import GRID_POINTS, REFINE_LEVELS, RowErrors, current_values, fit, parameters
from planner.published_rows import load_rows

#: two small dense groups (13 rows): enough for the fit to move the GEMM, attention and elementwise constants
GROUPS = ("bloom", "megatron_sc21_table1")


@pytest.fixture()
def restored():
    params = parameters()
    shipped = current_values(params)
    yield params
    for p in params:
        p.set(shipped[p.name])


def _fit(params) -> dict[str, float]:
    rows = [r for r in load_rows(None) if r["source"]["group"] in GROUPS]
    data = RowErrors.of(rows)
    data.find_dependencies(params)
    return fit(data, range(len(data.rows)), params)


def test_fit_does_not_depend_on_the_shipped_constants(restored):
    params = restored
    first = _fit(params)
    # move every shipped constant to an end of its range: the dependencies and the fit must not see it
    for i, p in enumerate(params):
        p.set(p.bounds.low if i % 2 else p.bounds.high)
    assert _fit(params) == first
    for p in params:
        assert p.bounds.low <= first[p.name] <= p.bounds.high, p.name


def test_fit_resolves_a_96th_of_each_range():
    # 13 grid points (12 steps) and three bisections: the finest step is 1/96 of the range
    assert (GRID_POINTS - 1) * 2 ** REFINE_LEVELS == 96


def test_cross_validation_is_the_same_in_worker_processes():
    # the folds are independent fits: run in two spawned processes, they give the serial result exactly (and
    # the parent's constants come back unchanged)
    from planner.calibration import cross_validate
    rows = [r for r in load_rows(None) if r["source"]["group"] in GROUPS]
    before = current_values()
    serial = cross_validate(rows, workers=1)
    parallel = cross_validate(rows, workers=2)
    assert parallel.logo == serial.logo
    assert parallel.folds == serial.folds
    assert list(parallel.folds) == sorted(GROUPS)
    assert current_values() == before
    with pytest.raises(ValueError, match="workers"):
        cross_validate(rows, workers=0)
