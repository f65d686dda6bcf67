"""Fused-attention throughput by kernel-library generation (``cluster_specs/data/efficiency/attention.yaml``).

Expected values are the published measurements the table holds: cuDNN 9.19 on H200 (NVIDIA cudnn-frontend
``results/h200_919_only_cudnn/llama3.1_20260227_034703.csv``, causal, head dim 128: 8192 tokens forward 644,
backward 541 TFLOP/s) and the FA3 paper's 2024 cuDNN on H100 (Shah et al. 2024, Fig. 5 / 6: 529 / 518 at 8k, the backward made causal by the measured ratio: 507);
cuDNN 9.19 on GB200 (``results/gb200_919_only_cudnn``: 1598 / 1311 at 8k).
"""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster_specs.efficiency import attention_tflops
from cluster_specs.loaders import get_cluster
from cost_models.attention import attention_core_s
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.loaders import get_model
from planner.errors import PlanInputError
from planner.row_options import row_options


def test_undated_run_reads_the_newest_generation():
    assert attention_tflops("H100", "cudnn", 8192, 128) == pytest.approx((644.0, 541.0))
    assert attention_tflops("H200", "cudnn", 16384, 128) == pytest.approx((673.0, 579.0))


def test_dated_run_reads_its_generation():
    assert attention_tflops("H100", "cudnn", 8192, 128, "2024-07") == pytest.approx((529.0, 507.0))
    # before the first measured generation: held at it; after the last: the last
    assert attention_tflops("H100", "cudnn", 8192, 128, "2024-03") == pytest.approx((529.0, 507.0))
    assert attention_tflops("H100", "cudnn", 8192, 128, "2026-08") == pytest.approx((644.0, 541.0))


def test_between_generations_interpolates_in_time():
    # 2025-04 is 9 of the 19 months from 2024-07 to 2026-02
    fwd, bwd = attention_tflops("H100", "cudnn", 8192, 128, "2025-04")
    assert fwd == pytest.approx(529 + 9 / 19 * (644 - 529))
    assert bwd == pytest.approx(507 + 9 / 19 * (541 - 507))


def test_single_generation_ignores_the_date():
    assert attention_tflops("GB200", "cudnn", 8192, 128, "2024-07") == pytest.approx((1598.0, 1311.0))
    assert attention_tflops("H100", "flash2", 8192, 128, "2026-02") == pytest.approx((333.0, 299.0))


def test_bad_software_date_is_refused():
    with pytest.raises(ValueError, match="YYYY-MM"):
        attention_tflops("H100", "cudnn", 8192, 128, "2025-13")
    with pytest.raises(ValidationError):
        TrainingJob(software_date="Nov 2025")
    # ASCII digits only (Arabic-Indic ٢٠٢٥ is a str.isdigit() year), and a year 2010-2099
    for bad in ("\u0662\u0660\u0662\u0665-11", "0000-01", "9999-12", "2009-12", "2100-01"):
        with pytest.raises(ValueError, match="2010-2099"):
            attention_tflops("H100", "cudnn", 8192, 128, bad)
        with pytest.raises(ValidationError):
            TrainingJob(software_date=bad)
    assert attention_tflops("H100", "cudnn", 8192, 128, "2010-01") == attention_tflops("H100", "cudnn", 8192, 128,
                                                                                           "2024-03")


def test_step_attention_follows_the_generation():
    """One layer's attention core on H100 (Megatron: cuDNN) takes longer with 2024 software by the table's ratio."""
    model, cluster = get_model("llama3.1-8b"), get_cluster("dgx-h100")
    par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1)
    new = attention_core_s(model, cluster, TrainingJob(global_batch_size=8, seq_length=8192), par, "megatron")
    old = attention_core_s(model, cluster, TrainingJob(global_batch_size=8, seq_length=8192, software_date="2024-07"),
                           par, "megatron")
    assert old[0] / new[0] == pytest.approx(644 / 529)
    assert old[1] / new[1] == pytest.approx(541 / 507)


def _row(setup):
    return {"id": "r", "parallel": {}, "setup": setup}


