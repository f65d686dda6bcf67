"""Sweep throughput: scenarios per second of ``planner.sweep`` on 1 and 2 worker processes (ProcessPoolExecutor),
and the speed-up. Also checks that both give byte-identical JSONL (determinism).

Run: .venv/bin/python benchmarks/bench_sweep.py [GRID.yaml]   (default benchmarks/grids/sweep100.yaml; prints
figures, no assertions except the determinism check). Wall time includes the pool's start-up (worker imports).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from planner.sweep import load_grid, sweep, to_jsonl


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent / "grids" / "sweep100.yaml")
    grid = load_grid(path)
    print(f"grid {path}: {grid.num_scenarios} scenarios; {os.cpu_count()} cores on this machine")
    out = {}
    for workers in (1, 2):
        t = time.perf_counter()
        rows = sweep(grid, max_workers=workers)
        dt = time.perf_counter() - t
        out[workers] = (dt, to_jsonl(rows))
        ok = sum(r.status == "ok" for r in rows)
        print(f"workers {workers}: {dt:7.1f} s wall, {len(rows) / dt:6.2f} scenarios/s ({ok} planned, "
              f"{len(rows) - ok} infeasible or invalid)")
    print(f"speed-up 2 vs 1 workers: {out[1][0] / out[2][0]:.2f}x; JSONL identical: {out[1][1] == out[2][1]}")


if __name__ == "__main__":
    main()
