"""The frameworks' own validators accept plan3d's emitted configs (``validators`` extra: torch CPU, deepspeed
0.19.8, megatron-core 0.16.1; torchtitan 0.2.2 where installed). Skipped with the reason when absent.

* Megatron: megatron-core's ``TransformerConfig``/``MLATransformerConfig`` and ``DistributedDataParallelConfig``
  built from the emitted arguments the way Megatron-LM does, ``get_num_layers_to_build`` for every pipeline rank
  and virtual stage (= the plan's layers per stage), ``ConstantNumMicroBatchesCalculator`` (= the plan's
  micro-batch count), plus the parallelism rules of Megatron-LM's ``validate_args`` (not in the wheel).
* DeepSpeed: ``DeepSpeedConfig(ds_config, mpu)`` with the planned data-parallel size.
* torchtitan: ``ConfigManager`` parses the TOML; ``ParallelDims`` accepts the degrees for the world size.
"""
from __future__ import annotations

import importlib.util
import warnings

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import stage_layer_counts
from model_zoo import get_model, list_models
from planner.emit import launch_fields
from planner.emit.env import launch_env
from test_emit import BRANCH_CASES, _case_id, _job
from test_emit_support import (deepspeed_validate, megatron_core_config, megatron_ddp_config, megatron_layers_per_rank,
                               megatron_num_microbatches, megatron_rank_groups, megatron_validate_args, parse_argv,
                               torchtitan_parse_toml)

REASON = ("validators extra not installed: pip install torch==2.13.0 && DS_BUILD_OPS=0 pip install -e "
          "'.[test,validators]'")
TT_REASON = ("torchtitan not installed (2.4 GB with triton, kept out of CI): pip install torchtitan==0.2.2 triton "
             "(TOML) or torchtitan==0.3.0 triton torchao (command-line overrides) after torch==2.13.0")
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MCORE = HAS_TORCH and importlib.util.find_spec("megatron") is not None \
    and importlib.util.find_spec("megatron.core") is not None
HAS_DS = HAS_TORCH and importlib.util.find_spec("deepspeed") is not None
HAS_TT = HAS_TORCH and importlib.util.find_spec("torchtitan") is not None

needs_mcore = pytest.mark.skipif(not HAS_MCORE, reason=REASON)
needs_ds = pytest.mark.skipif(not HAS_DS, reason=REASON)
needs_tt = pytest.mark.skipif(not HAS_TT, reason=TT_REASON)

JOB = TrainingJob(global_batch_size=1024, seq_length=4096)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def check_megatron(model, job: TrainingJob, par: ParallelConfig, args: list[str],
                   env: dict[str, str] | None = None) -> None:
    """Every Megatron check of the module docstring (raises the framework's error on rejection), with the launch
    environment ``env`` (default: the plan's ``launch.env["megatron"]``, planner/emit/env.py)."""
    a = parse_argv(args)
    vpp = megatron_validate_args(a, par.world_size, launch_env("megatron", par) if env is None else env)
    assert (vpp or 1) == par.vpp
    cfg = megatron_core_config(a, vpp)  # TransformerConfig.__post_init__ (and ModelParallelConfig's)
    layers = megatron_layers_per_rank(cfg)
    assert [sum(x) for x in layers] == stage_layer_counts(model.num_layers, par)
    assert megatron_num_microbatches(job.global_batch_size, par.micro_batch_size, par.dp) == \
        par.num_microbatches(job.global_batch_size)
    ddp = megatron_ddp_config(a)
    assert ddp.use_distributed_optimizer == (par.zero_stage >= 1)
    assert bool(ddp.use_megatron_fsdp) == (par.zero_stage >= 2)


def check_deepspeed(job: TrainingJob, par: ParallelConfig, cfg: dict) -> None:
    ds = deepspeed_validate(cfg, par.dp)
    assert ds.train_batch_size == job.global_batch_size
    assert ds.train_micro_batch_size_per_gpu == par.micro_batch_size
    assert ds.gradient_accumulation_steps == par.num_microbatches(job.global_batch_size)
    assert ds.zero_optimization_stage == par.zero_stage
    assert not (par.pp > 1 and ds.zero_optimization_stage >= 2)  # DeepSpeed's pipeline engine: ZeRO <= 1


def torchtitan_version() -> tuple[int, ...]:
    from importlib.metadata import version
    return tuple(int(x) for x in version("torchtitan").split(".")[:2])


