"""Fit the step-time model's physical constants on published runs, and measure how well they generalise.

The fitted constants are the entries of the ``FIT_RANGES`` tables of the cost-model modules (``cost_models/gemm.py``,
``attention.py``, ``elementwise.py``, ``collectives.py``, ``moe_overhead.py``): each a physical quantity with the
range it may take and why (``cost_models.fit_range.FitRange``). The fit never leaves those ranges.

Fit: coordinate descent. The first sweep scans each constant's bounded grid (``GRID_POINTS`` evenly spaced points of its
range, plus its current value); later sweeps try one grid step either side of the current value; every sweep then
bisects around the best point ``REFINE_LEVELS`` times (half, a quarter and an eighth of a grid step either side), so
that the fit resolves 1/96 of each range. Sweeps run until no constant moves (at most ``ROUNDS``), started from the
middle of every range (``start_at_midpoints``), minimising the mean of the per-source-group MAPEs plus half the overall
MAPE (so that a large group does not drown a small one). Each row's prediction is recomputed only when a constant it
depends on changes (found once by perturbing each constant), and each (row, constants) pair only once across the folds
(``RowErrors.predict``) within a process. The folds are independent and run in parallel processes
(``cross_validate``'s ``workers``): a full cross-validation takes 170 s on one core, 97 s on two (2026-12-04).

Leave-one-source-group-out (LOGO) cross-validation: for every source group, the constants are refitted on the
other groups, from the middle of their ranges (not from the shipped values, which the held-out group helped fit: a
coordinate descent may stay in the basin it starts in; a constant that no other group's row depends on stays at
the middle of its range), and the group is predicted with them. The shipped constants are the same fit on all
rows (``benchmarks/fit_step_time.py`` prints both). The LOGO MAPE is the error
a new run from an unseen source can expect; the in-sample MAPE (the shipped constants on all rows) is the error
on the rows the constants were fitted on.
"""
from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

from cost_models import attention, collectives, elementwise, gemm, moe_overhead
from cost_models.fit_range import FitRange

from .validation import MIN_GROUP_ROWS, validate_row

#: Modules whose ``FIT_RANGES`` list the fitted constants.
FITTED_MODULES: tuple[ModuleType, ...] = (gemm, attention, elementwise, collectives, moe_overhead)
#: Grid points per constant's range in the first coordinate-descent sweep (plus the current value). 13 points and three
#: bisections resolve 1/96 of a range: the in-sample fit then moves by less than 0.01 MAPE points against 25 points
#: (5.254% / 5.258%, the constants within a grid step of each other), where 7 points and one bisection (1/24 of a
#: range, before 2026-12-04) stopped 0.03 points short and left the folds of the cross-validation in coarser minima
#: (LOGO 6.67% against 6.55%). Later sweeps search only one grid step either side of the current value (the
#: constants then creep along the valley KAPPA and POWER_CLOCK_EXPONENT make together): the same fits in half the
#: time as a full grid every sweep (cross-validation 160 s against 340 s on one core; LOGO 6.54% against 6.55%).
GRID_POINTS = 13
#: Bisections around a sweep's best grid point (half, a quarter, an eighth of a grid step either side).
REFINE_LEVELS = 3
#: Most coordinate-descent sweeps over all constants (the fit stops at the first sweep that moves none).
ROUNDS = 10


@dataclass(frozen=True)
class Parameter:
    """One fitted constant: ``module.attr`` (a number) or ``module.attr[key]`` (+ its ``tied`` keys)."""

    name: str
    module: ModuleType
    attr: str
    key: str | None
    bounds: FitRange

    def get(self) -> float:
        v = getattr(self.module, self.attr)
        return float(v[self.key]) if self.key is not None else float(v)

    def set(self, value: float) -> None:
        if self.key is None:
            setattr(self.module, self.attr, value)
            return
        d = getattr(self.module, self.attr)
        for k in (self.key, *self.bounds.tied):
            d[k] = value

    def grid(self, n: int = GRID_POINTS) -> list[float]:
        lo, hi = self.bounds.low, self.bounds.high
        pts = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
        return sorted({float(f"{p:.6g}") for p in pts} | {self.get()})


def parameters() -> list[Parameter]:
    """The fitted constants of the step-time model, in module order."""
    out = []
    for mod in FITTED_MODULES:
        for name, rng in getattr(mod, "FIT_RANGES", {}).items():
            attr, _, key = name.partition(".")
            out.append(Parameter(name, mod, attr, key or None, rng))
    return out


