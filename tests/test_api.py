"""The Python API (``planner.plan/evaluate/memory/explain/validate``) is the CLI's own code path: the same input gives
the same document, byte for byte, and the same typed errors (issue 15, item 1)."""
from __future__ import annotations

import json

import pytest

import planner
from cluster_specs import ClusterSpecError, get_cluster
from model_zoo import ModelSpecError, get_model

#: (CLI arguments, API keyword arguments) of the same job; the API's names are the options' (``--seq-length`` ->
#: ``seq_length``)
PLAN_JOBS = [
    ((), {}),
    (("--model", "llama3.1-70b", "--gpus", "64", "--global-batch-size", "512", "--seq-length", "8192"),
     {"model": "llama3.1-70b", "gpus": 64, "global_batch_size": 512, "seq_length": 8192}),
    (("--model", "mixtral-8x7b", "--gpus", "32", "--framework", "deepspeed", "--top-k", "3"),
     {"model": "mixtral-8x7b", "gpus": 32, "framework": "deepspeed", "top_k": 3}),
    (("--model", "llama2-7b", "--gpus", "16", "--tp", "2", "--objective", "headroom", "--within", "0.1",
      "--flops-convention", "palm"),
     {"model": "llama2-7b", "gpus": 16, "tp": 2, "objective": "headroom", "within": 0.1,
      "flops_convention": "palm"}),
    (("--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "512", "--global-batch-size", "1536",
      "--seq-length", "2048", "--no-flash-attention", "--dropout"),
     {"model": "gpt3-175b", "cluster": "dgx-a100-80g", "gpus": 512, "global_batch_size": 1536, "seq_length": 2048,
      "flash_attention": False, "dropout": True}),
]

LAYOUT = (("--model", "llama3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "5", "--zero-stage", "1",
           "--sequence-parallel", "--global-batch-size", "256", "--seq-length", "8192"),
          {"model": "llama3.1-70b", "gpus": 64, "tp": 8, "pp": 4, "vpp": 5, "zero_stage": 1,
           "sequence_parallel": True, "global_batch_size": 256, "seq_length": 8192})