def check_torchtitan(par: ParallelConfig, lf: dict, tmp_path, model_layers: int) -> None:
    """0.2.x: the TOML through ConfigManager, ParallelDims, and torchtitan's own layer split per rank.
    0.3.x (no TOML): the command-line overrides through ConfigManager."""
    if torchtitan_version() >= (0, 3):
        from torchtitan.config import ConfigManager

        from planner.emit.torchtitan import TORCHTITAN_REGISTRY
        over = lf["torchtitan_overrides"]
        if over is None:  # llama3_405b's registry config trains Float8 linears, which the plan did not cost
            assert "torchtitan 0.3's config trains" in lf["unsupported"]["torchtitan_overrides"]
            return
        if over[1] not in {module for module, _ in TORCHTITAN_REGISTRY.values()}:
            # no registered config: the launch names the model itself, so torchtitan refuses to start
            with pytest.raises(ImportError, match="Cannot import module"):
                ConfigManager().parse_args(over)
            return
        cfg = ConfigManager().parse_args(over)
        assert cfg.compile.enable and not cfg.compile.enable_async_tensor_parallel  # compiled, as costed
        p = cfg.parallelism
        assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == \
            (par.tp, par.pp, par.cp)
        assert p.data_parallel_shard_degree * p.data_parallel_replicate_degree == par.dp
        assert cfg.training.global_batch_size == JOB.global_batch_size
        return
    from torchtitan.distributed.parallel_dims import ParallelDims
    jc = torchtitan_parse_toml(lf["torchtitan_toml"], tmp_path)
    p = jc.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == \
        (par.tp, par.pp, par.cp)
    assert p.data_parallel_shard_degree * p.data_parallel_replicate_degree == par.dp
    ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                 cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                 ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=par.world_size)
    assert jc.training.global_batch_size == JOB.global_batch_size
    assert jc.compile.enable and jc.compile.components == ["model", "loss"]  # what the calibration rows ran
    if par.pp > 1:
        assert torchtitan_layers_per_rank(jc, model_layers) == stage_layer_counts(model_layers, par)


def torchtitan_layers_per_rank(jc, num_layers: int) -> list[int]:
    """Transformer layers per pipeline rank as torchtitan 0.2.2 builds them: ``pipeline_llm``'s stage count
    (ceil((layers + first_less + last_less) / layers_per_stage), torchtitan/distributed/pipeline_parallel.py),
    its own ``generate_llm_fqn_per_model_part``, and the loop placement of stage s on rank s % pp."""
    import math

    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    p = jc.parallelism
    fl, ll = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
    stages = math.ceil((num_layers + fl + ll) / p.pipeline_parallel_layers_per_stage)
    assert stages % p.pipeline_parallel_degree == 0
    parts = generate_llm_fqn_per_model_part(stages, num_layers, fl, ll)
    per_rank = [0] * p.pipeline_parallel_degree
    for s, names in enumerate(parts):
        per_rank[s % p.pipeline_parallel_degree] += sum(n.startswith("layers.") for n in names)
    return per_rank


# ------------------------------------------------------------------------------------ constructed plans
@needs_mcore
@pytest.mark.parametrize("case", BRANCH_CASES, ids=_case_id)
def test_megatron_core_accepts_every_branch(case):
    name, par, prec = case
    m = get_model(name)
    check_megatron(m, _job(prec), par, launch_fields(m, _job(prec), par, 8)["megatron"])


@needs_ds
@pytest.mark.parametrize("case", BRANCH_CASES, ids=_case_id)
def test_deepspeed_accepts_every_branch(case):
    name, par, prec = case
    m = get_model(name)
    lf = launch_fields(m, _job(prec), par, 8)
    if "deepspeed" in lf["unsupported"]:  # pp > 1 with ZeRO >= 2, HSDP, Megatron layouts: refused by the emitter
        pytest.skip(lf["unsupported"]["deepspeed"])
    check_deepspeed(_job(prec), par, lf["deepspeed"])


@needs_mcore
def test_megatron_rank_layout_matches_plan3d():
    # Megatron's RankGenerator (order tp-cp-ep-dp-pp), the order cost_models.layout assumes: tp innermost,
    # so a tp 8 group is one 8-GPU node; pp outermost (stride tp*cp*dp = 32 for tp 8, dp 4)
    g = megatron_rank_groups(tp=8, pp=4, dp=4, cp=1, ep=1)
    assert g["tp"][0] == list(range(8)) and g["dp"][0] == [0, 8, 16, 24] and g["pp"][0] == [0, 32, 64, 96]