def start_at_midpoints(params: Sequence[Parameter]) -> None:
    """Set every constant of ``params`` to the middle of its range: the fit's starting point, which carries no
    information from any row."""
    for p in params:
        p.set(float(f"{p.bounds.low + (p.bounds.high - p.bounds.low) / 2:.6g}"))


def current_values(params: Sequence[Parameter] | None = None) -> dict[str, float]:
    """``{name: value}`` of the constants as they are now (the shipped values unless overridden)."""
    return {p.name: p.get() for p in (params if params is not None else parameters())}


@contextmanager
def constants(values: dict[str, float], params: Sequence[Parameter] | None = None) -> Iterator[None]:
    """Run the step-time model with ``values`` for the named constants, restoring them afterwards."""
    params = list(params if params is not None else parameters())
    saved = current_values(params)
    by_name = {p.name: p for p in params}
    try:
        for k, v in values.items():
            by_name[k].set(v)
        yield
    finally:
        for p in params:
            p.set(saved[p.name])


@dataclass
class RowErrors:
    """The evaluable rows of a dataset and their signed errors (predicted / measured - 1) under the constants as
    they are now; ``refresh`` re-predicts only the rows that depend on a given constant."""

    rows: list[dict[str, Any]]
    ids: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    depends: dict[str, list[int]] = field(default_factory=dict)
    #: errors already computed, by (row index, the fitted constants' values)
    _memo: dict[tuple[int, tuple[float, ...]], float] = field(default_factory=dict, repr=False)
    _param_list: list[Parameter] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, rows: Sequence[dict[str, Any]]) -> "RowErrors":
        out = cls([])
        for r in rows:
            res = validate_row(r, check_feasibility=False)
            if res.error is None:
                continue
            out.rows.append(r)
            out.ids.append(res.id)
            out.groups.append(res.group)
            out.errors.append(res.error)
        return out

    def predict(self, idx: Sequence[int]) -> None:
        """Re-predict the rows ``idx`` under the constants as they are now. A row's error depends only on the
        fitted constants' values, so each (row, values) is computed once: the folds of a cross-validation revisit
        the same values (each starts from the middle of the ranges and sweeps the same grids)."""
        values = tuple(p.get() for p in self._params())
        for i in idx:
            key = (i, values)
            err = self._memo.get(key)
            if err is None:
                err = self._memo[key] = validate_row(self.rows[i], check_feasibility=False).error
            self.errors[i] = err

    def _params(self) -> list[Parameter]:
        if self._param_list is None:
            self._param_list = parameters()
        return self._param_list

    def find_dependencies(self, params: Sequence[Parameter]) -> None:
        """For each constant, the rows whose prediction moves when it moves to either end of its range, with the
        other constants at the middle of their ranges (the fits' starting point), all at the low ends and all at the
        high ends: a term such as the host time the GPU hides moves only where it outlasts the GPU time. The contexts
        do not include the shipped values, so that a fit (and each cross-validation fold) is a function of the rows
        and the ranges alone."""
        saved = current_values(params)
        base_errors = list(self.errors)
        moved: dict[str, set[int]] = {p.name: set() for p in params}
        try:
            for context in ("midpoints", "low", "high"):
                if context == "midpoints":
                    start_at_midpoints(params)
                else:
                    for q in params:
                        q.set(q.bounds.low if context == "low" else q.bounds.high)
                values = current_values(params)
                self.predict(range(len(self.rows)))
                base = list(self.errors)
                for p in params:
                    for probe in (p.bounds.low, p.bounds.high):
                        if probe == values[p.name]:
                            continue
                        p.set(probe)
                        self.predict(range(len(self.rows)))
                        moved[p.name] |= {i for i, (a, b) in enumerate(zip(base, self.errors)) if abs(a - b) > 1e-12}
                    p.set(values[p.name])
        finally:
            for p in params:
                p.set(saved[p.name])
            self.errors = base_errors
        for p in params:
            self.depends[p.name] = sorted(moved[p.name])


def mape(errors: Sequence[float]) -> float:
    """Mean absolute percentage error of signed fractional errors (NaN for none)."""
    return 100.0 * sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


def group_mapes(ids_groups: Sequence[str], errors: Sequence[float]) -> dict[str, tuple[int, float]]:
    """``{group: (rows, MAPE)}`` sorted by group."""
    by: dict[str, list[float]] = {}
    for g, e in zip(ids_groups, errors):
        by.setdefault(g, []).append(e)
    return {g: (len(v), mape(v)) for g, v in sorted(by.items())}


