"""``plan3d validate``: the step-time model against the packaged published runs (the project's regression check)."""
from __future__ import annotations

import json

import pytest

from planner.validation import (DEFAULT_MAX_GROUP_MAPE, DEFAULT_MAX_MAPE, MIN_GROUP_ROWS, build_inputs, fp8_recipe,
                              implied_flops_per_token, load_rows, row_convention, row_flops_per_token,
                              row_pipeline_layout, run_validation)


@pytest.fixture(scope="module")
def report():
    return run_validation()


def test_packaged_rows_are_the_shared_dev_rows_with_sources():
    rows = load_rows()
    assert len(rows) == 104
    assert all(r["source"]["url"] and r["source"]["group"] for r in rows)


#: What the calibrated model reaches on the dev rows today (plan3d validate): a ratchet against regressions.
#: Lower these when the model improves; the project targets are the test below.
#: 6.5 -> 6.8: the collective model now pipelines NVLink and network hops as NCCL does (ring busbw = min(NVLink,
#: r NICs), 192 GB/s on DGX A100 as measured, not 118) and DeepSpeed reduces gradients in bf16; the constants were
#: fitted under the old serial model (BLOOM 1.6 -> 6.7%, NeMo 24.07 7.0 -> 7.6%)
ACHIEVED_MAX_MAPE = 6.8
#: Bridge 9.0 -> 9.1: the compute under Megatron-FSDP's collectives is now slowed by the measured overlap slowdown
#: (step_time.OVERLAP_COMPUTE_SLOWDOWN), which costs the one Bridge FSDP row (Llama 3 8B FP8-CS, 8 H100) 1.1 points
ACHIEVED_GROUP_MAPE = {"megatron_moe_recipes": 6.0, "nemo_bridge_perf_summary": 9.1}


def test_mape_does_not_regress(report):
    assert len(report.evaluated) >= 80
    assert report.mape <= ACHIEVED_MAX_MAPE, report.group_mape()
    for group, (n, mape) in report.group_mape().items():
        if n >= MIN_GROUP_ROWS:
            assert mape <= ACHIEVED_GROUP_MAPE.get(group, DEFAULT_MAX_GROUP_MAPE), (group, mape)


def test_mape_within_the_project_thresholds(report):
    # issue "Step-time and MFU model that matches published runs": <= 7% overall, <= 10% per group with >= 3 rows
    assert report.mape <= DEFAULT_MAX_MAPE, report.group_mape()
    for group, (n, mape) in report.group_mape().items():
        if n >= MIN_GROUP_ROWS:
            assert mape <= DEFAULT_MAX_GROUP_MAPE, (group, mape)


def test_skipped_rows_say_why(report):
    skipped = [r for r in report.rows if r.skipped]
    assert all(r.skipped for r in skipped)
    # GB300 has no cluster spec; the Korthikanti README rows give no layout
    assert {r.id for r in skipped} >= {"korthikanti22-readme-22b-dp1", "bridge-2511-gb300-llama3-8b-fp8cs-8"}


@pytest.mark.parametrize("row_id", ["nemo-2407-h100-llama3-8b-fp8-8", "bridge-2511-h100-llama3-8b-fp8cs-8",
                                    "mcore-llama-example-llama3-8b-fp8-8"])
def test_row_convention_matches_the_flops_per_token_the_source_implies(row_id):
    row = next(r for r in load_rows() if r["id"] == row_id)
    model, cluster, job, par, fw, notes = build_inputs(row)
    conv = row_convention(row)
    assert row_flops_per_token(model, job, par, conv) == pytest.approx(implied_flops_per_token(row), rel=0.01)


def test_assumptions_are_named(report):
    r = next(r for r in report.rows if r.id == "mcore-h100-weak-gpt-1.7b-48")
    assert any("micro_batch_size 1" in a for a in r.assumptions)
    assert any("precision bf16" in a for a in r.assumptions)


def test_cli_json_is_deterministic_and_thresholds_set_the_exit_code(run_cli):
    a = run_cli("validate", "--format", "json", "--max-mape", "100", "--max-group-mape", "1000")
    b = run_cli("validate", "--format", "json", "--max-mape", "100", "--max-group-mape", "1000")
    assert a.exit_code == 0 and a.stdout == b.stdout
    doc = json.loads(a.stdout)
    assert doc["evaluated"] + doc["skipped"] == 104 and "groups" in doc
    strict = run_cli("validate", "--format", "json", "--max-mape", "0.01")
    assert strict.exit_code == 1 and "MAPE" in strict.stderr and len(strict.stderr.strip().splitlines()) == 1


def test_cli_table_and_bad_dataset(run_cli, tmp_path):
    t = run_cli("validate", "--max-mape", "100", "--max-group-mape", "1000")
    assert t.exit_code == 0 and "MAPE per source group" in t.stdout and "overall" in t.stdout
    bad = run_cli("validate", "--dataset", str(tmp_path / "missing.yaml"))
    assert bad.exit_code == 2 and "--dataset" in bad.stderr and "Traceback" not in bad.stderr
    junk = tmp_path / "junk.yaml"
    junk.write_text("a: [1, 2\n")
    r = run_cli("validate", "--dataset", str(junk))
    assert r.exit_code == 2 and "malformed YAML" in r.stderr


def test_custom_dataset(run_cli, tmp_path):
    rows = [r for r in load_rows() if r["id"].startswith("nemo-2407-h100-llama2")]
    p = tmp_path / "mine.yaml"
    import yaml
    p.write_text(yaml.safe_dump(rows))
    r = run_cli("validate", "--dataset", str(p), "--format", "json", "--max-mape", "100")
    assert r.exit_code == 0 and json.loads(r.stdout)["evaluated"] == 3