@needs_mcore
def test_validators_catch_broken_megatron_configs():
    m = get_model("llama2-70b")
    good = parse_argv(launch_fields(m, JOB, ParallelConfig(tp=8, pp=4, dp=4, zero_stage=1), 8)["megatron"])
    with pytest.raises(ValueError, match="num_attention_heads .* must be a multiple of tensor_model_parallel_size"):
        megatron_core_config({**good, "tensor_model_parallel_size": 6}, None)
    with pytest.raises(ValueError, match="sequence parallelism without tensor parallelism"):
        megatron_core_config({**good, "tensor_model_parallel_size": 1, "sequence_parallel": True}, None)
    with pytest.raises(AssertionError, match="divisible by pipeline_model_parallel_size"):
        megatron_layers_per_rank(megatron_core_config({**good, "pipeline_model_parallel_size": 3}, None))
    with pytest.raises(AssertionError, match="should be divisible by vp_size"):
        megatron_layers_per_rank(megatron_core_config(good, 3))  # 20 layers per rank, vpp 3
    with pytest.raises(Exception, match="not divisible by micro batch size"):
        megatron_num_microbatches(1000, 3, 4)
    with pytest.raises(ValueError, match="Delayed scaling does not support moe_act and layernorm recompute"):
        megatron_core_config({**good, "fp8_format": "hybrid", "fp8_recipe": "delayed",
                              "recompute_granularity": "selective", "recompute_modules": ["layernorm"]}, None)
    with pytest.raises(AssertionError, match="num-virtual-stages-per-pipeline-rank"):
        megatron_validate_args({**good, "num_layers_per_virtual_pipeline_stage": 2,
                                "decoder_first_pipeline_num_layers": 18, "decoder_last_pipeline_num_layers": 18},
                               128, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})


@needs_mcore
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
@pytest.mark.parametrize("modules", [("layernorm",), ("core_attn",), ("core_attn", "layernorm")])
def test_fp8_recipe_recompute_rule_is_megatron_cores(recipe, modules, monkeypatch):
    # plan3d's fp8_delayed_recompute constraint fires exactly where megatron-core's TransformerConfig refuses the
    # emitted --fp8-recipe with the emitted --recompute-modules. Its other condition for layernorm recompute under
    # FP8, Transformer Engine >= 2.6, is taken as met (the validators extra installs no TE)
    import megatron.core.transformer.transformer_config as tc
    from planner.checks import constraint_report
    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    m = get_model("llama2-70b")
    job = TrainingJob(global_batch_size=1024, seq_length=4096, precision="fp8", fp8_recipe=recipe)
    par = ParallelConfig(tp=8, pp=4, dp=4, zero_stage=1, recompute="selective", recompute_modules=modules)
    flagged = any(c.name == "fp8_delayed_recompute" and not c.ok
                  for c in constraint_report(m, get_cluster("dgx-h100"), job, par, 128))
    args = parse_argv(launch_fields(m, job, par, 8)["megatron"])
    assert args["fp8_recipe"] == recipe
    try:
        megatron_core_config(args, None)
        refused = False
    except ValueError as e:
        assert "Delayed scaling does not support moe_act and layernorm recompute" in str(e)
        refused = True
    assert flagged == refused == (recipe == "delayed" and "layernorm" in modules)


@needs_ds
def test_validators_catch_broken_deepspeed_configs():
    par = ParallelConfig(tp=8, pp=1, dp=16, micro_batch_size=2, zero_stage=2)
    cfg = launch_fields(get_model("llama2-70b"), JOB, par, 8)["deepspeed"]
    check_deepspeed(JOB, par, cfg)
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        deepspeed_validate(cfg, 8)  # the wrong data-parallel size breaks micro x GAS x dp
    bad = {**cfg, "zero_optimization": {**cfg["zero_optimization"], "reduce_bucket_sise": 1}}
    with pytest.raises(Exception, match="reduce_bucket_sise"):
        deepspeed_validate(bad, 16)


# ------------------------------------------------------------------------------------ every candidate
@needs_mcore
@pytest.mark.parametrize("model,gpus", [("llama3.1-405b", 1024), ("mixtral-8x22b", 256), ("deepseek-v3", 1024),
                                        ("gpt3-175b", 512)])
