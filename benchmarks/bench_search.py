"""Planner speed (issues 5 and 11): print the figures for the closing note. Not a test.

1. Llama-3.1-405B on 16,384 H100s (GBS 2048 x 8192 tokens), whole space, end to end: ``plan3d plan`` in a fresh
   process pinned to one core (``taskset -c 0`` when available), and the in-process breakdown.
2. DeepSeek-V3 (MoE) on 2,048 H800s: GBS 1024 x 4096 (BF16), and the batch it was trained with (15360 x 4096, FP8).
3. Plan time against GPU count, 8 ... 1,048,576 (Llama-3.1-8B, seq 8192, GBS = max(256, GPUs / 4)).
4. Predicted throughput against GPU count at a fixed batch and sequence (Llama-3.1-405B, GBS 2048 x 8192; and
   Llama-3.1-8B, GBS 4096 x 8192): it must never drop when GPUs are added; a drop is flagged.

Times are wall seconds and, in brackets, CPU seconds of this process (the machine may be shared). CP-SAT runs with
one worker. ``--quick`` skips the largest GPU counts. Usage: ``.venv/bin/python benchmarks/bench_search.py
[--quick]``
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


def end_to_end(args: list[str], repeats: int = 3) -> tuple[float, float, int]:
    """Best wall seconds and best user+sys CPU seconds of ``plan3d plan ARGS --format json`` in a fresh process on
    one core, and its exit code."""
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    best, best_cpu, rc = float("inf"), float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        r0 = os.times()
        p = subprocess.run(pin + PLAN3D + ["plan", *args, "--format", "json"], capture_output=True, text=True,
                           cwd=ROOT)
        r1 = os.times()
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system))
        rc = p.returncode
    return best, best_cpu, rc


def in_process(model: str, gpus: int, gbs: int, seq: int, cluster: str = "dgx-h100", precision: str = "bf16",
               top_k: int = 5):
    from cluster_specs import get_cluster
    from cost_models.config import TrainingJob
    from model_zoo import get_model
    from planner.solver import solve
    m, c = get_model(model), get_cluster(cluster)
    job = TrainingJob(global_batch_size=gbs, seq_length=seq, precision=precision)
    t, cpu = time.perf_counter(), time.process_time()
    r = solve(m, c, job, gpus, top_k=top_k)
    return time.perf_counter() - t, time.process_time() - cpu, r


def _layout(p) -> str:
    s = f"tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp}"
    if p.ep > 1:
        s += f" ep {p.ep} etp {p.expert_tp}"
    s += f" vpp {p.vpp} mbs {p.micro_batch_size} zero {p.zero_stage} rc {p.recompute}"
    if p.first_stage_layers is not None:
        s += f" split {p.first_stage_layers}/{p.last_stage_layers}"
    return s


def row(label: str, model: str, gpus: int, gbs: int, seq: int, cluster: str = "dgx-h100",
        precision: str = "bf16") -> None:
    wall, wall_cpu, rc = end_to_end(["--model", model, "--cluster", cluster, "--gpus", str(gpus),
                                     "--global-batch-size", str(gbs), "--seq-length", str(seq),
                                     "--precision", precision])
    t, cpu, r = in_process(model, gpus, gbs, seq, cluster, precision)
    best = r.plans[0] if r.plans else None
    desc = "-"
    if best is not None:
        desc = f"{_layout(best.parallel)}: {best.step.tokens_per_s:,.0f} tok/s, MFU {best.step.mfu:.1%}"
    tm = " ".join(f"{k} {v:.3f}" for k, v in r.timings_s.items())
    print(f"{label}: end-to-end {wall:.2f} s [{wall_cpu:.2f}] (exit {rc}); in-process {t:.3f} s [{cpu:.3f}] "
          f"({tm}); space {r.num_candidates:,} configs, {r.num_rescored} re-scored by the scalar model; best {desc}")


def scaling(model: str, gbs: int, seq: int, counts: list[int]) -> None:
    """Best plan and its tokens/s at each GPU count (fixed batch and sequence); flags a drop."""
    print(f"\nThroughput against GPU count at fixed batch ({model}, GBS {gbs} x {seq}):")
    print(f"{'GPUs':>9} {'tok/s':>13} {'step s':>8} {'plan s':>7}  best")
    prev = 0.0
    for n in counts:
        t, _, r = in_process(model, n, gbs, seq, top_k=1)
        if not r.plans:
            print(f"{n:>9} {'-':>13} {'-':>8} {t:>7.3f}  no plan")
            continue
        b = r.plans[0]
        flag = "  <-- DROP" if b.step.tokens_per_s < prev * (1 - 1e-9) else ""
        print(f"{n:>9} {b.step.tokens_per_s:>13,.0f} {b.step.step_s:>8.3f} {t:>7.3f}  {_layout(b.parallel)}{flag}")
        prev = max(prev, b.step.tokens_per_s)


def main() -> None:
    quick = "--quick" in sys.argv
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs visible, load {os.getloadavg()[0]:.1f}; "
          f"CP-SAT num_workers=1")
    row("Llama-3.1-405B on 16,384 H100", "llama3.1-405b", 16384, 2048, 8192)
    row("DeepSeek-V3 on 2,048 H800, GBS 1024", "deepseek-v3", 2048, 1024, 4096, "dgx-h800")
    row("DeepSeek-V3 on 2,048 H800, GBS 15360 FP8", "deepseek-v3", 2048, 15360, 4096, "dgx-h800", "fp8")
    print("\nPlan time against GPU count (Llama-3.1-8B, seq 8192, GBS max(256, GPUs/4)), in-process solve:")
    print(f"{'GPUs':>9} {'GBS':>7} {'configs':>10} {'rescored':>8} {'bounds s':>8} {'tables s':>8} {'rescore s':>9} "
          f"{'total s':>8} {'cpu s':>6}  best")
    n = 8
    top = 2**17 if quick else 2**20
    while n <= top:
        gbs = max(256, n // 4)
        t, cpu, r = in_process("llama3.1-8b", n, gbs, 8192)
        tm = r.timings_s
        bs = _layout(r.plans[0].parallel) if r.plans else "-"
        print(f"{n:>9} {gbs:>7} {r.num_candidates:>10,} {r.num_rescored:>8} {tm.get('bounds', 0):>8.3f} "
              f"{tm.get('tables', 0):>8.3f} {tm.get('rescore', 0):>9.3f} {t:>8.3f} {cpu:>6.3f}  {bs}")
        n *= 4 if quick else 2
    scaling("llama3.1-405b", 2048, 8192, [2**k for k in range(10, 18 if quick else 19)])
    scaling("llama3.1-8b", 4096, 8192, [2**k for k in range(3, 17 if quick else 21)])
    print("\nReference: the fastest published exhaustive analytic planner evaluates ~130 configurations/s on 2 cores.")


if __name__ == "__main__":
    main()