def test_row_states_its_software_date_with_a_source():
    o = row_options(_row({"software_date": "2025-11", "sources": {"software_date": "NeMo 25.11 container"}}))
    assert o.job["software_date"] == "2025-11"
    with pytest.raises(PlanInputError, match="software_date"):
        row_options(_row({"software_date": "2025-11"}))
    with pytest.raises(PlanInputError, match="setup.software_date"):
        row_options(_row({"software_date": "11/2025", "sources": {"software_date": "x"}}))


# --- --software-date on the commands ------------------------------------------------------------------------------

LLAMA_8K = ("--seq-length", "8192", "--global-batch-size", "64", "--zero-stage", "3", "--format", "json")


def test_evaluate_times_attention_in_the_generation_of_the_date(run_cli):
    new = run_cli("evaluate", *LLAMA_8K)
    old = run_cli("evaluate", *LLAMA_8K, "--software-date", "2024-07")
    assert new.exit_code == 0 and old.exit_code == 0, (new.stderr, old.stderr)
    d_new, d_old = new.json(), old.json()
    assert d_new["input"]["job"]["software_date"] is None and d_old["input"]["job"]["software_date"] == "2024-07"
    t_new = d_new["plans"][0]["time"]["compute_breakdown_s"]
    t_old = d_old["plans"][0]["time"]["compute_breakdown_s"]
    # the same GEMMs; attention at 8k keys: forward 644 -> 529 and backward 541 -> 507 TFLOP/s (1 + 2.5 units of
    # work), so the 2024 kernels take (1/529 + 2.5/507) / (1/644 + 2.5/541) of the time
    assert t_old["gemm"] == t_new["gemm"]
    assert t_old["attention"] / t_new["attention"] == pytest.approx(
        (1 / 529 + 2.5 / 507) / (1 / 644 + 2.5 / 541), rel=2e-3)


def test_bad_software_date_is_one_line(run_cli):
    for cmd in ("plan", "evaluate", "explain"):
        r = run_cli(cmd, "--software-date", "24.07")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("plan3d: error: --software-date '24.07': give YYYY-MM"), r.stderr
    r = run_cli("evaluate", "--software-date", "\u0662\u0660\u0662\u0664-07")
    assert r.exit_code == 2 and "give YYYY-MM (a year 2010-2099)" in r.stderr, r.stderr
    r = run_cli("plan", "--cluster", "dgx-h100:2,dgx-a100-80g:2", "--software-date", "2024-07")
    assert r.exit_code == 2 and "--software-date: not available over pools" in r.stderr, r.stderr


def test_fallback_reevaluates_the_plan_in_its_generation(run_cli, tmp_path):
    doc = tmp_path / "plan.json"
    r = run_cli("plan", "--nodes", "4", "--software-date", "2024-07", "--format", "json", "--output", str(doc))
    assert r.exit_code == 0, r.stderr
    import json
    planned = json.loads(doc.read_text())["plans"][0]["time"]["step_s"]
    fb = run_cli("fallback", "--plan", str(doc), "--max-lost-nodes", "1", "--format", "json")
    assert fb.exit_code == 0, fb.stderr
    assert fb.json()["original"]["time"]["step_s"] == planned


def test_memory_takes_the_software_date_as_evaluate_does(run_cli):
    """Memory does not depend on the kernel generation; the report's time does, as evaluate's."""
    mem = run_cli("memory", *LLAMA_8K, "--software-date", "2024-07")
    ev = run_cli("evaluate", *LLAMA_8K, "--software-date", "2024-07")
    assert mem.exit_code == 0 and ev.exit_code == 0, (mem.stderr, ev.stderr)
    assert mem.json()["input"]["job"]["software_date"] == "2024-07"
    assert mem.json()["plans"][0]["time"]["step_s"] == ev.json()["plans"][0]["time"]["step_s"]
    assert (mem.json()["plans"][0]["memory"]["peak_bytes"]
            == run_cli("memory", *LLAMA_8K).json()["plans"][0]["memory"]["peak_bytes"])