def test_recipe_settings_read_from_the_rows():
    rows = {r["id"]: r for r in load_rows()}
    # Megatron MoE recipe deepseek_v3/b200 YAML: pipeline_model_parallel_layout "Et*4|(tttt|)*14tmL" = 16 virtual
    # stages over pp 8, i.e. 2 per rank (the row's virtual_pipeline is empty)
    row = rows["mcore-moe-deepseek-v3-b200-mxfp8-256"]
    model, cluster, job, par, fw, notes = build_inputs(row)
    assert (par.pp, par.vpp, par.pipeline_layout) == (8, 2, "Et*4|(tttt|)*14tmL")
    assert row_pipeline_layout(row)[0] == "Et*4|(tttt|)*14tmL"
    # Megatron-Bridge DeepSeek-V3 H100 preset pp_layout "Et|(tt|)*30mL"
    _, _, _, par, _, _ = build_inputs(rows["bridge-2509-h100-deepseekv3-(dropless)-fp8-1024"])
    assert (par.vpp, par.pipeline_layout) == (4, "Et|(tt|)*30mL")
    # torchtitan's default split points for Llama 3.1 405B (126 layers) over pp 8 x 2 stages: 7, 14 x 8, 7
    _, _, _, par, _, _ = build_inputs(rows["torchtitan-2412-llama31-405b-512gpu-interleaved-1f1b"])
    assert par.pipeline_layout == "E" + "t" * 7 + "|" + "|".join(["t" * 8] * 14) + "|" + "t" * 7 + "L"
    # micro-batches left out: torchtitan's default pp x stages per rank (local batch 32: 16 of 2 interleaved,
    # 8 of 4 with 1F1B; the 4D table's local batch 8 over pp 8: 8 of 1)
    assert par.micro_batch_size == 2
    assert build_inputs(rows["torchtitan-2412-llama31-405b-512gpu-1f1b"])[3].micro_batch_size == 4
    assert build_inputs(rows["torchtitan-2412-llama31-405b-512gpu-cp1-32k"])[3].micro_batch_size == 1
    # FP8 scaling recipe from the precision column; the 25.09 DeepSeek-V3 H100 row's note names blockwise scaling as
    # the alternative, so its "FP8" is per-tensor
    assert fp8_recipe(rows["bridge-2511-h100-qwen3-30b-a3b-fp8cs-16"]) == "cs"
    assert fp8_recipe(rows["bridge-2511-b200-qwen3-30b-a3b-fp8mx-8"]) == "mx"
    assert fp8_recipe(rows["mcore-moe-qwen3-235b-a22b-b200-mxfp8-128"]) == "mx"
    assert fp8_recipe(rows["bridge-2509-h100-deepseekv3-(dropless)-fp8-1024"]) == "cs"


def test_qwen3_30b_h100_rows_both_within_ten_percent(report):
    # BF16 recipe (234 TFLOP/s, no per-expert host cost) and Bridge FP8-CS (121 TFLOP/s, per-tensor FP8 host cost
    # per expert): the pair the previous model could not reconcile
    err = {r.id: r.error for r in report.evaluated}
    assert abs(err["mcore-moe-qwen3-30b-a3b-h100-bf16-32"]) < 0.10
    assert abs(err["bridge-2511-h100-qwen3-30b-a3b-fp8cs-16"]) < 0.10


def test_no_published_configuration_is_predicted_infeasible(report):
    # they all ran (issue: "no published configuration is predicted infeasible")
    assert [(r.id, r.violations) for r in report.infeasible] == []


@pytest.mark.parametrize("path,value,needle", [
    ("parallel.tp", 0, "field 'parallel.tp' = 0 is outside [1, 1638400]"),
    ("parallel.tp", "eight", "parallel.tp must be a number, got 'eight'"),
    ("architecture.num_attention_heads", 0, "field 'architecture.num_attention_heads' = 0 is outside [1, 16000]"),
    ("architecture", [1, 2], "architecture must be a mapping"),
    ("measured.tflops_per_gpu", "fast", "measured.tflops_per_gpu must be a number, got 'fast'"),
    ("measured.tflops_per_gpu", -5.0, "field 'measured.tflops_per_gpu' = -5 is outside [0.001, 1e+06]"),
    ("parallel.tp", True, "parallel.tp must be a number, got 'True'"),
])
def test_bad_dataset_rows_are_one_line_errors(run_cli, tmp_path, path, value, needle):
    import copy

    import yaml
    row = copy.deepcopy(next(r for r in load_rows() if r["id"] == "sc21-megatron-gpt-1.7b-a100-32"))
    d, keys = row, path.split(".")
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    f = tmp_path / "rows.yaml"
    f.write_text(yaml.safe_dump([row]))
    r = run_cli("validate", "--dataset", str(f))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "rows.yaml: row 'sc21-megatron-gpt-1.7b-a100-32'" in r.stderr and needle in r.stderr


def test_dataset_with_no_usable_row_is_an_input_error(run_cli, tmp_path):
    f = tmp_path / "rows.yaml"
    f.write_text("[]\n")
    r = run_cli("validate", "--dataset", str(f), "--format", "json")
    assert r.exit_code == 2 and "no row could be evaluated" in r.stderr and r.stdout == ""
    from planner.validation import ValidationReport
    assert ValidationReport([]).to_dict()["mape_percent"] is None  # never NaN in the JSON


def test_duplicate_row_ids_are_refused(run_cli, tmp_path):
    import yaml
    row = next(r for r in load_rows() if r["id"] == "sc21-megatron-gpt-1.7b-a100-32")
    f = tmp_path / "rows.yaml"
    f.write_text(yaml.safe_dump([row, row]))
    r = run_cli("validate", "--dataset", str(f))
    assert r.exit_code == 2 and "appears twice" in r.stderr
