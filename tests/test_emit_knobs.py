"""Emit only what was evaluated: every emitter either expresses every knob of the plan it is given, or refuses with
the knob named (issue 11, item 6).

For each framework the whole search space of a few jobs (every candidate ``planner.space.candidates`` yields for
that framework, with the partial recompute the search derives) is emitted and read back from the emitted config
(Megatron-LM arguments, Megatron-DeepSpeed arguments + ds_config.json, torchtitan TOML): the read-back knobs must
equal the plan's. Knob values the search does not produce (other schedules, recipe knobs, job settings) must be
expressed the same way or refused with a reason that names the knob.
"""
from __future__ import annotations

import tomllib

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model
from planner.emit import (deepspeed_config, launch_fields, megatron_args, megatron_deepspeed_args,
                          torchtitan_toml)
from planner.recompute import with_fewest_recomputed_layers
from planner.space import SearchSpace, candidates
from test_emit_support import parse_argv

H100 = get_cluster("dgx-h100")


def _schedule(par: ParallelConfig) -> str:
    s = par.pipeline_schedule
    return "1f1b" if s == "interleaved" and par.vpp == 1 else s


def plan_knobs(model, job: TrainingJob, par: ParallelConfig) -> dict:
    """The knobs an emitted config must carry (the evaluated configuration)."""
    pp1 = par.pp == 1
    return {"tp": par.tp, "pp": par.pp, "cp": par.cp, "dp": par.dp, "ep": par.ep,
            "etp": par.expert_tp if par.ep > 1 else None, "vpp": par.vpp, "mbs": par.micro_batch_size,
            "gbs": job.global_batch_size, "zero": par.zero_stage, "sp": par.sequence_parallel,
            "recompute": par.recompute, "recompute_num_layers": par.recompute_num_layers,
            "recompute_method": par.recompute_method if par.recompute_num_layers else None,
            "schedule": "1f1b" if pp1 and par.pipeline_schedule != "combined-1f1b" else _schedule(par),
            "precision": job.precision, "flash": job.flash_attention, "dropout": job.dropout}


def megatron_knobs(model, a: dict) -> dict:
    """Read the knobs back from Megatron-LM arguments (argument semantics: megatron/training/arguments.py)."""
    tp, pp, cp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"], a.get("context_parallel_size", 1)
    layers = model.num_layers + bool(a.get("account_for_embedding_in_pipeline_split")) + bool(
        a.get("account_for_loss_in_pipeline_split"))
    if "num_layers_per_virtual_pipeline_stage" in a:
        vpp = layers // pp // a["num_layers_per_virtual_pipeline_stage"]
    else:
        vpp = a.get("num_virtual_stages_per_pipeline_rank", 1)
    strategy = a.get("data_parallel_sharding_strategy")
    zero = {"optim_grads": 2, "optim_grads_params": 3}.get(strategy, 1 if a.get("use_distributed_optimizer") else 0)
    rc = a.get("recompute_granularity", "none")
    method = a.get("recompute_method")
    n_rc = None if method is None or (method == "uniform" and a["recompute_num_layers"] == 1) else \
        a["recompute_num_layers"]
    ep = a.get("expert_model_parallel_size", 1)
    sched = "combined-1f1b" if a.get("overlap_moe_expert_parallel_comm") else "interleaved" if vpp > 1 else "1f1b"
    return {"tp": tp, "pp": pp, "cp": cp, "dp": None, "ep": ep,
            "etp": a.get("expert_tensor_parallel_size", tp) if ep > 1 else None, "vpp": vpp,
            "mbs": a["micro_batch_size"], "gbs": a["global_batch_size"], "zero": zero,
            "sp": bool(a.get("sequence_parallel")), "recompute": rc, "recompute_num_layers": n_rc,
            "recompute_method": method if n_rc else None, "schedule": sched,
            "precision": "fp8" if "fp8_format" in a else "fp16" if a.get("fp16") else "bf16",
            "flash": a.get("attention_backend") != "unfused", "dropout": a.get("attention_dropout") != 0.0}