@pytest.mark.parametrize("cli_args,kwargs", PLAN_JOBS)
def test_plan_api_equals_cli(run_cli, cli_args, kwargs):
    r = run_cli("plan", *cli_args, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = planner.plan(**kwargs)
    assert isinstance(doc, planner.PlanDocument)
    assert doc.model_dump_json() == r.stdout
    assert doc.search_stats.num_candidates > 0 and doc.search_stats.num_feasible >= len(doc.plans)


def test_evaluate_memory_explain_api_equal_cli(run_cli):
    cli_args, kwargs = LAYOUT
    r = run_cli("evaluate", *cli_args, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert planner.evaluate(**kwargs).model_dump_json() == r.stdout
    r = run_cli("memory", *cli_args, "--format", "json")
    rep = planner.memory(**kwargs)
    assert rep.document.model_dump_json() == r.stdout
    assert round(rep.estimate.peak_bytes) == rep.document.plans[0].memory.peak_bytes
    assert (r.exit_code == 1) == (rep.status == "OOM")
    r = run_cli("explain", *cli_args, "--format", "json")
    ex = planner.explain(**kwargs)
    assert json.loads(r.stdout) == json.loads(json.dumps(ex.to_dict()))
    assert (r.exit_code == 0) == ex.feasible


def test_api_takes_built_specs():
    """A ModelSpec / ClusterSpec object works where a name does, with the same answer."""
    by_name = planner.evaluate("llama3.1-8b", "dgx-h100", gpus=8, tp=2)
    by_spec = planner.evaluate(get_model("llama3.1-8b"), get_cluster("dgx-h100"), gpus=8, tp=2)
    assert by_name.model_dump_json() == by_spec.model_dump_json()


def test_api_errors_are_typed():
    with pytest.raises(planner.PlanInputError, match="--precision 'fp4': must be one of bf16, fp16, fp8"):
        planner.plan(precision="fp4")
    with pytest.raises(planner.PlanInputError, match="unknown option"):
        planner.evaluate(tensor_parallel=2)
    with pytest.raises(planner.PlanInputError, match="--gpus 8 is not divisible by tp\\*pp\\*cp"):
        planner.evaluate(gpus=8, tp=3)
    with pytest.raises(planner.PlanInputError, match="--objective min-gpus needs exactly one"):
        planner.plan(objective="min-gpus")
    with pytest.raises(ModelSpecError):
        planner.plan("no-such-model")
    with pytest.raises(ClusterSpecError):
        planner.plan(cluster="no-such-cluster")
    assert planner.ModelSpecError is ModelSpecError and planner.ClusterSpecError is ClusterSpecError
    # Llama-3.1-405B cannot fit on one node: the binding constraint and the nearest fit are named
    with pytest.raises(planner.NoFeasiblePlan, match="memory binds by"):
        planner.plan("llama3.1-405b", gpus=8, global_batch_size=64, seq_length=8192)
    # plan's pins are checked as the CLI's option ranges check them (they raised ZeroDivisionError / IndexError)
    for kw, says in (({"tp": 0}, "--tp 0: must be a positive integer"), ({"micro_batch_size": 0}, "--micro-batch"),
                     ({"vpp": 0}, "--vpp 0"), ({"zero_stage": 5}, "--zero-stage 5: must be 0, 1, 2 or 3"),
                     ({"objective": "headroom", "within": 2}, "--within 2: must be a fraction")):
        with pytest.raises(planner.PlanInputError, match=says):
            planner.plan(gpus=8, **kw)


def test_yes_no_options_are_booleans_and_numpy_scalars_are_numbers():
    # bool("false") is True: a yes/no option given a string would have switched the feature on
    for kw in ({"sequence_parallel": "false"}, {"flash_attention": "false"}, {"dropout": "no"},
               {"async_checkpoint": "false", "train_tokens": 1e12}):
        name = "--" + next(iter(kw)).replace("_", "-")
        with pytest.raises(planner.PlanInputError, match=f"{name} '[a-z]+': must be true or false"):
            planner.evaluate("llama3.1-8b", gpus=16, tp=2, **kw)
    np = pytest.importorskip("numpy")
    doc = planner.evaluate("llama3.1-8b", gpus=np.int64(16), tp=np.int64(2), sequence_parallel=np.bool_(True))
    assert (doc.input.cluster.num_gpus, doc.plans[0].parallel.tp, doc.plans[0].parallel.sequence_parallel) == \
        (16, 2, True)
    assert planner.plan is planner.plan and {"plan", "evaluate", "fallback"} <= set(dir(planner))


def test_infeasible_layouts_are_reported_not_raised():
    doc = planner.evaluate("llama3.1-405b", gpus=8, tp=8)
    assert not doc.plans[0].feasible and any("GiB usable" in v for v in doc.plans[0].violations)
    rep = planner.memory("llama3.1-405b", gpus=8, tp=8)
    assert rep.status == "OOM"
    with pytest.raises(planner.NoFeasiblePlan, match="out of memory: stage 0"):
        rep.raise_if_oom()
    ex = planner.explain("llama3.1-405b", gpus=8, tp=8)
    with pytest.raises(planner.NoFeasiblePlan, match="memory binds|binds"):
        ex.raise_if_infeasible()


def test_flash_attention_and_dropout_reach_every_command(run_cli):
    """--no-flash-attention / --dropout change the physics on plan, evaluate, explain and memory alike (issue 9,
    item 3): the unfused s x s scores are stored (Korthikanti et al. 2022 Table 2: 5as^2b bytes per layer with
    dropout) and streamed through HBM, so memory and step time both grow."""
    kw = dict(model="gpt3-175b", cluster="dgx-a100-80g", gpus=512, global_batch_size=1536, seq_length=2048, tp=8,
              pp=8, micro_batch_size=1, recompute="selective", sequence_parallel=True)
    fused = planner.evaluate(**kw).plans[0]
    unfused = planner.evaluate(**kw, flash_attention=False, dropout=True).plans[0]
    assert unfused.time.step_s > fused.time.step_s
    assert unfused.memory.peak_bytes > fused.memory.peak_bytes
    no_dropout = planner.evaluate(**kw, flash_attention=False).plans[0]  # fewer score passes, no masks
    assert no_dropout.time.step_s < unfused.time.step_s and no_dropout.memory.peak_bytes < unfused.memory.peak_bytes
    cli = run_cli("evaluate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "512",
                  "--global-batch-size", "1536", "--seq-length", "2048", "--tp", "8", "--pp", "8",
                  "--recompute", "selective", "--sequence-parallel", "--no-flash-attention", "--dropout",
                  "--format", "json")
    assert cli.json()["plans"][0]["time"]["step_s"] == unfused.time.step_s
    ex = planner.explain(**kw, flash_attention=False, dropout=True)
    assert ex.explanation.evaluation.memory.peak_bytes == unfused.memory.peak_bytes
    assert planner.memory(**kw, flash_attention=False, dropout=True).estimate.peak_bytes == unfused.memory.peak_bytes


def test_validate_api():
    rep = planner.validate()
    assert rep.evaluated and rep.mape < 7.0


def test_capacity_factor_rules_are_one_line_errors():
    """Drop-and-pad routing (--capacity-factor): a MoE model, at most num_experts / top_k (every expert then holds
    every token), Megatron-LM only (its --moe-expert-capacity-factor is what plan3d costs and emits), not with the
    dropless --expert-load-imbalance; any real number type, never another exception type."""
    import numpy as np

    from cost_models.config import ParallelConfig
    from planner.emit import EmitUnsupported
    from planner.emit.colossalai import check_colossalai
    kw = dict(model="qwen3-30b-a3b", cluster="dgx-b200", gpus=8, ep=8, zero_stage=1)
    for extra, msg in ((dict(model="llama3.1-8b", ep=1), "has no experts"),
                       (dict(capacity_factor=17), "at most num_experts / top_k = 16"),
                       (dict(framework="torchtitan"), "--framework torchtitan"),
                       (dict(expert_load_imbalance=2.0), "--expert-load-imbalance with --capacity-factor"),
                       (dict(capacity_factor=2 ** 2000), "--capacity-factor 1"),
                       (dict(capacity_factor=float("nan")), "must be a number")):
        with pytest.raises(planner.PlanInputError, match=msg):
            planner.evaluate(**{**kw, "capacity_factor": 2, **extra})
    for v in (np.float32(1.5), np.int64(2)):
        assert planner.evaluate(**kw, capacity_factor=v).input.job.moe_expert_capacity_factor == float(v)
    doc = planner.evaluate(**kw, capacity_factor=1.5)
    assert "colossalai" in doc.plans[0].launch.unsupported
    job = planner.load_inputs("qwen3-30b-a3b", "dgx-b200", gpus=8, capacity_factor=1.5).job
    with pytest.raises(EmitUnsupported, match="moe_expert_capacity_factor"):
        check_colossalai(get_model("qwen3-30b-a3b"), job, ParallelConfig(dp=8, ep=8, zero_stage=1))
