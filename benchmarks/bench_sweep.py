"""Sweep throughput: scenarios per second of ``planner.sweep`` on 1 and 2 worker processes (ProcessPoolExecutor),
and the speed-up. Also checks that both give byte-identical JSONL (determinism).

Run: .venv/bin/python benchmarks/bench_sweep.py [GRID.yaml]   (default benchmarks/grids/sweep100.yaml; prints
figures, no assertions except the determinism check). Wall time includes the pool's start-up (worker imports).
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

from planner.sweeps import load_grid, sweep, to_jsonl


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the pool's workers), user + system."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent / "grids" / "sweep100.yaml")
    grid = load_grid(path)
    print(f"grid {path}: {grid.num_scenarios} scenarios; {os.cpu_count()} cores on this machine")
    print(f"load average at start: {os.getloadavg()[0]:.1f} (other processes share the cores: wall figures "
          f"include waiting for a core; CPU seconds do not)")
    out = {}
    for workers in (1, 2):
        cpu0 = _cpu_s()
        t = time.perf_counter()
        rows = sweep(grid, max_workers=workers)
        dt = time.perf_counter() - t
        cpu = _cpu_s() - cpu0
        out[workers] = (dt, to_jsonl(rows))
        ok = sum(r.status == "ok" for r in rows)
        print(f"workers {workers}: {dt:7.1f} s wall, {len(rows) / dt:6.2f} scenarios/s; {cpu:6.1f} CPU s "
              f"({len(rows) / cpu:.2f} scenarios per CPU second); {ok} planned, {len(rows) - ok} infeasible or "
              f"invalid")
    print(f"speed-up 2 vs 1 workers: {out[1][0] / out[2][0]:.2f}x; JSONL identical: {out[1][1] == out[2][1]}")


if __name__ == "__main__":
    main()
