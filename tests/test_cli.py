"""End-to-end CLI behaviour (issue: plan3d plan, the whole job end to end)."""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model
from planner.checks import check_config
from planner.evaluation import evaluate


def _par(p: dict) -> ParallelConfig:
    keys = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage", "sequence_parallel",
            "recompute", "recompute_num_layers", "first_stage_layers", "last_stage_layers",
            "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
    return ParallelConfig(**{k: p[k] for k in keys})


def _recheck(doc: dict) -> None:
    """Every emitted plan passes the independent checker, with memory recomputed from scratch."""
    inp = doc["input"]
    model, cluster = get_model(inp["model"]["name"]), get_cluster(inp["cluster"]["name"])
    job = TrainingJob(global_batch_size=inp["job"]["global_batch_size"], seq_length=inp["job"]["seq_length"],
                      precision=inp["job"]["precision"])
    n = inp["cluster"]["num_gpus"]
    for plan in doc["plans"]:
        par = _par(plan["parallel"])
        ev = evaluate(model, cluster, job, par, n)
        assert check_config(model, cluster, job, par, n, memory=ev.memory) == []
        assert par.tp * par.pp * par.dp * par.cp == n
        assert plan["memory"]["peak_bytes"] <= plan["memory"]["capacity_bytes"]
        assert plan["parallel"]["num_microbatches"] * par.micro_batch_size * par.dp == job.global_batch_size


