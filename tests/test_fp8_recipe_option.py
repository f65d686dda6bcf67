"""``--fp8-recipe``: the FP8 scaling recipe, an option on every command that times a job (it changes the physics:
current scaling's amax pass, Hopper's fast-accumulation forward GEMMs, the per-expert host cost), checked against the
GPU and the framework, recorded in the JSON document and emitted as given."""
from __future__ import annotations

import typing

import pytest

from cluster_specs import get_cluster
from cost_models.config import Fp8Recipe, ParallelConfig, TrainingJob
from model_zoo import get_model

FP8_8K = ("--precision", "fp8", "--seq-length", "8192", "--global-batch-size", "64", "--tp", "4", "--format", "json")


def test_choices_are_the_cost_models_recipes():
    from cost_models.fp8_recipe import FRAMEWORK_FP8_RECIPES, HOST_COST_CLASS
    from planner.api_options import FP8_RECIPES
    assert FP8_RECIPES == typing.get_args(Fp8Recipe)
    assert set(FP8_RECIPES) == set(HOST_COST_CLASS) == set(FRAMEWORK_FP8_RECIPES["megatron"])


def test_recipe_problems_follow_the_hardware_and_the_framework():
    from cost_models.fp8_recipe import fp8_recipe_problem
    h100, b200 = get_cluster("dgx-h100"), get_cluster("dgx-b200")
    # Transformer Engine check_mxfp8_support: compute capability >= 10.0 (Blackwell: plan3d's fp4 peak)
    assert "block-scaled tensor cores" in fp8_recipe_problem("mxfp8", h100)
    assert fp8_recipe_problem("mxfp8", b200) is None
    for r in ("delayed", "tensorwise", "blockwise"):
        assert fp8_recipe_problem(r, h100) is None
    # Megatron-DeepSpeed's --fp8-hybrid is delayed scaling; torchtitan's float8 is dynamic tensorwise
    assert fp8_recipe_problem("delayed", h100, "deepspeed") is None
    assert fp8_recipe_problem("tensorwise", h100, "deepspeed") == "deepspeed runs FP8 with delayed"
    assert fp8_recipe_problem("tensorwise", h100, "torchtitan") is None
    assert fp8_recipe_problem("delayed", h100, "torchtitan") == "torchtitan runs FP8 with tensorwise"


def test_a_framework_with_one_recipe_runs_it_by_default():
    # Megatron-DeepSpeed's --fp8-hybrid is delayed scaling whatever the GPU or model (its launch emits no recipe),
    # torchtitan's float8 dynamic tensorwise; Megatron-LM picks by GPU, model and recompute (default_fp8_recipe)
    from cost_models.fp8_recipe import job_fp8_recipe
    job = TrainingJob(global_batch_size=256, seq_length=4096, precision="fp8")
    par = ParallelConfig(dp=8, ep=8)
    moe, b200, h100 = get_model("mixtral-8x7b"), get_cluster("dgx-b200"), get_cluster("dgx-h100")
    assert job_fp8_recipe(job, b200, moe, par, "deepspeed") == job_fp8_recipe(job, h100, moe, par, "deepspeed") \
        == "delayed"
    assert job_fp8_recipe(job, b200, moe, par, "torchtitan") == "tensorwise"
    assert (job_fp8_recipe(job, b200, moe, par), job_fp8_recipe(job, h100, moe, par)) == ("mxfp8", "blockwise")


