"""Planner speed (issue 5): print the figures for the closing note. Not a test.

1. Llama-3.1-405B on 16,384 H100s (GBS 2048 x 8192 tokens), whole space, end to end: ``plan3d plan`` in a fresh
   process pinned to one core (``taskset -c 0`` when available), and the in-process breakdown.
2. DeepSeek-V3 (MoE) on 2,048 H100s (GBS 1024 x 4096).
3. Plan time against GPU count, 8 ... 1,048,576 (Llama-3.1-8B, seq 8192, GBS = max(256, GPUs / 4)).

CP-SAT runs with one worker. ``--quick`` skips the largest GPU counts. Usage:
``.venv/bin/python benchmarks/bench_search.py [--quick]``
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN3D = [sys.executable, "-c", "from planner.cli import main; main()"]


def end_to_end(args: list[str], repeats: int = 3) -> tuple[float, int]:
    """Best wall seconds of ``plan3d plan ARGS --format json`` in a fresh process on one core, and its exit code."""
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    best, rc = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        p = subprocess.run(pin + PLAN3D + ["plan", *args, "--format", "json"], capture_output=True, text=True,
                           cwd=ROOT)
        best = min(best, time.perf_counter() - t)
        rc = p.returncode
    return best, rc


def in_process(model: str, gpus: int, gbs: int, seq: int):
    from cluster_specs import get_cluster
    from cost_models.config import TrainingJob
    from model_zoo import get_model
    from planner.solver import solve
    m, c = get_model(model), get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=gbs, seq_length=seq)
    t = time.perf_counter()
    r = solve(m, c, job, gpus, top_k=5)
    return time.perf_counter() - t, r


def row(label: str, model: str, gpus: int, gbs: int, seq: int) -> None:
    wall, rc = end_to_end(["--model", model, "--gpus", str(gpus), "--global-batch-size", str(gbs),
                           "--seq-length", str(seq)])
    t, r = in_process(model, gpus, gbs, seq)
    best = r.plans[0] if r.plans else None
    desc = "-"
    if best is not None:
        p = best.parallel
        desc = (f"tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} ep {p.ep} vpp {p.vpp} mbs {p.micro_batch_size} "
                f"zero {p.zero_stage} rc {p.recompute}: {best.step.tokens_per_s:,.0f} tok/s, MFU {best.step.mfu:.1%}")
    tm = " ".join(f"{k} {v:.3f}" for k, v in r.timings_s.items())
    print(f"{label}: end-to-end {wall:.2f} s (exit {rc}); in-process {t:.3f} s [{tm}]; space {r.num_candidates} "
          f"configs, {r.num_rescored} re-scored by the scalar model; best {desc}")


def main() -> None:
    quick = "--quick" in sys.argv
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs visible; CP-SAT num_workers=1")
    row("Llama-3.1-405B on 16,384 H100", "llama3.1-405b", 16384, 2048, 8192)
    row("DeepSeek-V3 on 2,048 H100", "deepseek-v3", 2048, 1024, 4096)
    print("\nPlan time against GPU count (Llama-3.1-8B, seq 8192, GBS max(256, GPUs/4)), in-process solve:")
    print(f"{'GPUs':>9} {'GBS':>7} {'configs':>8} {'rescored':>8} {'tables s':>8} {'cpsat s':>8} {'rescore s':>9} "
          f"{'total s':>8}  best")
    n = 8
    top = 2**17 if quick else 2**20
    while n <= top:
        gbs = max(256, n // 4)
        t, r = in_process("llama3.1-8b", n, gbs, 8192)
        tm = r.timings_s
        b = r.plans[0].parallel if r.plans else None
        bs = f"tp {b.tp} pp {b.pp} dp {b.dp} cp {b.cp} mbs {b.micro_batch_size} zero {b.zero_stage}" if b else "-"
        print(f"{n:>9} {gbs:>7} {r.num_candidates:>8} {r.num_rescored:>8} {tm.get('tables', 0):>8.3f} "
              f"{tm.get('cpsat', 0):>8.3f} {tm.get('rescore', 0):>9.3f} {t:>8.3f}  {bs}")
        n *= 4 if quick else 2
    print("\nReference: the fastest published exhaustive analytic planner evaluates ~130 configurations/s on 2 cores.")


if __name__ == "__main__":
    main()
