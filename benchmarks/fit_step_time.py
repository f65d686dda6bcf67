"""Fit the step-time model's physical constants on the dev rows and report how well they generalise.

Prints (1) the fitted constants: shipped value, the value a refit on all rows finds, and the range each may take
with its source (``FIT_RANGES`` in the cost-model modules); (2) per source group, the in-sample MAPE (shipped
constants) next to the leave-one-source-group-out (LOGO) MAPE (each group predicted by constants fitted without
it); (3) the rows with the largest LOGO error. With ``--write-residuals`` it regenerates the residual statistics
the product's uncertainty intervals are read from (``planner/data/step_time_residuals.json``).

The fitting machinery is ``planner/calibration.py``; a refit's values are written by hand into the cost-model
modules (with the provenance) only when they move. Run: ``.venv/bin/python benchmarks/fit_step_time.py``.
"""
from __future__ import annotations

import argparse
import sys
import time

from planner.calibration import RowErrors, cross_validate, fit, parameters
from planner.published_rows import load_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=None, help="published-runs YAML (default: the packaged dev rows)")
    ap.add_argument("--worst", type=int, default=12, help="rows with the largest LOGO error to list")
    ap.add_argument("--write-residuals", action="store_true",
                    help="write planner/data/step_time_residuals.json from the LOGO residuals")
    args = ap.parse_args(argv)
    rows = load_rows(args.dataset)
    params = parameters()
    t0 = time.perf_counter()

    # (1) refit on all rows, from the middle of every range (as each LOGO fold is fitted)
    shipped = {p.name: p.get() for p in params}
    data = RowErrors.of(rows)
    data.find_dependencies(params)
    refit = fit(data, range(len(data.rows)), params)
    for p in params:
        p.set(shipped[p.name])
    print(f"{'constant':42s} {'shipped':>10s} {'refit':>10s}  range [unit]: source")
    for p in params:
        b = p.bounds
        print(f"{p.name:42s} {shipped[p.name]:10.4g} {refit[p.name]:10.4g}  [{b.low:g}, {b.high:g}] {b.unit}: "
              f"{b.source}")

    # (2) in-sample vs LOGO per group
    cv = cross_validate(rows, fold_progress=lambda g, k, n: print(f"  fold {k}/{n} done: without {g}",
                                                                  file=sys.stderr, flush=True))
    print(f"\n{'group':30s} {'rows':>5s} {'in-sample':>10s} {'LOGO':>8s}")
    for g, (n, ins, lg) in cv.group_table().items():
        print(f"{g:30s} {n:5d} {ins:9.2f}% {lg:7.2f}%")
    print(f"{'overall':30s} {len(cv.ids):5d} {cv.in_sample_mape:9.2f}% {cv.logo_mape:7.2f}%")

    # (3) worst rows
    order = sorted(range(len(cv.ids)), key=lambda i: -abs(cv.logo[i]))[:args.worst]
    print(f"\n{'row':60s} {'in-sample':>10s} {'LOGO':>8s}")
    for i in order:
        print(f"{cv.ids[i]:60s} {100 * cv.in_sample[i]:+9.1f}% {100 * cv.logo[i]:+7.1f}%")
    if args.write_residuals:
        from planner.uncertainty import write_residuals
        path = write_residuals(cv, rows)
        print(f"\nwrote {path}")
    print(f"\n{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