def test_default_plan_runs_on_builtin_default(run_cli):
    r = run_cli("plan", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert doc["schema_version"] == "1.8"
    assert doc["input"]["model"]["name"] == "llama3.1-8b"
    # HF LlamaForCausalLM parameter count (shared/data/param_counts.json)
    assert doc["input"]["model"]["num_parameters"] == 8_030_261_248
    assert doc["input"]["cluster"]["name"] == "dgx-h100" and doc["input"]["cluster"]["num_gpus"] == 8
    assert 1 <= len(doc["plans"]) <= 5
    assert [p["rank"] for p in doc["plans"]] == list(range(1, len(doc["plans"]) + 1))
    tps = [p["throughput"]["tokens_per_s"] for p in doc["plans"]]
    assert tps == sorted(tps, reverse=True)
    _recheck(doc)


def test_plan_json_is_byte_identical(run_cli):
    a = run_cli("plan", "--model", "llama2-7b", "--gpus", "16", "--format", "json")
    b = run_cli("plan", "--model", "llama2-7b", "--gpus", "16", "--format", "json")
    assert a.exit_code == 0 and a.stdout == b.stdout


def test_llama31_405b_on_16384_h100(run_cli):
    r = run_cli("plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "16384",
                "--global-batch-size", "2048", "--seq-length", "8192", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert doc["plans"] and all(p["feasible"] for p in doc["plans"])
    for p in doc["plans"]:
        q = p["parallel"]
        assert q["tp"] * q["pp"] * q["dp"] * q["cp"] == 16384
    _recheck(doc)


def test_llama3_paper_layout_is_feasible(run_cli):
    """Llama 3 paper (Dubey et al. 2024, Table 4): 405B on 16,384 H100, TP 8, CP 1, PP 16, DP 128, seq 8192,
    16M tokens per batch (GBS 2048), micro-batch 1. Their FSDP shards gradients and optimizer states but
    keeps parameters after forward (Sec. 3.3.2), i.e. ZeRO-2 memory; Megatron-style SP with TP."""
    r = run_cli("evaluate", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "16384",
                "--global-batch-size", "2048", "--seq-length", "8192", "--tp", "8", "--pp", "16",
                "--micro-batch-size", "1", "--zero-stage", "2", "--sequence-parallel", "--format", "json")
    assert r.exit_code == 0, r.stderr
    p = r.json()["plans"][0]
    assert p["feasible"], p["violations"]
    assert p["parallel"]["dp"] == 128
    # 126 layers over 16 stages: one layer fewer on the first and last stage (7 + 14 x 8 + 7)
    assert (p["parallel"]["first_stage_layers"], p["parallel"]["last_stage_layers"]) == (7, 7)
    assert p["parallel"]["num_microbatches"] == 16


def test_evaluate_reports_violations_instead_of_failing(run_cli):
    r = run_cli("evaluate", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "8", "--pp", "1",
                "--global-batch-size", "7", "--micro-batch-size", "2", "--format", "json")
    assert r.exit_code == 0
    p = r.json()["plans"][0]
    assert not p["feasible"]
    assert any("global_batch_size" in v and "7" in v for v in p["violations"])


def test_emit_megatron_and_deepspeed(run_cli):
    r = run_cli("plan", "--model", "llama2-7b", "--gpus", "8", "--emit", "megatron")
    assert r.exit_code == 0 and "--tensor-model-parallel-size" in r.stdout
    r = run_cli("plan", "--model", "llama2-7b", "--gpus", "8", "--emit", "deepspeed")
    assert r.exit_code == 0
    import json
    ds = json.loads(r.stdout)
    assert ds["train_batch_size"] == 1024


def test_models_and_clusters_lists(run_cli):
    r = run_cli("models", "--format", "json")
    names = {m["name"] for m in r.json()}
    assert {"llama3.1-405b", "deepseek-v3", "mixtral-8x7b", "gpt3-175b", "bloom-176b"} <= names
    r = run_cli("clusters", "--format", "json")
    assert {c["name"] for c in r.json()} >= {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200",
                                              "gb200-nvl72", "mi300x"}


@pytest.mark.parametrize("args, needle", [
    (("plan", "--model", "lama3.1-8b"), "did you mean"),
    (("plan", "--cluster", "dgx-h10"), "did you mean"),
    (("plan", "--gpus", "12"), "not a multiple of the node size"),
    (("plan", "--gpus", "0"), "--gpus"),
    (("plan", "--gpus", "abc"), "--gpus"),
    (("plan", "--seq-length", "-5"), "--seq-length"),
    (("plan", "--cluster", "dgx-a100-80g", "--precision", "fp8"), "fp8"),
    (("plan", "--precision", "fp4"), "--precision"),
    (("evaluate", "--gpus", "8", "--tp", "3"), "not divisible"),
    (("plan", "--model", ""), "--model: empty"),
    (("plan", "--cluster", ""), "--cluster: empty"),
    # NaN fails every bound: the message says what is wrong, not the bound
    (("plan", "--memory-headroom", "nan"), "--memory-headroom nan: must be a finite number"),
    (("plan", "--at-risk-margin=NaN"), "--at-risk-margin NaN: must be a finite number"),
    # a pinned end stage the search does not have (it said "no structural rule")
    (("plan", "-m", "llama3.1-70b", "--gpus", "64", "--pp", "4", "--first-stage-layers", "5"),
     "--first-stage-layers 5: with --pp 4 and 80 layers plan searches 18, 19, 20"),
    # no suggestion above plan3d's own limit (it suggested 1638408, then refused it)
    (("plan", "--gpus", "1638401"), "1,638,401 GPUs (dgx-h100) is more than 1,638,400"),
    (("plan", "--rank", "2"), "--rank 2 selects the plan --emit writes"),
    (("plan", "--within", "0.1"), "--within applies to --objective headroom only"),
    (("plan", "--objective", "min-gpus", "--target-step-s", "0"), "--target-step-s 0.0: must be a positive"),
    (("plan", "--objective", "min-gpus", "--target-step-s", "inf"), "--target-step-s inf: must be a positive finite"),
    (("plan", "--objective", "min-gpus", "--target-tokens-per-day", "inf"), "--target-tokens-per-day inf"),
    (("validate", "--dataset", "/"), "is a directory"),
    # inf passes min=0 and would switch the threshold off
    (("validate", "--max-mape", "inf"), "'--max-mape': inf: must be a finite number"),
    (("validate", "--max-group-mape", "inf"), "'--max-group-mape': inf: must be a finite number"),
    (("validate", "--cross-validate", "--workers", "0"), "--workers"),
    # an integer is quoted as typed, not in float notation
    (("plan", "--global-batch-size", "10000000000000"), "--global-batch-size 10000000000000 is outside [1, 1638400]"),
    # learned absolute positions (GPT-3: 2048): a longer sequence would be another model
    (("plan", "--model", "gpt3-175b", "--gpus", "64", "--seq-length", "4096"), "exceeds gpt3-175b's learned position embeddings"),
])
def test_bad_input_is_one_line_exit_2(run_cli, args, needle):
    r = run_cli(*args)
    assert r.exit_code == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_malformed_files_name_the_file(run_cli, tmp_path):
    bad = tmp_path / "model.yaml"
    bad.write_text("name: x\nnum_layers: [\n")
    r = run_cli("plan", "--model", str(bad))
    assert r.exit_code == 2 and "model.yaml" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "hidden_size": 4096}')
    r = run_cli("plan", "--model", str(cfg))
    assert r.exit_code == 2 and "config.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    cl = tmp_path / "cluster.yaml"
    cl.write_text("name: c\ngpu: {name: X}\n")
    r = run_cli("plan", "--cluster", str(cl))
    assert r.exit_code == 2 and "cluster.yaml" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_nothing_fits_exit_1_names_binding_constraint(run_cli):
    r = run_cli("plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8")
    assert r.exit_code == 1
    assert "memory" in r.stderr and "GiB" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_hf_config_path_plans(run_cli):
    from conftest import DATA
    cfgs = [DATA / "hf_configs" / "llama3.1-8b.json"]
    assert cfgs
    r = run_cli("plan", "--model", str(cfgs[0]), "--gpus", "8", "--format", "json")
    assert r.exit_code == 0, r.stderr
    # the same count as the built-in entry and HF's LlamaForCausalLM (param_counts.json)
    assert r.json()["input"]["model"]["num_parameters"] == 8_030_261_248


def test_pinned_vpp_plans_only_interleaved_layouts(run_cli):
    # regression: a pin that empties some table rows (vpp 2 needs pp > 1) used to crash the CP-SAT tables
    r = run_cli("plan", "--vpp", "2", "--format", "json")
    assert r.exit_code == 0, r.stderr
    plans = r.json()["plans"]
    assert plans and all(p["parallel"]["vpp"] == 2 and p["parallel"]["pp"] > 1 for p in plans)
    assert all(p["parallel"]["pipeline_schedule"] == "interleaved" for p in plans)


def test_show_yaml_round_trips_as_input(run_cli, tmp_path):
    """`models --show` / `clusters --show` print the YAML formats --model / --cluster accept."""
    r = run_cli("models", "--show", "mixtral-8x7b")
    assert r.exit_code == 0
    (tmp_path / "m.yaml").write_text(r.stdout)
    r = run_cli("clusters", "--show", "dgx-a100-80g")
    assert r.exit_code == 0 and "memory_bytes: 85899345920" in r.stdout  # 81920 MiB (nvidia-smi)
    (tmp_path / "c.yaml").write_text(r.stdout)
    r = run_cli("evaluate", "--model", str(tmp_path / "m.yaml"), "--cluster", str(tmp_path / "c.yaml"),
                "--gpus", "8", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    # HF MixtralForCausalLM parameter count (shared/data/param_counts.json)
    assert doc["input"]["model"]["num_parameters"] == 46_702_792_704
    assert doc["input"]["cluster"]["memory_bytes_per_gpu"] == 81920 * 2**20


def test_version_and_target_without_objective(run_cli):
    r = run_cli("--version")
    assert r.exit_code == 0 and r.stdout.startswith("plan3d ")
    r = run_cli("plan", "--target-step-s", "1")
    assert r.exit_code == 2 and "--objective min-gpus" in r.stderr


def test_cli_headroom_default_matches_the_checker():
    from planner.checks import DEFAULT_MEMORY_HEADROOM
    from planner.cli import HEADROOM_DEFAULT
    assert HEADROOM_DEFAULT == DEFAULT_MEMORY_HEADROOM


def test_expert_tp_on_a_dense_model_is_a_violation(run_cli):
    r = run_cli("evaluate", "--etp", "2", "--tp", "1", "--format", "json")
    assert r.exit_code == 0
    assert any("needs a mixture-of-experts model" in v for v in r.json()["plans"][0]["violations"])


def test_emit_deepspeed_without_a_megatron_deepspeed_launch(run_cli, tmp_path):
    """Llama 3.1's RoPE scaling has no Megatron-DeepSpeed option: ds_config.json is still emitted (valid for any
    DeepSpeed script that builds the model itself), with a one-line note instead of the Megatron-DeepSpeed launch."""
    import json
    r = run_cli("plan", "--emit", "deepspeed")
    assert r.exit_code == 0, r.stderr
    ds = json.loads(r.stdout)
    assert ds["train_batch_size"] == 1024  # the job's global batch (DeepSpeed: micro x GAS x dp)
    assert r.stderr.startswith("plan3d: note:") and "rope_scaling" in r.stderr
    r = run_cli("plan", "--emit", "deepspeed", "--output", str(tmp_path / "ds"))
    assert r.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["ds_config.json",
                                                                    "megatron_deepspeed_unsupported.txt"]


def test_bare_plan3d_prints_the_help(run_cli):
    r = run_cli()
    assert r.exit_code == 2 and r.stderr.startswith("Usage: plan3d") and "plan " in r.stderr


def test_format_json_with_emit_is_refused(run_cli):
    # both choose what is printed; the document's launch section already holds what --emit writes
    for cmd in ("plan", "evaluate"):
        r = run_cli(cmd, "--format", "json", "--emit", "megatron")
        assert r.exit_code == 2 and "--format json with --emit megatron" in r.stderr, r.stderr
