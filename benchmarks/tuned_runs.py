"""How well plan3d's best plan predicts expert-tuned published runs: the dev rows with their layout left out.

``plan3d validate`` compares a row that states no layout (only the model, GPUs, batch and measured throughput)
through plan3d's own search (``planner/tuned_runs.py``, group ``tuned_runs``). The dev rows all state their layout,
so this benchmark makes tuned runs of them: it removes the layout (tp, pp, dp, cp, vpp, micro-batch, sequence
parallel, recompute, ZeRO stage, FSDP, etp, and the recipe's pipeline layout; MoE rows keep their ep, whose
search space is large) and compares plan3d's best plan with the published measurement. The error mixes the
step-time model's error with the search's: a planner that finds a faster layout than the authors reads as a
too-fast prediction. Prints per row the error with the stated layout, the tuned error, the layouts and the search
time, then MAPE per source group and overall.

Run: .venv/bin/python benchmarks/tuned_runs.py [ROW_ID ...]
"""
from __future__ import annotations

import copy
import sys
import time

from planner.published_rows import load_rows
from planner.validation import validate_row

#: published parallel.* fields a tuned run leaves out
LAYOUT = ("tp", "pp", "dp", "cp", "virtual_pipeline", "micro_batch_size", "sequence_parallel", "recompute",
          "zero_stage", "distributed_optimizer", "fsdp", "etp")
#: parallel.other keys that are run settings, not layout (kept)
KEEP_OTHER = ("torch_compile", "async_tp", "comm_overlap", "framework")
#: setup keys that describe the layout (left out)
SETUP_LAYOUT = ("pipeline_layout", "recompute", "recompute_modules", "etp")


def without_layout(row: dict) -> dict:
    """The row as a tuned run: the same job and measurement, no layout (MoE rows keep ep)."""
    r = copy.deepcopy(row)
    p = r["parallel"]
    for k in LAYOUT:
        p[k] = None
    if not (r.get("architecture") or {}).get("moe"):
        p["ep"] = None
    if p.get("other"):
        p["other"] = {k: v for k, v in p["other"].items() if k in KEEP_OTHER}
    if r.get("setup"):
        s = {k: v for k, v in r["setup"].items() if k not in SETUP_LAYOUT}
        s["sources"] = {k: v for k, v in s.get("sources", {}).items() if k in s}
        r["setup"] = s
    return r


def main(ids: list[str]) -> None:
    errs: dict[str, list[float]] = {}
    total = 0.0
    for row in load_rows():
        if ids and row["id"] not in ids:
            continue
        stated = validate_row(row, check_feasibility=False)
        if stated.error is None:
            continue
        t0 = time.perf_counter()
        tuned = validate_row(without_layout(row), check_feasibility=False)
        dt = time.perf_counter() - t0
        total += dt
        err = f"{tuned.error:+.3f}" if tuned.error is not None else "skipped"
        print(f"{row['id'][:58]:58s} stated {stated.error:+.3f} tuned {err:>7s} {dt:5.1f} s  "
              f"{stated.config.split(' gbs')[0]} -> {tuned.config.split(' gbs')[0] or tuned.skipped}", flush=True)
        if tuned.error is not None:
            errs.setdefault(stated.group, []).append(abs(tuned.error))
    allv = [e for v in errs.values() for e in v]
    for g, v in sorted(errs.items()):
        print(f"{g:28s} {len(v):3d} rows  tuned MAPE {100 * sum(v) / len(v):5.1f}%")
    if allv:
        print(f"{'overall':28s} {len(allv):3d} rows  tuned MAPE {100 * sum(allv) / len(allv):5.1f}%  "
              f"search {total:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