def test_launches_without_a_recipe_setting_refuse_a_named_one():
    from planner.emit import launch_fields
    m, par = get_model("llama2-7b"), ParallelConfig(dp=8, micro_batch_size=1)
    job = TrainingJob(global_batch_size=64, seq_length=4096, precision="fp8")
    named = launch_fields(m, job.model_copy(update={"fp8_recipe": "tensorwise"}), par, 8)["unsupported"]
    assert "delayed scaling (it has no recipe argument)" in named["megatron_deepspeed"]
    assert "use_fp8 computes its own scales" in named["colossalai"]
    assert "megatron" not in named
    ok = launch_fields(m, job.model_copy(update={"fp8_recipe": "delayed"}), par, 8)["unsupported"]
    assert "megatron_deepspeed" not in ok and "use_fp8 computes its own scales" in ok["colossalai"]
    assert "colossalai" not in launch_fields(m, job, par, 8)["unsupported"]  # no recipe named: its own scaling


def test_evaluate_times_and_emits_the_recipe(run_cli):
    delayed = run_cli("evaluate", *FP8_8K[:-2], "--fp8-recipe", "delayed", "--emit", "megatron")
    tensorwise = run_cli("evaluate", *FP8_8K[:-2], "--fp8-recipe", "tensorwise", "--emit", "megatron")
    assert delayed.exit_code == 0 and tensorwise.exit_code == 0, (delayed.stderr, tensorwise.stderr)
    assert "--fp8-recipe delayed" in delayed.stdout and "--fp8-recipe tensorwise" in tensorwise.stdout
    d, t = (run_cli("evaluate", *FP8_8K, "--fp8-recipe", r).json() for r in ("delayed", "tensorwise"))
    assert (d["input"]["job"]["fp8_recipe"], t["input"]["job"]["fp8_recipe"]) == ("delayed", "tensorwise")
    assert run_cli("evaluate", *FP8_8K).json()["input"]["job"]["fp8_recipe"] is None
    # current scaling reads each cast tensor once more (elementwise.FP8_AMAX_PASS_BYTES: 5 bytes against 3); the
    # GEMMs are the same (both per-tensor: fast-accumulation forward on Hopper)
    bd, bt = d["plans"][0]["time"]["compute_breakdown_s"], t["plans"][0]["time"]["compute_breakdown_s"]
    assert bt["gemm"] == bd["gemm"] and bt["memory_bound"] > bd["memory_bound"]
    assert t["plans"][0]["time"]["step_s"] > d["plans"][0]["time"]["step_s"]


def test_the_library_job_carries_the_recipe_into_the_step_time():
    from cost_models.step_time import estimate_step
    m, c = get_model("llama3.1-8b"), get_cluster("dgx-h100")
    par = ParallelConfig(dp=8, micro_batch_size=1)
    job = TrainingJob(global_batch_size=64, seq_length=8192, precision="fp8")
    steps = {r: estimate_step(m, c, job.model_copy(update={"fp8_recipe": r}), par).step_s
             for r in ("delayed", "tensorwise", "blockwise")}
    assert estimate_step(m, c, job, par).step_s == steps["delayed"]  # the dense Hopper default
    # blockwise: no fast-accumulation forward (not measured for the block-scaled recipes), no amax pass
    assert steps["delayed"] < steps["tensorwise"] and steps["delayed"] < steps["blockwise"]


@pytest.mark.parametrize("args, message", [
    (("--fp8-recipe", "mxfp8", "--precision", "fp8"),
     "plan3d: error: --fp8-recipe mxfp8: MXFP8 needs block-scaled tensor cores (Blackwell: Transformer Engine "
     "check_mxfp8_support), which the H100 lacks; use delayed or tensorwise or blockwise, or leave it out for the "
     "framework's default"),
    (("--fp8-recipe", "tensorwise"),
     "plan3d: error: --fp8-recipe tensorwise: an FP8 scaling recipe, with --precision bf16; add --precision fp8 or "
     "drop --fp8-recipe"),
    (("--fp8-recipe", "hybrid", "--precision", "fp8"),
     "plan3d: error: --fp8-recipe 'hybrid': must be one of delayed, tensorwise, mxfp8, blockwise"),
    (("--fp8-recipe", "tensorwise", "--precision", "fp8", "--framework", "deepspeed"),
     "plan3d: error: --fp8-recipe tensorwise: deepspeed runs FP8 with delayed; use delayed, or leave it out for the "
     "framework's default"),
])
def test_a_recipe_the_job_cannot_run_is_one_line(run_cli, args, message):
    for cmd in ("plan", "evaluate", "memory", "explain"):
        r = run_cli(cmd, *args)
        assert r.exit_code == 2 and r.stderr == message + "\n", (cmd, r.stderr)


