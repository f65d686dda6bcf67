"""Every MEM field case (field_cases.md) and every published torchtitan memory row: prediction, measurement, verdict.

The cases and their mapping to plan3d inputs are the tests' (tests/test_memory.py, tests/data/memory_cases*.yaml);
this script prints them side by side. Units: GiB (2**30 bytes) unless the source prints decimal GB.

Run: .venv/bin/python benchmarks/memory_field_cases.py   (prints the table; no assertions)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_memory as tm  # noqa: E402  (the case definitions live with their tests)

from cluster_specs import get_cluster  # noqa: E402
from cost_models.config import ParallelConfig, TrainingJob  # noqa: E402
from cost_models.activations import activation_bytes_per_layer  # noqa: E402
from cost_models.memory import estimate_memory  # noqa: E402
from model_zoo import get_model  # noqa: E402
from model_zoo.spec import ModelSpec  # noqa: E402
from planner.checks import memory_verdict  # noqa: E402

GiB, MiB, GB = 2**30, 2**20, 1e9


def rows():
    out = []
    # F02: LLaMA-7B DeepSpeed ZeRO-2 / ZeRO-3 on 8 x V100-32GB
    f02 = tm.F02
    st = tm._f02(2).stages[0]
    alloc = (st.phases["optimizer"] - st.reserve) / GiB
    measured = f02["allocated_before_gib"] + f02["failed_allocation_gib"]
    out.append(("F02 ZeRO-2: allocated at the Adam step", f"{alloc:.2f} GiB", f"{measured:.2f} GiB",
                f"{alloc / measured - 1:+.1%}", memory_verdict(tm._f02(2)), "OOM"))
    out.append(("F02 ZeRO-2: failed allocation (4P/N)", f"{st.phase_terms['optimizer']['transient'] / GiB:.2f} GiB",
                f"{f02['failed_allocation_gib']:.2f} GiB", "exact", "", ""))
    e3 = tm._f02(3)
    out.append(("F02 ZeRO-3: peak", f"{e3.peak_bytes / GiB:.2f} GiB", f"ran ({f02['capacity_gib']} GiB GPU)", "",
                memory_verdict(e3), "fits"))
    # F03: MPT-7B on one A100-80GB
    f03 = tm.F03
    m = ModelSpec(**f03["model_spec"])
    e = estimate_memory(m, get_cluster(f03["cluster"]), TrainingJob(global_batch_size=1, seq_length=f03["seq_length"],
                                                                    framework="torchtitan"),
                        ParallelConfig(recompute="full", zero_stage=3))
    out.append(("F03 MPT-7B 1 x A100: model states", f"{e.stages[0].model_states / GiB:.1f} GiB",
                f"{f03['model_states_gib']} GiB (16 B/param)", "", memory_verdict(e), "OOM"))
    # F06: Megatron Llama-2-7B, four layouts
    for r, est in tm.f06_predictions():
        p = est.peak_allocated_bytes / GB
        out.append((f"F06 tp{r['tp']} pp{r['pp']} dp{r['dp']} mbs{r['micro_batch_size']}: max allocated",
                    f"{p:.1f} GB", f"{r['measured_gb']} GB", f"{p / r['measured_gb'] - 1:+.1%}", memory_verdict(est),
                    "fits"))
    # F07: unfused attention
    m7, job_off, par7, est_off = tm._f07(False)
    _, job_on, _, _ = tm._f07(True)
    diff = (activation_bytes_per_layer(m7, job_off, par7, 0) - activation_bytes_per_layer(m7, job_on, par7, 0)
            + 4 * m7.num_attention_heads * tm.F07["seq_length"])
    out.append(("F07 unfused attention: scores stored per layer", f"{diff / MiB:.0f} MiB",
                f"{tm.F07['stored_scores_mib_per_layer']} MiB", "exact", memory_verdict(est_off), "OOM"))
    # F22: torchtitan FSDP2 on 64 A100 (verdicts only)
    c22 = get_cluster(tm.F22["cluster"])
    for r in tm.F22["rows"]:
        n = tm.F22["num_gpus"]
        job = TrainingJob(global_batch_size=n * r["local_batch"], seq_length=r["seq_length"], framework="torchtitan")
        par = ParallelConfig(dp=n, zero_stage=3, micro_batch_size=r["local_batch"], recompute=r["recompute"])
        est = estimate_memory(get_model(r["model"]), c22, job, par)
        out.append((f"F22 {r['model']} lbs{r['local_batch']} {r['recompute']}", f"{est.peak_bytes / GiB:.1f} GiB",
                    "ran" if r["fits"] else "OOM", "", memory_verdict(est, 0.0), "fits" if r["fits"] else "OOM"))
    # torchtitan published rows: max reserved
    for row in tm.TT_ROWS:
        pred, est = tm.torchtitan_row_prediction(row)
        meas = row["measured"]["memory_per_gpu_gib"]
        out.append((row["id"].replace("torchtitan-", "tt "), f"{pred:.1f} GiB", f"{meas} GiB reserved",
                    f"{pred / meas - 1:+.1%}", memory_verdict(est, 0.0), "fits"))
    return out


def main() -> None:
    head = ("case", "predicted", "measured", "error", "plan3d verdict", "observed")
    table = rows()
    widths = [max(len(str(r[i])) for r in [head, *table]) for i in range(len(head))]
    for r in [head, *table]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    # F22 verdicts are judged at capacity (headroom 0: a run that fits is a run that ran); others at the default.
    print("\nverdict: planner.checks.memory_verdict (F22 and torchtitan rows at headroom 0: 'fits' = ran)")


if __name__ == "__main__":
    main()