def test_every_megatron_candidate_is_accepted(model, gpus):
    """Not just the top plan: every configuration class the search space can produce passes megatron-core.

    A class is a candidate with its micro-batch size left out, checked at its largest micro-batch. The micro-batch
    enters Megatron's checks only through ``global_batch_size % (micro_batch_size x dp) == 0``, which the space
    holds for every micro-batch it lists, so one stands for the rest (the enlarged space lists every divisor:
    DeepSeek-V3 on 1,024 GPUs has 915,888 candidates in 117,348 classes; checking each candidate took 280 s of the
    suite's 10-minute budget)."""
    from planner.emit import megatron_args
    from planner.space import candidates
    m, c = get_model(model), get_cluster("dgx-h100")
    largest: dict[str, object] = {}
    for par in candidates(m, c, JOB, gpus):
        key = par.model_copy(update={"micro_batch_size": 1}).model_dump_json()
        if key not in largest or par.micro_batch_size > largest[key].micro_batch_size:
            largest[key] = par
    for par in largest.values():
        check_megatron(m, JOB, par, megatron_args(m, JOB, par))
    assert len(largest) > 50


# ------------------------------------------------------------------------------------ top plans (Done means)
def cluster_sizes(model) -> tuple[int, int, int]:
    """Three cluster sizes per model: the smallest power-of-two GPU count (>= one 8-GPU node) holding 18 bytes per
    parameter (bf16 weights and grads, fp32 master and Adam moments, formulas.md Sec. 4) in half of an 80 GB
    H100, then 4x and 16x that."""
    n = 8
    while 18 * model.num_parameters() / n > 0.5 * 80e9:
        n *= 2
    return n, 4 * n, 16 * n


MATRIX = [(name, i, fw) for name in list_models() for i in range(3) for fw in ("megatron", "deepspeed", "torchtitan")]
AVAILABLE = {"megatron": (HAS_MCORE, REASON), "deepspeed": (HAS_DS, REASON), "torchtitan": (HAS_TT, TT_REASON)}


@pytest.mark.slow
@pytest.mark.parametrize("name,size,framework", MATRIX, ids=[f"{n}-{i}-{f}" for n, i, f in MATRIX])
def test_top_plan_configs_pass_the_frameworks_validators(name, size, framework, tmp_path):
    """Done-means of the launch-config issue: the top plan (``--framework F``, the CLI's default search) of
    every built-in model on three cluster sizes passes that framework's own validators."""
    ok, why = AVAILABLE[framework]
    if not ok:
        pytest.skip(why)
    from planner.emit.megatron import EmitError, model_args, unexpressed_features
    from planner.search import run_search
    m, c = get_model(name), get_cluster("dgx-h100")
    try:  # a model the launch cannot express at all (any layout) is refused by the emitter, with the setting named
        model_args(m, JOB) if framework == "megatron" else None
        feature = unexpressed_features(m) if framework == "torchtitan" else None
    except EmitError as e:
        feature = str(e)
    if feature is not None:
        pytest.skip(f"{framework} launch cannot express the model: {feature}")
    n = cluster_sizes(m)[size]
    res = run_search(m, c, JOB, n, top_k=1, framework=framework)
    assert res.plans, f"no plan for {name} on {n} GPUs ({framework})"
    par = res.plans[0].parallel
    lf = launch_fields(m, JOB, par, c.node.gpus_per_node)
    if framework == "deepspeed" and "megatron_deepspeed" in lf["unsupported"]:
        # the Megatron-DeepSpeed launch cannot express this model; ds_config.json alone then passes DeepSpeed only
        # when it carries every knob (planner.emit.deepspeed.check_ds_config_alone)
        if lf["deepspeed"] is not None:
            check_deepspeed(JOB, par, lf["deepspeed"])
        pytest.xfail(f"planner's deepspeed space allows it: {lf['unsupported']['megatron_deepspeed']}")
    assert framework not in lf["unsupported"], lf["unsupported"]
    if framework == "megatron":
        check_megatron(m, JOB, par, lf["megatron"])
    elif framework == "deepspeed":
        check_deepspeed(JOB, par, lf["deepspeed"])
    else:
        check_torchtitan(par, lf, tmp_path, m.num_layers)


@needs_tt
@pytest.mark.parametrize("case", BRANCH_CASES, ids=_case_id)
def test_torchtitan_parses_every_branch(case, tmp_path):
    name, par, prec = case
    m = get_model(name)
    lf = launch_fields(m, _job(prec), par, 8)
    if "torchtitan" in lf["unsupported"]:
        pytest.skip(lf["unsupported"]["torchtitan"])
    check_torchtitan(par, lf, tmp_path, m.num_layers)
