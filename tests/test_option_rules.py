"""User-facing option rules: MoE routing ratios, per-cluster prices, the memory verdict of a layout that breaks a rule,
the plot extra checked before the work, the pipeline split messages."""
from __future__ import annotations


import pytest

import planner
from cost_models.config import ParallelConfig
from cost_models.layout import LayoutError, stage_layer_counts


def _one_error_line(r, *needles: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("plan3d: error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    return r.stderr


# --- --expert-load-imbalance: at most num_experts / top_k, MoE models only (the --capacity-factor rule) ----------

MIXTRAL = ("-m", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "4", "--ep", "4", "--global-batch-size", "256",
           "--zero-stage", "1", "--sequence-parallel")


@pytest.mark.parametrize("cmd", ["evaluate", "memory"])
def test_expert_load_imbalance_above_experts_over_top_k_is_refused(run_cli, cmd):
    # Mixtral-8x7B routes each token to 2 of 8 experts: the busiest expert holds at most every token, 8 / 2 = 4x the
    # mean
    _one_error_line(run_cli(cmd, *MIXTRAL, "--expert-load-imbalance", "4.5"),
                    "--expert-load-imbalance 4.5: at most num_experts / top_k = 4 for mixtral-8x7b")
    assert run_cli(cmd, *MIXTRAL, "--expert-load-imbalance", "4").exit_code == 0


def test_expert_load_imbalance_on_a_dense_model_is_refused(run_cli):
    _one_error_line(run_cli("evaluate", "--expert-load-imbalance", "1.5"),
                    "--expert-load-imbalance applies to MoE models; llama3.1-8b has no experts")
    _one_error_line(run_cli("plan", "--expert-load-imbalance", "1"), "--expert-load-imbalance applies to MoE models")
    with pytest.raises(planner.PlanInputError, match="has no experts"):
        planner.load_inputs("llama3.1-8b", expert_load_imbalance=1.0)
    # the same rule, the same words as --capacity-factor's
    with pytest.raises(planner.PlanInputError, match="--capacity-factor 5: at most num_experts / top_k = 4 for mix"):
        planner.load_inputs("mixtral-8x7b", capacity_factor=5)


def test_dropout_under_torchtitan_rules_is_refused(run_cli):
    """torchtitan's models have no dropout layers: --dropout with --framework torchtitan would cost masks in memory
    (cost_models/memory.py) that the run never stores, and --emit torchtitan refuses the launch; an input error
    (exit 2) on every command, as --capacity-factor with a framework that cannot express it."""
    for cmd in ("plan", "evaluate", "memory", "explain"):
        _one_error_line(run_cli(cmd, "--gpus", "8", "--framework", "torchtitan", "--dropout"),
                        "--dropout with --framework torchtitan: torchtitan's models have no dropout layers")
    with pytest.raises(planner.PlanInputError, match="no dropout layers"):
        planner.load_inputs("llama3.1-8b", dropout=True, framework="torchtitan")


def test_fp16_under_torchtitan_rules_is_refused(run_cli):
    """torchtitan's mixed_precision_param is Literal["bfloat16", "float32"] (0.2.2 job_config.py, 0.3.0 configs.py)
    and it has no fp16 loss scaling: --precision fp16 under torchtitan rules is an input error, and a plan of other
    rules emitted for torchtitan is refused before the search (it once wrote mixed_precision_param = "float16")."""
    _one_error_line(run_cli("plan", "--gpus", "8", "--framework", "torchtitan", "--precision", "fp16"),
                    "--precision fp16 with --framework torchtitan")
    r = run_cli("plan", "--gpus", "8", "--framework", "megatron", "--precision", "fp16", "--emit", "torchtitan")
    assert r.exit_code == 1 and "precision fp16: torchtitan has no setting" in r.stderr


# --- --gpu-hour-price NAME=USD names the clusters being planned -------------------------------------------------

def test_gpu_hour_price_for_a_cluster_not_planned_is_refused(run_cli):
    r = run_cli("plan", "--cluster", "dgx-h100,dgx-b200", "--train-tokens", "1e12", "--gpu-hour-price",
                "dgx-h100=2,foo=3")
    _one_error_line(r, "--gpu-hour-price foo=3: not a cluster being planned", "dgx-h100, dgx-b200")
    for cmd in (("plan",), ("evaluate", "--tp", "8")):
        r = run_cli(*cmd, "--train-tokens", "1e12", "--gpu-hour-price", "dgx-h200=2")
        _one_error_line(r, "--gpu-hour-price dgx-h200=2: not a cluster being planned; NAME is one of dgx-h100")
    with pytest.raises(planner.PlanInputError, match="foo=3: not a cluster being planned"):
        planner.compare(clusters="dgx-h100,dgx-b200", train_tokens=1e12, gpu_hour_price={"foo": 3})


def test_gpu_hour_price_per_cluster_still_prices_each_cluster(run_cli):
    r = run_cli("plan", "--cluster", "dgx-h100,dgx-b200", "--train-tokens", "1e12", "--gpu-hour-price", "dgx-h100=2",
                "--format", "json")
    assert r.exit_code == 0, r.stderr
    cost = {row["cluster"]: row["document"]["plans"][0]["cost"] for row in r.json()["rows"]}
    assert cost["dgx-h100"]["usd_per_gpu_hour"] == 2.0 and cost["dgx-h100"]["price_source"] == "--gpu-hour-price"
    assert cost["dgx-b200"]["price_source"] != "--gpu-hour-price"  # the cluster's own dated price
    doc = run_cli("evaluate", "--tp", "8", "--train-tokens", "1e12", "--gpu-hour-price", "dgx-h100=2.5",
                  "--format", "json").json()
    assert doc["plans"][0]["cost"]["usd_per_gpu_hour"] == 2.5


# --- plan3d memory reports the layout's broken rules (exit 1, as explain) ----------------------------------------

def test_memory_of_a_layout_breaking_a_rule_is_not_fits(run_cli):
    # Qwen2.5-7B: 28 attention heads over tp 8 (evaluate reports heads_tp); the memory alone would fit
    r = run_cli("memory", "--model", "qwen2.5-7b", "--tp", "8")
    assert r.exit_code == 1
    assert "verdict: invalid layout: heads_tp (num_attention_heads % tp: 28 % 8 = 4)" in r.stdout
    assert "verdict: fits" not in r.stdout
    assert r.stderr == "plan3d: configuration infeasible: heads_tp (num_attention_heads % tp: 28 % 8 = 4)\n"
    doc = run_cli("memory", "--model", "qwen2.5-7b", "--tp", "8", "--format", "json").json()
    assert not doc["plans"][0]["feasible"] and doc["plans"][0]["violations"] == ["num_attention_heads % tp: 28 % 8 = 4"]
    rep = planner.memory("qwen2.5-7b", tp=8)
    assert rep.status == "fits" and [v.name for v in rep.violations] == ["heads_tp"]
    assert rep.verdict.startswith("invalid layout: heads_tp")
    with pytest.raises(planner.NoFeasiblePlan, match="heads_tp"):
        rep.raise_if_infeasible()


def test_one_layout_commands_exit_codes_agree_with_the_readme(run_cli):
    """README: evaluate exits 0 for any layout its options form (feasible and violations reported), explain and
    memory exit 1 for an infeasible one, and options that form no layout (--tp 3 on 8 GPUs) are exit 2 on all three."""
    bad = ("--model", "qwen2.5-7b", "--tp", "8")
    r = run_cli("evaluate", *bad, "--format", "json")
    assert r.exit_code == 0 and not r.json()["plans"][0]["feasible"]
    assert run_cli("explain", *bad).exit_code == 1
    assert run_cli("memory", *bad).exit_code == 1
    # a layer split the cost models cannot build: no memory estimate, still exit 1 naming the rule
    split = ("--model", "llama3.1-70b", "--gpus", "32", "--pp", "4", "--first-stage-layers", "79",
             "--last-stage-layers", "1")
    r = run_cli("memory", *split)
    assert r.exit_code == 1 and r.stderr.startswith("plan3d: configuration infeasible: layers_pp (")
    assert run_cli("evaluate", *split).exit_code == 0 and run_cli("explain", *split).exit_code == 1
    for cmd in ("evaluate", "explain", "memory"):
        _one_error_line(run_cli(cmd, "--model", "llama3.1-8b", "--tp", "3"), "--gpus 8 is not divisible by tp*pp*cp")


# --- the plot extra is checked before the work -------------------------------------------------------------------

def _never_called(monkeypatch, module, name, calls):
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(name))


def test_missing_matplotlib_fails_before_the_work(run_cli, tmp_path, monkeypatch, no_matplotlib):
    import planner.api
    import planner.cli.plan_cmd
    import planner.fallback_plans
    import planner.sweeps
    calls: list[str] = []
    _never_called(monkeypatch, planner.sweeps, "sweep", calls)
    _never_called(monkeypatch, planner.sweeps, "load_grid", calls)
    _never_called(monkeypatch, planner.fallback_plans, "fallback", calls)
    _never_called(monkeypatch, planner.cli.plan_cmd, "_plan_pools", calls)
    _never_called(monkeypatch, planner.api, "plan", calls)
    _never_called(monkeypatch, planner.api, "compare", calls)
    need = "needs matplotlib: pip install 'plan3d[plot]'"
    _one_error_line(run_cli("sweep", str(tmp_path / "grid.yaml"), "--plot", "-o", str(tmp_path / "out")),
                    f"--plot {need}")
    _one_error_line(run_cli("fallback", "--nodes", "4", "--max-lost-nodes", "1", "--plot", str(tmp_path / "f.png")),
                    f"--plot {need}")
    _one_error_line(run_cli("plan", "--cluster", "dgx-h100:1,dgx-a100-80g:1", "--timeline", str(tmp_path / "t.svg")),
                    f"--timeline {need}")
    _one_error_line(run_cli("plan", "--train-tokens", "1e12", "--plot", str(tmp_path / "c.png")), f"--plot {need}")
    assert calls == []
    # memory --plot: the same check, the same line
    r = run_cli("memory", "--plot", str(tmp_path / "m.png"))
    assert r.stderr == f"plan3d: error: --plot {need}\n"


def test_bad_picture_suffix_fails_before_the_work(run_cli, tmp_path, monkeypatch):
    import planner.cli.plan_cmd
    import planner.fallback_plans
    calls: list[str] = []
    _never_called(monkeypatch, planner.fallback_plans, "fallback", calls)
    _never_called(monkeypatch, planner.cli.plan_cmd, "_plan_pools", calls)
    _one_error_line(run_cli("fallback", "--nodes", "4", "--max-lost-nodes", "1", "--plot", str(tmp_path / "f.pdf")),
                    "--plot", ".svg or .png")
    _one_error_line(run_cli("plan", "--cluster", "dgx-h100:1,dgx-a100-80g:1", "--timeline", str(tmp_path / "t.pdf")),
                    "--timeline", ".svg or .png")
    assert calls == []


# --- validate --help states the cross-validation's real duration --------------------------------------------------

def test_validate_help_states_the_cross_validation_time(run_cli):
    r = run_cli("validate", "--help")
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "~100 s on a 2-core machine" in text and "~3 min" not in text
    assert "--workers" in text


# --- first/last stage layers: say what is wrong ------------------------------------------------------------------

@pytest.mark.parametrize("kw,says", [
    (dict(first_stage_layers=79, last_stage_layers=1),
     "first + last stage layers (79 + 1 = 80) take all 80 layers: the 2 middle pipeline stages would be empty"),
    (dict(first_stage_layers=100), "first stage layers (100) exceed the model's 80 layers"),
    (dict(first_stage_layers=60, last_stage_layers=30), "first + last stage layers (60 + 30 = 90) exceed the model's"),
    (dict(first_stage_layers=78, last_stage_layers=1),
     "leave 1 of the 80 layers for the 2 middle pipeline stages: each stage needs at least one layer"),
    (dict(first_stage_layers=3, last_stage_layers=4),
     "the 73 layers left after the first + last stage layers (3 + 4 = 7) are not divisible by the 2 middle"),
    (dict(last_stage_layers=79), "leave 1 of the 80 layers for the 3 other pipeline stages"),
])
def test_stage_layer_split_messages_say_what_is_wrong(kw, says):
    with pytest.raises(LayoutError) as e:
        stage_layer_counts(80, ParallelConfig(pp=4, **kw))
    assert says in str(e.value) and "remaining" not in str(e.value)


def test_stage_layer_split_message_reaches_the_cli(run_cli):
    base = ("--model", "llama3.1-70b", "--gpus", "32", "--pp", "4", "--format", "json")
    doc = run_cli("evaluate", *base, "--first-stage-layers", "79", "--last-stage-layers", "1").json()
    assert "the 2 middle pipeline stages would be empty" in doc["plans"][0]["violations"][0]
    doc = run_cli("evaluate", *base, "--first-stage-layers", "100").json()
    assert doc["plans"][0]["violations"][0] == "first stage layers (100) exceed the model's 80 layers"


# --- options a framework cannot run are violations, not silently dropped (helper break-test, 2026-12-04) -----------

@pytest.mark.parametrize("args,needle", [
    (("--param-cpu-offload", "--zero-stage", "1"), "param_cpu_offload is DeepSpeed ZeRO-3's offload_param"),
    (("--param-cpu-offload", "--zero-stage", "3"), "(framework megatron, zero 3)"),
    (("--exp-avg-dtype", "bf16", "--zero-stage", "1", "--framework", "deepspeed"),
     "exp_avg_dtype bf16: Megatron-LM's precision-aware optimizer"),
])
def test_options_the_framework_cannot_run_are_violations(run_cli, args, needle):
    r = run_cli("evaluate", *args, "--format", "json")
    assert r.exit_code == 0, r.stderr  # evaluate reports a layout's violations (README)
    plan = r.json()["plans"][0]
    assert not plan["feasible"] and any(needle in v for v in plan["violations"]), plan["violations"]
    assert run_cli("memory", *args).exit_code == 1


def test_param_offload_under_deepspeed_zero3_is_a_plan():
    doc = planner.evaluate(gpus=8, zero_stage=3, param_cpu_offload=True, framework="deepspeed")
    assert not any("param_cpu_offload" in v for v in doc.plans[0].violations)


def test_default_sequence_length_stays_inside_a_learned_position_table(run_cli):
    # GPT-3's 2048 learned positions: the default 4096 would be refused; an explicit --seq-length 4096 still is
    r = run_cli("evaluate", "-m", "gpt3-175b", "--gpus", "64", "--tp", "8", "--pp", "8", "--format", "json")
    assert r.exit_code == 0 and r.json()["input"]["job"]["seq_length"] == 2048, r.stderr
    _one_error_line(run_cli("evaluate", "-m", "gpt3-175b", "--gpus", "64", "--seq-length", "4096"),
                    "--seq-length 4096 exceeds gpt3-175b's learned position embeddings")
    assert planner.evaluate(model="llama3.1-8b", gpus=8).input.job.seq_length == 4096


# --- Megatron-DeepSpeed splits layers itself, heavier stages first (break test, 2026-12-04) ------------------------

def test_deepspeed_split_is_the_one_deepspeed_runs():
    from cost_models.layout import deepspeed_pipeline_layout, parse_pipeline_layout
    counts = [c.count("t") for c in parse_pipeline_layout(deepspeed_pipeline_layout(70, 12))]
    assert counts == [6] * 10 + [5] * 2  # BLOOM-176B's 70 layers over its 12 stages
    assert [c.count("t") for c in parse_pipeline_layout(deepspeed_pipeline_layout(126, 16))] == [8] * 14 + [7] * 2
    assert deepspeed_pipeline_layout(96, 8) is None  # even: no layout
    try:  # DeepSpeed's own partitioner over the type:transformer weights (the validators extra)
        from deepspeed.runtime.utils import partition_balanced
    except Exception:  # noqa: BLE001 - deepspeed absent or unusable without a GPU stack
        return
    w = [0] + [1] * 70 + [0, 0]  # embedding, 70 transformer layers, final norm, output head
    parts = partition_balanced(w, 12)
    assert [sum(w[parts[i]:parts[i + 1]]) for i in range(12)] == counts


def test_bloom_published_layout_is_a_deepspeed_plan():
    # BLOOM trained on 384 A100s at tp 4 pp 12 dp 8, micro-batch 2, Megatron-DeepSpeed: plan had found no DeepSpeed
    # plan at all (uneven first/last splits excluded), evaluate had called Megatron's 5 + 10 x 6 + 5 split feasible
    job = dict(model="bloom-176b", cluster="dgx-a100-80g", gpus=384, global_batch_size=2048, seq_length=2048,
               framework="deepspeed")
    plans = planner.plan(**job, top_k=5).plans
    assert any((p.parallel.tp, p.parallel.pp, p.parallel.micro_batch_size) == (4, 12, 2) for p in plans)
    ev = planner.evaluate(**job, tp=4, pp=12, micro_batch_size=2, zero_stage=1, recompute="full").plans[0]
    assert ev.feasible and ev.parallel.pipeline_layout.startswith("Etttttt|")
    pinned = planner.evaluate(**job, tp=4, pp=12, micro_batch_size=2, zero_stage=1, recompute="full",
                              first_stage_layers=5, last_stage_layers=5).plans[0]
    assert any("Megatron-DeepSpeed balances the transformer layers itself" in v for v in pinned.violations)


def test_plan_table_shows_deepspeeds_split(run_cli):
    r = run_cli("plan", "--model", "bloom-176b", "--cluster", "dgx-a100-80g", "--gpus", "384",
                "--global-batch-size", "2048", "--seq-length", "2048", "--framework", "deepspeed")
    assert r.exit_code == 0 and "10x6,2x5" in r.stdout, r.stderr


def test_recompute_num_layers_above_a_chunk_is_a_violation():
    # megatron-core TransformerConfig: "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank";
    # 1000 on Llama 3.1 8B's 32 layers had been shown as "full 1000/chunk" (break test, 2026-12-04)
    v = planner.evaluate(recompute="full", recompute_num_layers=1000).plans[0].violations
    assert any("recompute_num_layers 1000 between 1 and the layers of a model chunk (32)" in x for x in v), v
    ok = planner.evaluate(recompute="full", recompute_num_layers=32).plans[0].violations
    assert not any("recompute_num_layers" in x for x in ok), ok