def test_not_over_pools(run_cli):
    r = run_cli("plan", "--cluster", "dgx-h100:2,dgx-a100-80g:2", "--precision", "fp8", "--fp8-recipe", "delayed")
    assert r.exit_code == 2 and "--fp8-recipe: not available over pools" in r.stderr, r.stderr


def test_delayed_scaling_with_layernorm_recompute_is_infeasible(run_cli):
    # megatron-core TransformerConfig: "Delayed scaling does not support moe_act and layernorm recompute for fp8"
    args = (*FP8_8K, "--recompute", "selective", "--recompute-modules", "layernorm,core_attn")
    r = run_cli("evaluate", *args, "--fp8-recipe", "delayed")
    assert r.exit_code == 0, r.stderr
    plan = r.json()["plans"][0]
    assert not plan["feasible"]
    assert [v for v in plan["violations"] if "fp8_delayed_recompute" in v or "--fp8-recipe delayed" in v], plan
    ok = run_cli("evaluate", *args, "--fp8-recipe", "tensorwise").json()["plans"][0]
    assert not [v for v in ok["violations"] if "--fp8-recipe delayed" in v], ok["violations"]
    # megatron-core's rule: not charged to the other frameworks
    from planner.checks import constraint_report
    job = TrainingJob(global_batch_size=64, seq_length=8192, precision="fp8", fp8_recipe="delayed")
    par = ParallelConfig(tp=4, dp=2, recompute="selective", recompute_modules=("layernorm",))
    m, c = get_model("llama3.1-8b"), get_cluster("dgx-h100")
    names = {fw: {x.name for x in constraint_report(m, c, job, par, 8, framework=fw) if not x.ok}
             for fw in ("megatron", "deepspeed")}
    assert "fp8_delayed_recompute" in names["megatron"] and "fp8_delayed_recompute" not in names["deepspeed"]


def test_fallback_reevaluates_the_plan_with_its_recipe(run_cli, tmp_path):
    doc = tmp_path / "plan.json"
    r = run_cli("plan", "--nodes", "4", "--precision", "fp8", "--fp8-recipe", "tensorwise", "--format", "json",
                "--output", str(doc))
    assert r.exit_code == 0, r.stderr
    import json
    planned = json.loads(doc.read_text())
    assert planned["input"]["job"]["fp8_recipe"] == "tensorwise"
    fb = run_cli("fallback", "--plan", str(doc), "--max-lost-nodes", "1", "--format", "json")
    assert fb.exit_code == 0, fb.stderr
    assert fb.json()["original"]["time"]["step_s"] == planned["plans"][0]["time"]["step_s"]
    # a recipe read from the document that the job can no longer run is named as the document's
    bad = tmp_path / "b200.json"
    r = run_cli("plan", "--cluster", "dgx-b200", "--nodes", "2", "--precision", "fp8", "--fp8-recipe", "mxfp8",
                "--top-k", "1", "--format", "json", "--output", str(bad))
    assert r.exit_code == 0, r.stderr
    fb = run_cli("fallback", "--plan", str(bad), "--cluster", "dgx-h100", "--max-lost-nodes", "1")
    assert fb.exit_code == 2 and fb.stderr == (
        "plan3d: error: --plan's input.job.fp8_recipe mxfp8: MXFP8 needs block-scaled tensor cores (Blackwell: "
        "Transformer Engine check_mxfp8_support), which the H100 lacks; give --fp8-recipe to replace it\n"), fb.stderr