def objective(groups: Sequence[str], errors: Sequence[float]) -> float:
    """Mean of the per-group MAPEs plus half the overall MAPE (percent)."""
    gm = group_mapes(groups, errors)
    return sum(m for _, m in gm.values()) / len(gm) + 0.5 * mape(errors)


def fit(data: RowErrors, train: Sequence[int], params: Sequence[Parameter], rounds: int = ROUNDS,
        progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """Coordinate descent of ``params`` (bounded grids) on the rows ``train`` of ``data``, from the middle of every
    range (``start_at_midpoints``); leaves the constants set to the best values found and ``data.errors`` current for
    them. Returns the fitted values."""
    train = list(train)
    tset = set(train)
    groups = [data.groups[i] for i in train]

    def score() -> float:
        return objective(groups, [data.errors[i] for i in train])

    start_at_midpoints(params)
    for rnd in range(rounds):
        # every training row at the current constants: a dependency found by probing the range ends can miss a
        # row that moves only at other points (a max(0, .) term), whose error would otherwise go stale
        data.predict(train)
        best = score()
        changed = False
        for p in params:
            dep = [i for i in data.depends.get(p.name, range(len(data.rows))) if i in tset]
            if not dep:
                continue
            v0 = p.get()
            best_v = v0

            def trial(v: float) -> None:
                nonlocal best, best_v
                if v == v0 or not p.bounds.low <= v <= p.bounds.high:
                    return
                p.set(v)
                data.predict(dep)
                s = score()
                if s < best - 1e-9:
                    best, best_v = s, v

            step = (p.bounds.high - p.bounds.low) / (GRID_POINTS - 1)
            # the whole grid in the first sweep, one grid step either side of the current value after it
            for v in (p.grid() if rnd == 0 else (float(f"{v0 - step:.6g}"), float(f"{v0 + step:.6g}"))):
                trial(v)
            # bisections: half, a quarter, an eighth of a grid step either side of the best point, inside the range
            for _ in range(REFINE_LEVELS):
                step /= 2
                centre = best_v
                for v in (centre - step, centre + step):
                    trial(float(f"{v:.6g}"))
            p.set(best_v)
            data.predict(dep)
            changed |= best_v != v0
            if progress is not None:
                progress(f"round {rnd + 1}: {p.name} = {best_v:g} (objective {best:.3f})")
        if not changed:
            break
    return current_values(params)


@dataclass
class CrossValidation:
    """In-sample and leave-one-source-group-out errors per row, and the constants each fold was fitted to."""

    ids: list[str]
    groups: list[str]
    in_sample: list[float]
    logo: list[float]
    shipped: dict[str, float]
    folds: dict[str, dict[str, float]]

    @property
    def in_sample_mape(self) -> float:
        return mape(self.in_sample)

    @property
    def logo_mape(self) -> float:
        return mape(self.logo)

    def group_table(self) -> dict[str, tuple[int, float, float]]:
        """``{group: (rows, in-sample MAPE, LOGO MAPE)}``."""
        ins = group_mapes(self.groups, self.in_sample)
        lg = group_mapes(self.groups, self.logo)
        return {g: (n, m, lg[g][1]) for g, (n, m) in ins.items()}

    def failures(self, max_mape: float, max_group_mape: float, min_group_rows: int = MIN_GROUP_ROWS) -> list[str]:
        """Threshold violations of the LOGO MAPE, overall and per group with >= ``min_group_rows`` rows."""
        msgs = []
        if self.logo_mape > max_mape:
            msgs.append(f"cross-validated (LOGO) MAPE {self.logo_mape:.2f}% > {max_mape:g}%")
        for g, (n, _, m) in self.group_table().items():
            if n >= min_group_rows and m > max_group_mape:
                msgs.append(f"group {g} cross-validated MAPE {m:.2f}% > {max_group_mape:g}%")
        return msgs

    def annotate(self, report: dict[str, Any]) -> dict[str, Any]:
        """Add the cross-validation to a ``plan3d validate`` JSON report (``ValidationReport.to_dict``):
        ``cross_validated_mape_percent`` {overall, groups} next to ``mape_percent``, each group's
        ``cross_validated_mape_percent`` and each row's ``cross_validated_error`` (predicted / measured - 1 with the
        constants fitted without the row's group)."""
        table = self.group_table()
        report["cross_validated_mape_percent"] = {"overall": self.logo_mape,
                                                  "groups": {g: m for g, (_, _, m) in table.items()}}
        for g, entry in report.get("groups", {}).items():
            if g in table:
                entry["cross_validated_mape_percent"] = table[g][2]
        err = dict(zip(self.ids, self.logo))
        for row in report.get("rows", []):
            if row.get("id") in err:
                row["cross_validated_error"] = err[row["id"]]
        return report


def _fold(data: RowErrors, params: Sequence[Parameter], shipped: dict[str, float], group: str,
          rounds: int) -> tuple[dict[str, float], dict[int, float]]:
    """One LOGO fold: fit ``params`` on every group but ``group`` (from the middle of the ranges: the shipped values
    carry the held-out group's evidence) and predict ``group``'s rows with them. Returns the fitted values and the
    held-out rows' errors by row index; leaves the constants at ``shipped`` and ``data.errors`` as it found them."""
    train = [i for i, x in enumerate(data.groups) if x != group]
    test = [i for i, x in enumerate(data.groups) if x == group]
    errors = list(data.errors)
    try:
        values = fit(data, train, params, rounds)
        data.predict(test)
        return values, {i: data.errors[i] for i in test}
    finally:
        for p in params:
            p.set(shipped[p.name])
        data.errors = errors


#: The fold worker's copy of the rows, their errors and dependencies (``_init_fold_worker``).
_WORKER: RowErrors | None = None


def _init_fold_worker(rows: list[dict[str, Any]], ids: list[str], groups: list[str], errors: list[float],
                      depends: dict[str, list[int]], memo: dict[tuple[int, tuple[float, ...]], float],
                      values: dict[str, float]) -> None:
    """Give a spawned fold worker the parent's rows, their errors, dependencies and memoised predictions
    (``RowErrors``), and the parent's constants."""
    global _WORKER
    _WORKER = RowErrors(rows=rows, ids=ids, groups=groups, errors=errors, depends=depends, _memo=memo)
    for p in parameters():
        p.set(values[p.name])


def _run_fold_in_worker(group: str, rounds: int) -> tuple[str, dict[str, float], dict[int, float]]:
    """Run one fold in a worker set up by ``_init_fold_worker``; returns (group, fitted values, held-out errors)."""
    assert _WORKER is not None, "fold worker not initialised"
    params = parameters()
    values, held_out = _fold(_WORKER, params, current_values(params), group, rounds)
    return group, values, held_out


def default_workers(folds: int) -> int:
    """Processes for ``folds`` folds: one per CPU this process may use (``os.sched_getaffinity`` where the platform
    has it, else ``os.cpu_count``), at most one per fold."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(folds, cpus))


def cross_validate(rows: Sequence[dict[str, Any]], rounds: int = ROUNDS,
                   fold_progress: Callable[[str, int, int], None] | None = None,
                   workers: int | None = None) -> CrossValidation:
    """LOGO cross-validation of the fitted constants over the source groups of ``rows`` (see module docstring).

    The folds are independent fits, so they run in ``workers`` processes (default ``default_workers``: one per
    CPU, at most one per fold; 1 runs them in this process). The result does not depend on ``workers``: each fold
    is a function of the rows and the ranges alone. ``fold_progress(group, done, total)`` is called as each fold
    finishes (``done`` folds of ``total``). The constants are restored to their shipped values afterwards.

    Raises:
        ValueError: ``workers`` below 1.
    """
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    params = parameters()
    shipped = current_values(params)
    data = RowErrors.of(rows)
    in_sample = list(data.errors)
    data.find_dependencies(params)
    names = sorted(set(data.groups))
    workers = default_workers(len(names)) if workers is None else workers
    logo = [math.nan] * len(data.rows)
    folds: dict[str, dict[str, float]] = {}

    def done(group: str, values: dict[str, float], held_out: dict[int, float]) -> None:
        folds[group] = values
        for i, e in held_out.items():
            logo[i] = e
        if fold_progress is not None:
            fold_progress(group, len(folds), len(names))

    try:
        if workers == 1:
            for g in names:
                done(g, *_fold(data, params, shipped, g, rounds))
        else:
            # spawned (not forked) workers, each given the rows, their errors, dependencies and memoised predictions
            # and this process's constants once; the folds are gathered by group, so the result's order is fixed
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_fold_worker,
                                     initargs=(data.rows, data.ids, data.groups, in_sample, data.depends,
                                               data._memo, shipped)) as pool:
                for fut in as_completed([pool.submit(_run_fold_in_worker, g, rounds) for g in names]):
                    done(*fut.result())
    finally:
        for p in params:
            p.set(shipped[p.name])
    return CrossValidation(data.ids, data.groups, in_sample, logo, shipped, {g: folds[g] for g in names})