def deepspeed_knobs(model, a: dict, ds: dict) -> dict:
    """Megatron-DeepSpeed arguments (microsoft/Megatron-DeepSpeed megatron/arguments.py) + ds_config.json."""
    rc = "full" if a.get("checkpoint_activations") else a.get("recompute_granularity", "none")
    ep = a.get("moe_expert_parallel_size", 1)
    assert ds["zero_optimization"]["stage"] == a["zero_stage"]
    assert ds["train_micro_batch_size_per_gpu"] == a["micro_batch_size"]
    return {"tp": a["tensor_model_parallel_size"], "pp": a["pipeline_model_parallel_size"],
            "cp": a.get("ds_sequence_parallel_size", 1), "dp": None, "ep": ep, "etp": 1 if ep > 1 else None,
            "vpp": 1, "mbs": a["micro_batch_size"], "gbs": a["global_batch_size"], "zero": a["zero_stage"],
            "sp": bool(a.get("sequence_parallel")), "recompute": rc, "recompute_num_layers": None,
            "recompute_method": None, "schedule": "1f1b",
            "precision": "fp8" if a.get("fp8_hybrid") else "fp16" if a.get("fp16") else "bf16",
            "flash": bool(a.get("use_flash_attn_v2")), "dropout": a.get("attention_dropout") != 0.0}


TT_SCHEDULES = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved", "GPipe": "gpipe", "ZBVZeroBubble": "zb-v",
                "DualPipeV": "dualpipev"}


def torchtitan_knobs(model, t: dict) -> dict:
    """torchtitan 0.2.2 JobConfig (torchtitan/config/job_config.py; stages = ceil((L + first_less + last_less) /
    layers_per_stage), pipeline_llm)."""
    p, tr = t["parallelism"], t["training"]
    pp = p["pipeline_parallel_degree"]
    vpp = 1
    if pp > 1:
        slots = model.num_layers + p["pipeline_parallel_first_stage_less_layers"] + p[
            "pipeline_parallel_last_stage_less_layers"]
        vpp = -(-slots // p["pipeline_parallel_layers_per_stage"]) // pp
    sharded = p["data_parallel_shard_degree"] > 1 or p["fsdp_reshard_after_forward"] == "always"
    ep = p.get("expert_parallel_degree", 1)
    return {"tp": p["tensor_parallel_degree"], "pp": pp, "cp": p["context_parallel_degree"],
            "dp": p["data_parallel_shard_degree"] * p["data_parallel_replicate_degree"], "ep": ep,
            "etp": p.get("expert_tensor_parallel_degree") if ep > 1 else None, "vpp": vpp,
            "mbs": p["pipeline_parallel_microbatch_size"] if pp > 1 else tr["local_batch_size"],
            "gbs": tr["global_batch_size"], "zero": 3 if sharded else 0, "sp": p["tensor_parallel_degree"] > 1,
            "recompute": t["activation_checkpoint"]["mode"], "recompute_num_layers": None, "recompute_method": None,
            "schedule": TT_SCHEDULES[p["pipeline_parallel_schedule"]] if pp > 1 else "1f1b",
            "precision": {"bfloat16": "bf16", "float16": "fp16"}[tr["mixed_precision_param"]], "flash": True,
            "dropout": False}


def emit(framework: str, model, job: TrainingJob, par: ParallelConfig) -> dict:
    """The framework's launch fields of ``launch_fields`` alone (raises ``EmitError`` when it refuses)."""
    if framework == "megatron":
        return {"megatron": megatron_args(model, job, par)}
    if framework == "deepspeed":
        return {"deepspeed": deepspeed_config(job, par, model),
                "megatron_deepspeed": megatron_deepspeed_args(model, job, par)}
    return {"torchtitan_toml": torchtitan_toml(model, job, par)}


def read_back(framework: str, model, lf: dict) -> dict:
    if framework == "megatron":
        return megatron_knobs(model, parse_argv(lf["megatron"]))
    if framework == "deepspeed":
        return deepspeed_knobs(model, parse_argv(lf["megatron_deepspeed"]), lf["deepspeed"])
    return torchtitan_knobs(model, tomllib.loads(lf["torchtitan_toml"]))


def assert_expressed(framework: str, model, job: TrainingJob, par: ParallelConfig, lf: dict) -> None:
    got, want = read_back(framework, model, lf), plan_knobs(model, job, par)
    # None: a knob the config leaves to the launch (Megatron derives dp from the world size)
    diff = {k: (want[k], got[k]) for k in want if got[k] is not None and got[k] != want[k]}
    assert not diff, f"{framework} does not run the evaluated {par!r}: {diff}"


#: jobs whose whole search space is emitted, per framework (models each framework's launch can express)
SPACES = {
    "megatron": [("llama3.1-8b", 16, 64), ("mixtral-8x7b", 16, 64)],
    "deepspeed": [("llama2-70b", 32, 64), ("mixtral-8x7b", 16, 64)],
    "torchtitan": [("llama3.1-8b", 16, 64), ("llama3.1-70b", 32, 64)],
}
#: larger spaces (MLA + MTP, GPT-3 with full recompute depths, two-node EP), CI only
SLOW_SPACES = {"megatron": [("gpt3-175b", 64, 256), ("mixtral-8x7b", 32, 64), ("deepseek-v3", 64, 128)],
               "deepspeed": [("gpt3-175b", 64, 256)], "torchtitan": [("deepseek-v3", 64, 128)]}


@pytest.mark.parametrize("framework", sorted(SPACES))
def test_every_searched_configuration_is_expressed(framework):
    _every_searched(framework, SPACES[framework])


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(SLOW_SPACES))
def test_every_searched_configuration_is_expressed_large_spaces(framework):
    _every_searched(framework, SLOW_SPACES[framework])


