"""The slowest inputs the fuzzer found (issue 14), timed: CPU seconds of one in-process ``plan3d`` call each.

Two lists:

1. the slow cases the issue names, and the ones found while fixing them (each built here: mutated clusters and
   config.json files are written to a temporary directory), with the CPU seconds measured before the fix;
2. the slowest inputs of the last fuzz run (``PLAN3D_FUZZ_REPORT``, default ``.pytest_cache/plan3d_fuzz_report.json``
   written by ``python -m pytest tests/fuzz``), re-run when their input files are built-in names.

The goal: the default answer of any single ``plan`` under 5 s of CPU on one core, or a reason printed (repeated
planning: --objective min-gpus and the search for the nearest change; --solver enumerate is brute force). CPU seconds
(``time.process_time``) are used, not wall seconds: the 2-core machine is shared. Usage:
``.venv/bin/python benchmarks/bench_fuzz_slowest.py [--report PATH ...] [--top N]`` (``--report`` once per shard's
report of a sharded run).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "hf_configs"
GOAL_CPU_S = 5.0


def run(argv: list[str]) -> tuple[int, float, float, str]:
    """(exit code, CPU s, wall s, last stderr line) of ``plan3d *argv`` in this process."""
    from planner.cli import main
    err = io.StringIO()
    old = sys.argv
    sys.argv = ["plan3d", *argv]
    c0, t0 = time.process_time(), time.perf_counter()
    code = 0
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = old
    lines = err.getvalue().strip().splitlines()
    return code, time.process_time() - c0, time.perf_counter() - t0, lines[-1] if lines else ""


def named_cases(tmp: Path) -> list[tuple[str, str, list[str]]]:
    """(label, CPU seconds before the fix, argv) of the cases issue 14 names and the ones found while fixing it."""
    from cluster_specs import get_cluster
    slow_net = get_cluster("dgx-h100").model_dump(mode="json")
    slow_net["network"]["nic_bandwidth_bytes_per_s"] = 1.25e8  # 1 GbE between nodes, the bottom of its range
    (tmp / "slow_net.yaml").write_text(yaml.safe_dump(slow_net))
    cfg = json.loads((HF / "llama3.1-8b.json").read_text())
    cfg.update(num_hidden_layers=4096, hidden_size=1024, intermediate_size=4096, num_attention_heads=8,
               num_key_value_heads=8, head_dim=128)
    (tmp / "deep").mkdir(exist_ok=True)
    (tmp / "deep" / "config.json").write_text(json.dumps(cfg))
    return [
        ("Llama-3.1-405B on 3,956 GB200s, --objective min-gpus (step <= 9 s)", "5.5",
         ["plan", "--model", "llama3.1-405b", "--cluster", "gb200-nvl72", "--gpus", "3956", "--objective",
          "min-gpus", "--target-step-s", "9"]),
        ("Nemotron-4-340B on 568 MI300X nodes at 64k, --objective min-gpus (step <= 10 s)", "4.5",
         ["plan", "--model", "nemotron-4-340b", "--cluster", "mi300x", "--nodes", "568", "--seq-length", "65536",
          "--objective", "min-gpus", "--target-step-s", "10"]),
        ("Mixtral-8x7B on 128 H100s, 1 GbE between nodes (mutated cluster)", "19.2",
         ["plan", "--model", "mixtral-8x7b", "--cluster", str(tmp / "slow_net.yaml"), "--gpus", "128"]),
        ("4,096-layer 1,024-wide config.json on 64 H200s", "22.7",
         ["plan", "--model", str(tmp / "deep" / "config.json"), "--cluster", "dgx-h200", "--gpus", "64"]),
        ("Mixtral-8x22B on 1,024 GB200s at 128k, torchtitan", "6.5",
         ["plan", "--model", "mixtral-8x22b", "--cluster", "gb200-nvl72", "--nodes", "256", "--global-batch-size",
          "256", "--seq-length", "131072", "--framework", "torchtitan", "--top-k", "3"]),
        ("DeepSeek-V3 on 8 MI300X at 128k: infeasible, nearest changes searched", "8.6",
         ["plan", "--model", "deepseek-v3", "--cluster", "mi300x", "--nodes", "1", "--global-batch-size", "1536",
          "--seq-length", "131072", "--top-k", "10"]),
        ("Kimi-K2 --objective cost on up to 32 H100s: nothing fits (the 10,000-input run's hang, loaded machine)",
         "32.9", ["plan", "--model", "kimi-k2", "--cluster", "dgx-h100", "--nodes", "4", "--global-batch-size", "1536",
                  "--seq-length", "8192", "--precision", "fp8", "--top-k", "3", "--objective", "cost",
                  "--deadline-days", "7", "--train-tokens", "1e13", "--framework", "torchtitan"]),
    ]


def report_cases(paths: list[Path], top: int) -> list[tuple[str, str, list[str]]]:
    """The slowest inputs of the last fuzz run (one report per ``PLAN3D_FUZZ_SHARD`` process, merged by CPU
    seconds) whose files are built-in names (generated files are gone)."""
    slowest = [r for p in paths if p.is_file() for r in json.loads(p.read_text()).get("slowest", [])]
    out = []
    for r in sorted(slowest, key=lambda r: -r["cpu_s"]):
        if any(a.startswith(("/tmp", tempfile.gettempdir())) for a in r["argv"]):
            continue
        out.append((f"fuzz {r['group']}", f"{r['cpu_s']:.1f} (in the run)", r["argv"]))
        if len(out) >= top:
            break
    return out


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = sys.argv[1:]
    reports = [Path(a) for i, a in enumerate(args) if i and args[i - 1] == "--report"] or [Path(
        os.environ.get("PLAN3D_FUZZ_REPORT", ROOT / ".pytest_cache" / "plan3d_fuzz_report.json"))]
    top = int(args[args.index("--top") + 1]) if "--top" in args else 10
    print(f"python {sys.version.split()[0]}; CPU seconds of one in-process call (goal: < {GOAL_CPU_S:g} s, or a "
          f"reason printed)")
    with tempfile.TemporaryDirectory() as d:
        cases = named_cases(Path(d)) + report_cases(reports, top)
        run(["plan"])  # imports and caches out of the timings
        print(f"{'CPU s':>7} {'wall s':>7} {'before':>14} {'exit':>4}  case")
        for label, before, argv in cases:
            code, cpu, wall, last = run(argv)
            flag = "" if cpu < GOAL_CPU_S else "  (over the goal)"
            print(f"{cpu:7.2f} {wall:7.2f} {before:>14} {code:>4}  {label}{flag}")
            if code != 0:
                print(f"{'':37}{last[:150]}")
            if not label.startswith("fuzz"):
                continue
            print(f"{'':37}plan3d {' '.join(argv)[:150]}")


if __name__ == "__main__":
    main()
