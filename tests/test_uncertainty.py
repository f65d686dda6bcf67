"""Prediction intervals from the cross-validated residuals of published runs (planner/uncertainty.py)."""
from __future__ import annotations

import json
import math

import pytest

from cluster_specs import get_cluster
from cost_models.config import TrainingJob
from model_zoo import get_model
from planner.uncertainty import (CLASS_KEYS, INTERVAL_QUANTILE, MIN_CLASS_ROWS, _residuals_path, class_table,
                                 step_class, step_interval, tied_with_best)


def test_shipped_residuals_are_consistent_with_their_runs():
    doc = json.loads(_residuals_path().read_text())
    runs = doc["runs"]
    assert len(runs) >= 80 and doc["generated_by"].startswith("benchmarks/fit_step_time.py")
    # the class table is what class_table computes from the runs it lists
    classes = [dict(zip(CLASS_KEYS, r["class"].split("/"))) for r in runs]
    table = class_table(classes, [r["residual"] for r in runs])
    assert set(table) == set(doc["classes"])
    for k, v in table.items():
        assert doc["classes"][k]["rows"] == v["rows"]
        assert doc["classes"][k]["abs_quantile"] == pytest.approx(v["abs_quantile"], rel=1e-4, abs=1e-6)
    # the overall MAPE of the LOGO residuals is the one recorded
    logo = 100 * sum(abs(math.exp(r["residual"]) - 1) for r in runs) / len(runs)
    assert logo == pytest.approx(doc["cross_validated_mape_percent"], rel=1e-3)


def test_classes_and_back_off():
    job = TrainingJob(global_batch_size=512, seq_length=4096, precision="fp8")
    c = step_class(get_model("deepseek-v3"), get_cluster("gb200-nvl72"), job, 256)
    assert c == {"arch": "moe", "gpu": "blackwell", "precision": "fp8", "scale": "le1024"}
    assert step_class(get_model("llama3.1-8b"), get_cluster("dgx-a100-80g"), job.model_copy(
        update={"precision": "bf16"}), 8) == {"arch": "dense", "gpu": "ampere", "precision": "16-bit", "scale": "le64"}
    iv = step_interval(10.0, c)
    assert iv.rows >= MIN_CLASS_ROWS and iv.low < 10.0 < iv.high
    assert iv.low * iv.high == pytest.approx(100.0)  # symmetric in log space
    # a class nobody measured (MI300X) backs off to its architecture's runs, then to all
    other = step_interval(1.0, {"arch": "dense", "gpu": "cdna", "precision": "16-bit", "scale": "le64"})
    assert other.cls == "dense"


def test_interval_covers_the_stated_share_of_its_class():
    doc = json.loads(_residuals_path().read_text())
    runs = doc["runs"]
    q = doc["classes"]["all"]["abs_quantile"]
    inside = sum(abs(r["residual"]) <= q + 1e-12 for r in runs) / len(runs)
    assert inside == pytest.approx(INTERVAL_QUANTILE, abs=1.5 / len(runs))


def test_ties():
    assert tied_with_best([]) == 0
    assert tied_with_best([(1.0, 0.9, 1.1)]) == 1
    assert tied_with_best([(1.0, 0.9, 1.1), (1.05, 0.95, 1.16), (1.2, 1.08, 1.32)]) == 2
    assert tied_with_best([(1.0, 0.99, 1.01), (1.05, 1.04, 1.06)]) == 1


def test_plan_json_and_table_carry_the_interval(run_cli):
    r = run_cli("plan", "--format", "json")
    p = r.json()["plans"][0]
    t, th = p["time"], p["throughput"]
    assert t["step_s_low"] < t["step_s"] < t["step_s_high"]
    assert th["mfu_low"] < th["mfu"] < th["mfu_high"]
    assert th["mfu_low"] == pytest.approx(th["mfu"] * t["step_s"] / t["step_s_high"], rel=1e-4)
    table = run_cli("plan")
    assert table.exit_code == 0 and "±" in table.stdout
    pct = round(100 * (t["step_s_high"] / t["step_s"] - 1))
    assert f"{t['step_s']:.3f} ±{pct}%" in table.stdout


def test_plan_says_when_the_top_plans_are_tied(run_cli):
    # Llama 3.1 8B on 16 H100: the top plans are within a few percent of each other, well inside the dense
    # Hopper runs' interval
    r = run_cli("plan", "--model", "llama3.1-8b", "--gpus", "16")
    assert r.exit_code == 0 and "effectively tied" in r.stdout


def test_plan_over_pools_shows_the_interval_and_the_tie(run_cli):
    # the pools table carries the same ± cell and tie line as plan's (the JSON already had the interval)
    args = ("plan", "--model", "llama3.1-70b", "--cluster", "dgx-h100:4,dgx-a100-80g:4", "--global-batch-size", "512")
    doc = run_cli(*args, "--format", "json").json()
    t = doc["plans"][0]["time"]
    table = run_cli(*args)
    assert table.exit_code == 0
    pct = round(100 * (t["step_s_high"] / t["step_s"] - 1))
    assert f"{t['step_s']:.3f} ±{pct}%" in table.stdout
    assert "effectively tied" in table.stdout