def _every_searched(framework: str, jobs) -> None:
    n = 0
    for name, gpus, gbs in jobs:
        m = get_model(name)
        job = TrainingJob(global_batch_size=gbs, seq_length=4096, framework=framework)
        for par in candidates(m, H100, job, gpus, SearchSpace(micro_batch_size=(1, 2)), framework):
            par = with_fewest_recomputed_layers(m, H100, job, par, framework)  # what the search evaluates
            assert_expressed(framework, m, job, par, emit(framework, m, job, par))  # EmitError: refused
            n += 1
    assert n > 50


#: knob values outside the searches (evaluate, recipes, job settings): each framework expresses or refuses them
OFF_SPACE = [
    ("pipeline_schedule", {"schedule": "gpipe"}, {}), ("pipeline_schedule", {"schedule": "zb-h1"}, {}),
    ("pipeline_schedule", {"schedule": "dualpipe"}, {}),
    ("pipeline_schedule", {"schedule": "zb-v", "vpp": 2}, {}),
    ("pipeline_schedule", {"schedule": "dualpipev", "vpp": 2}, {}),
    ("vpp", {"vpp": 2}, {}), ("first/last stage layers", {"first_stage_layers": 6, "last_stage_layers": 6}, {}),
    ("etp", {"etp": 2}, {}), ("recompute_num_layers", {"recompute": "full", "recompute_num_layers": 2}, {}),
    ("recompute_modules", {"recompute": "selective", "recompute_modules": ("mlp",)}, {}),
    ("grad_reduce_in_bf16", {"grad_reduce_in_bf16": True}, {}), ("fp8_param_gather", {"fp8_param_gather": True}, {}),
    ("exp_avg_dtype", {"exp_avg_dtype": "bf16"}, {}),
    ("optimizer_cpu_offload_fraction", {"optimizer_cpu_offload_fraction": 0.5}, {}),
    ("zero_stage", {"zero_stage": 1}, {}), ("zero_stage", {"zero_stage": 2}, {}),
    ("precision fp8", {}, {"precision": "fp8"}), ("unfused attention", {}, {"flash_attention": False}),
    ("dropout", {}, {"dropout": True}), ("cross_entropy_fusion_impl", {}, {"cross_entropy_fusion_impl": "te"}),
    ("sequence_parallel", {"sequence_parallel": False, "ep": 1}, {}),
    ("recompute_method", {"recompute": "full", "recompute_num_layers": 2, "recompute_method": "uniform"}, {}),
    ("main_params_dtype", {"main_params_dtype": "fp16"}, {}), ("param_cpu_offload", {"param_cpu_offload": True}, {}),
]


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan"])
@pytest.mark.parametrize("knob,par_kw,job_kw", OFF_SPACE, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(OFF_SPACE)])
def test_off_space_knobs_are_expressed_or_refused_by_name(framework, knob, par_kw, job_kw):
    # Mixtral 8x7B (32 layers, MoE: ep and etp apply), 4 pipeline stages of 8 layers, tp 2, ep 4
    m = get_model("mixtral-8x7b")
    job = TrainingJob(global_batch_size=64, seq_length=4096, **job_kw)
    # a base every framework runs (torchtitan's FSDP2 is ZeRO-3, DeepSpeed's pipeline ZeRO <= 1)
    base = {"tp": 2, "pp": 4, "dp": 4, "ep": 4, "etp": 1, "sequence_parallel": True,
            "zero_stage": 3 if framework == "torchtitan" else 1}
    if knob == "etp":
        base["ep"] = 2
    par = ParallelConfig(**{**base, **par_kw})
    lf = launch_fields(m, job, par, 8, H100)
    if framework in lf["unsupported"]:
        why = lf["unsupported"][framework]
        names = {knob, knob.split()[0], *par_kw, *job_kw, *(f"{k} {v}" for k, v in {**par_kw, **job_kw}.items())}
        assert any(n in why for n in names) or "pipeline schedule" in why, (knob, why)
    else:
        assert_expressed(framework, m, job, par, lf)


def test_the_launches_run_the_cross_entropy_the_step_time_charged():
    """``elementwise.cross_entropy_impl`` decides what the step time charges; the launches must run that loss:
    Megatron-LM's fused loss (``--cross-entropy-loss-fusion``) or Transformer Engine's; torchtitan compiles its
    loss; Megatron-DeepSpeed has no fused loss to ask for."""
    from planner.emit.megatron import EmitError
    from planner.emit.torchtitan import torchtitan_settings

    m = get_model("llama3.1-8b")
    par = ParallelConfig(dp=8, micro_batch_size=1, zero_stage=1)

    def job(**kw):
        return TrainingJob(global_batch_size=64, seq_length=4096, **kw)

    assert "--cross-entropy-loss-fusion" not in megatron_args(m, job(), par)  # Megatron-LM's default: unfused
    fused = megatron_args(m, job(cross_entropy_loss_fusion=True), par)
    assert "--cross-entropy-loss-fusion" in fused and "--cross-entropy-fusion-impl" not in fused
    te = megatron_args(m, job(cross_entropy_fusion_impl="te"), par)
    assert te[te.index("--cross-entropy-fusion-impl") + 1] == "te" and "--cross-entropy-loss-fusion" in te
    # TE's loss needs the fusion on in Megatron-LM: with it off the run (and the step time) is unfused
    assert "--cross-entropy-loss-fusion" not in megatron_args(
        m, job(cross_entropy_fusion_impl="te", cross_entropy_loss_fusion=False), par)
    fsdp = ParallelConfig(dp=8, micro_batch_size=1, zero_stage=3)
    assert torchtitan_settings(m, job(cross_entropy_loss_fusion=True), fsdp)["compile"]["components"][-1] == "loss"
    with pytest.raises(EmitError, match="cross_entropy_loss_fusion false"):
        torchtitan_settings(m, job(cross_entropy_loss_fusion=False), fsdp)
    with pytest.raises(EmitError, match="cross_entropy_loss_fusion"):
        megatron_deepspeed_args(m, job(cross_entropy_loss_fusion=True), par)
