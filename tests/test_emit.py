"""Launch-config emitters without the frameworks installed: argument names against Megatron-LM's parser list,
values from the frameworks' documented rules and published layouts, files and scripts from the CLI.

The frameworks' own validators run in tests/test_emit_validators.py (``validators`` extra)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model
from planner.emit import EmitError, deepspeed_config, launch_fields, megatron_args, torchtitan_toml
from planner.emit.megatron import launch_script
from test_emit_support import megatron_arg_names, parse_argv

JOB = TrainingJob(global_batch_size=1024, seq_length=4096)

#: Plans that reach every branch of the emitters: (model, parallel config, precision).
BRANCH_CASES = [
    # Llama 3 405B layout (Llama 3 paper Sec. 3.3.2: 126 layers on 16 stages as 7 + 14 x 8 + 7), TP 8, ZeRO-1
    ("llama3.1-405b", ParallelConfig(tp=8, pp=16, dp=8, first_stage_layers=7, last_stage_layers=7,
                                     sequence_parallel=True, zero_stage=1, recompute="full"), "bf16"),
    # even split with interleaving: 80 layers, pp 4, vpp 5 -> 4 layers per virtual stage; FP8 weights gathered
    ("llama2-70b", ParallelConfig(tp=4, pp=4, dp=8, vpp=5, sequence_parallel=True, zero_stage=1,
                                  recompute="selective", fp8_param_gather=True), "fp8"),
    # MLA + MoE (dense prefix, shared expert, router bias, MTP), CP, EP, ZeRO-3 (Megatron-FSDP)
    ("deepseek-v3", ParallelConfig(tp=2, pp=1, dp=512, cp=2, ep=256, etp=1, sequence_parallel=True,
                                   zero_stage=3), "bf16"),
    # MoE with pp, vpp, ZeRO-2 (Megatron-FSDP optim_grads), fp16
    ("mixtral-8x7b", ParallelConfig(tp=2, pp=4, dp=16, ep=8, etp=1, vpp=8, sequence_parallel=True,
                                    zero_stage=2), "fp16"),
    # even split with interleaving: 96 layers / pp 16 = 6 per stage, vpp 3; full recompute of 2 layers (block)
    ("gpt3-175b", ParallelConfig(tp=8, pp=16, dp=4, vpp=3, sequence_parallel=True, zero_stage=0,
                                 recompute="full", recompute_num_layers=2), "bf16"),
    # GPT-3: learned positions, biases, tied embeddings; plain DP, no sharding
    ("gpt3-175b", ParallelConfig(tp=8, pp=8, dp=2, first_stage_layers=None, zero_stage=0), "bf16"),
    ("qwen2.5-7b", ParallelConfig(tp=4, pp=1, dp=2, zero_stage=1, sequence_parallel=True), "bf16"),
    # Megatron-Bridge-style layout string (DeepSeek-V3 on pp 8 x vpp 2, MTP and loss in the last chunk), recipe
    # knobs: recompute modules, precision-aware optimizer, optimizer CPU offload (bf16: megatron-core checks MoE
    # + FP8 only with Transformer Engine installed)
    ("deepseek-v3", ParallelConfig(tp=2, pp=8, dp=8, ep=8, etp=1, vpp=2, sequence_parallel=True, zero_stage=1,
                                   pipeline_layout="Etttt|" + "tttt|" * 14 + "tmL", recompute="selective",
                                   recompute_modules=("core_attn", "mla_up_proj"), exp_avg_dtype="bf16",
                                   exp_avg_sq_dtype="bf16", optimizer_cpu_offload_fraction=0.5), "bf16"),
    # embedding and loss counted as layers: (80 + 2) / pp 2 = 41 per rank
    ("llama2-70b", ParallelConfig(tp=8, pp=2, dp=4, zero_stage=1, sequence_parallel=True,
                                  account_for_embedding_in_pipeline_split=True,
                                  account_for_loss_in_pipeline_split=True), "bf16"),
    # HSDP (shard within 8 ranks, 8 replicas) and bf16 gradient reduction
    ("llama3.1-8b", ParallelConfig(tp=1, pp=1, dp=64, zero_stage=3, hsdp_shard_size=8, grad_reduce_in_bf16=True),
     "bf16"),
    # Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm --delay-wgrad-compute): EP > 1, VPP with PP > 1
    ("mixtral-8x7b", ParallelConfig(tp=2, pp=4, dp=16, ep=8, etp=1, vpp=2, sequence_parallel=True, zero_stage=1,
                                    schedule="combined-1f1b"), "bf16"),
]


def _zero3(par: ParallelConfig) -> ParallelConfig:
    """``par`` with ZeRO-3 (the stage torchtitan's FSDP2 runs with other dimensions)."""
    return par.model_copy(update={"zero_stage": 3})


def _job(precision: str) -> TrainingJob:
    return TrainingJob(global_batch_size=1024, seq_length=4096, precision=precision)


def _case_id(c) -> str:
    return f"{c[0]}-{c[2]}"


@pytest.mark.parametrize("case", BRANCH_CASES, ids=_case_id)
def test_every_megatron_argument_exists_in_megatron_lm_parser(case):
    name, par, prec = case
    header, names = megatron_arg_names()
    assert "NVIDIA/Megatron-LM commit d98e8a64ddf3" in header  # where the list was read from
    args = megatron_args(get_model(name), _job(prec), par)
    flags = [a for a in args if a.startswith("--")]
    assert [f for f in flags if f not in names] == []
    assert len(flags) == len(set(flags)), "a flag is given twice"


def test_script_arguments_exist_in_megatron_lm_parser():
    from planner.emit.megatron import SCRIPT_DATA_ARGS, SCRIPT_TRAIN_ARGS
    _, names = megatron_arg_names()
    flags = [a for a in SCRIPT_DATA_ARGS + SCRIPT_TRAIN_ARGS if a.startswith("--")]
    assert flags and [f for f in flags if f not in names] == []


def test_llama3_405b_pipeline_layout_flags():
    # Llama 3 paper Sec. 3.3.2: first and last stage hold one layer fewer (7 + 14 x 8 + 7 = 126)
    a = parse_argv(megatron_args(get_model("llama3.1-405b"), JOB, BRANCH_CASES[0][1]))
    assert (a["decoder_first_pipeline_num_layers"], a["decoder_last_pipeline_num_layers"]) == (7, 7)
    assert a["num_layers"] == 126 and a["pipeline_model_parallel_size"] == 16
    assert a["tensor_model_parallel_size"] == 8 and a["sequence_parallel"] is True
    assert a["num_query_groups"] == 8 and a["group_query_attention"] is True
    # full recompute: Megatron needs a method and a layer count ("uniform", 1 = every layer)
    assert (a["recompute_granularity"], a["recompute_method"], a["recompute_num_layers"]) == ("full", "uniform", 1)
    assert a["use_distributed_optimizer"] and a["overlap_grad_reduce"] and a["overlap_param_gather"]


def test_virtual_pipeline_flag_follows_megatron_rules():
    # even split: --num-layers-per-virtual-pipeline-stage; Megatron derives vpp = (80 / 4) / 4 = 5
    a = parse_argv(megatron_args(get_model("llama2-70b"), _job("fp8"), BRANCH_CASES[1][1]))
    assert a["num_layers_per_virtual_pipeline_stage"] == 4
    assert "num_virtual_stages_per_pipeline_rank" not in a
    # uneven split: validate_args refuses the per-stage form, so the per-rank count is used
    par = ParallelConfig(tp=8, pp=16, dp=8, vpp=7, first_stage_layers=7, last_stage_layers=7, zero_stage=1)
    a = parse_argv(megatron_args(get_model("llama3.1-405b"), JOB, par))
    assert a["num_virtual_stages_per_pipeline_rank"] == 7 and "num_layers_per_virtual_pipeline_stage" not in a


def test_moe_and_mla_arguments_deepseek_v3():
    a = parse_argv(megatron_args(get_model("deepseek-v3"), JOB, BRANCH_CASES[2][1]))
    # DeepSeek-V3 config.json: 256 routed experts, top-8, expert FFN 2048, 1 shared expert, first 3 layers dense,
    # q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, dense FFN 18432, sigmoid router + bias
    assert (a["num_experts"], a["moe_router_topk"], a["moe_ffn_hidden_size"]) == (256, 8, 2048)
    assert a["moe_shared_expert_intermediate_size"] == 2048 and a["ffn_hidden_size"] == 18432
    assert a["moe_layer_freq"] == "([0]*3+[1]*58)"
    assert (a["q_lora_rank"], a["kv_lora_rank"], a["qk_head_dim"], a["qk_pos_emb_head_dim"], a["v_head_dim"]) == \
        (1536, 512, 128, 64, 128)
    assert a["moe_router_score_function"] == "sigmoid" and a["moe_router_enable_expert_bias"] is True
    assert (a["expert_model_parallel_size"], a["expert_tensor_parallel_size"], a["context_parallel_size"]) == (256, 1, 2)
    # ZeRO-3 = Megatron-FSDP, which validate_args requires with the fsdp_dtensor checkpoint format
    # (flags of the Megatron-FSDP user guide)
    assert (a["use_megatron_fsdp"], a["data_parallel_sharding_strategy"], a["ckpt_format"]) == \
        (True, "optim_grads_params", "fsdp_dtensor")
    assert a["use_distributed_optimizer"] is True and a["no_gradient_accumulation_fusion"] is True


def test_fp8_and_fp16_flags():
    a = parse_argv(megatron_args(get_model("llama2-70b"), _job("fp8"), BRANCH_CASES[1][1]))
    assert a["fp8_format"] == "hybrid" and a["bf16"] is True and "fp16" not in a
    a = parse_argv(megatron_args(get_model("mixtral-8x7b"), _job("fp16"), BRANCH_CASES[3][1]))
    assert a["fp16"] is True and "bf16" not in a and a["data_parallel_sharding_strategy"] == "optim_grads"


def test_no_overlap_param_gather_without_sharded_optimizer():
    a = parse_argv(megatron_args(get_model("gpt3-175b"), JOB, BRANCH_CASES[5][1]))
    assert a["overlap_grad_reduce"] is True and "overlap_param_gather" not in a
    assert "disable_bias_linear" not in a and "untie_embeddings_and_output_weights" not in a  # GPT-3: biases, tied
    assert "position_embedding_type" not in a  # Megatron-LM's default, learned_absolute


def test_bloom_is_refused_by_every_launch_rather_than_trained_without_alibi():
    # BLOOM's ALiBi and embedding LayerNorm: neither megatron-core, Megatron-DeepSpeed nor torchtitan take them here;
    # "--position-embedding-type none" would train without any position signal (helper break-test, 2026-12-04)
    from planner.emit.deepspeed import megatron_deepspeed_args
    from planner.emit.megatron import EmitError
    from planner.emit.torchtitan import torchtitan_toml
    bloom = get_model("bloom-176b")
    par = ParallelConfig(tp=4, pp=14, dp=2, zero_stage=1, sequence_parallel=True)
    for emit, p in ((megatron_args, par), (megatron_deepspeed_args, par), (torchtitan_toml, _zero3(par))):
        with pytest.raises(EmitError, match="alibi"):
            emit(bloom, JOB, p)
    no_alibi = bloom.model_copy(update={"position_embedding": "none"})
    with pytest.raises(EmitError, match="embedding_layernorm"):
        megatron_args(no_alibi, JOB, par)


def test_deepspeed_batch_arithmetic():
    par = ParallelConfig(tp=4, pp=2, dp=16, micro_batch_size=2, zero_stage=1)
    cfg = deepspeed_config(JOB, par)
    # train_batch_size = micro x GAS x dp: 2 x 32 x 16 = 1024
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == \
        (1024, 2, 32)
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["bf16"] == {"enabled": True}
    assert cfg["pipeline"]["stages"] == 2


def test_deepspeed_refuses_pipeline_with_zero2():
    par = ParallelConfig(tp=2, pp=4, dp=16, ep=8, etp=1, zero_stage=2)
    with pytest.raises(EmitError, match="pipeline engine supports ZeRO stage 0 or 1"):
        deepspeed_config(JOB, par)
    lf = launch_fields(get_model("mixtral-8x7b"), JOB, par, 8)
    assert lf["deepspeed"] is None and "ZeRO stage 0 or 1" in lf["unsupported"]["deepspeed"]
    assert lf["megatron"] is not None  # Megatron runs it (Megatron-FSDP)


def test_megatron_deepspeed_args():
    # Llama 2 70B: Llama 3.1's RoPE scaling has no Megatron-DeepSpeed option (test_emit_model_settings.py)
    par = ParallelConfig(tp=8, pp=1, dp=4, cp=2, zero_stage=3, recompute="full")
    a = parse_argv(launch_fields(get_model("llama2-70b"), JOB, par, 8)["megatron_deepspeed"])
    assert a["no_pipeline_parallel"] is True  # non-pipeline engine: ZeRO-3 allowed
    assert a["ds_sequence_parallel_size"] == 2 and a["zero_stage"] == 3 and a["deepspeed_config"] == "ds_config.json"
    assert a["num_key_value_heads"] == 8


def test_torchtitan_toml_reproduces_the_plan_split():
    # torchtitan spreads num_layers + first_less + last_less over ceil(./layers_per_stage) stages:
    # (126 + 1 + 1) / 8 = 16 stages; first stage 8 - 1 = 7 layers -> the Llama 3 405B layout 7 + 14 x 8 + 7
    # (ZeRO-3: torchtitan's FSDP2 runs no ZeRO-1, planner/emit/torchtitan.py refuses it)
    t = tomllib.loads(torchtitan_toml(get_model("llama3.1-405b"), JOB, _zero3(BRANCH_CASES[0][1])))
    p = t["parallelism"]
    assert (p["pipeline_parallel_layers_per_stage"], p["pipeline_parallel_first_stage_less_layers"],
            p["pipeline_parallel_last_stage_less_layers"]) == (8, 1, 1)
    assert (126 + 1 + 1) // 8 == p["pipeline_parallel_degree"] == 16
    assert (p["tensor_parallel_degree"], p["data_parallel_shard_degree"], p["pipeline_parallel_schedule"]) == \
        (8, 8, "1F1B")
    assert t["model"] == {"name": "llama3", "flavor": "405B"}
    # pp > 1: the per-DP-rank batch is split into micro-batches of the plan's size
    assert (t["training"]["local_batch_size"], t["training"]["global_batch_size"], t["training"]["seq_len"]) == \
        (128, 1024, 4096)
    assert p["pipeline_parallel_microbatch_size"] == 1 and t["activation_checkpoint"]["mode"] == "full"


def test_torchtitan_interleaved_even_split():
    t = tomllib.loads(torchtitan_toml(get_model("llama2-70b"), JOB, _zero3(BRANCH_CASES[1][1]).model_copy(
        update={"fp8_param_gather": False})))
    p = t["parallelism"]
    # 80 layers, pp 4, vpp 5: 4 layers per virtual stage, 20 stages = 4 ranks x 5
    assert (p["pipeline_parallel_schedule"], p["pipeline_parallel_layers_per_stage"]) == ("Interleaved1F1B", 4)
    assert p["pipeline_parallel_first_stage_less_layers"] == 0 and 80 // 4 == 4 * 5


# ------------------------------------------------------------------------------------------------------- CLI
PLAN = ["plan", "-m", "llama3.1-70b", "-c", "dgx-h100", "--gpus", "64", "--top-k", "3"]


def test_emit_writes_files_and_is_byte_identical(run_cli, tmp_path):
    outs = []
    for d in ("a", "b"):
        r = run_cli(*PLAN, "--emit", "megatron", "--output", str(tmp_path / d))
        assert r.exit_code == 0, r.stderr
        outs.append({p.name: p.read_bytes() for p in sorted((tmp_path / d).iterdir())})
    assert outs[0] == outs[1]
    assert set(outs[0]) == {"megatron_args.txt", "launch_torchrun.sh", "launch_slurm.sbatch"}
    assert os.access(tmp_path / "a" / "launch_torchrun.sh", os.X_OK)
    r = run_cli(*PLAN, "--format", "json")
    launch = r.json()["plans"][0]["launch"]
    args_txt = (tmp_path / "a" / "megatron_args.txt").read_text()
    assert shlex.split(args_txt) == launch["megatron"]
    slurm = (tmp_path / "a" / "launch_slurm.sbatch").read_text()
    assert f"#SBATCH --nodes={launch['nodes']}" in slurm and "#SBATCH --gpus-per-node=8" in slurm
    assert launch["nodes"] * launch["gpus_per_node"] == launch["world_size"] == 64


@pytest.mark.parametrize("framework,files", [
    ("deepspeed", {"ds_config.json", "megatron_deepspeed_args.txt", "launch_torchrun.sh", "launch_slurm.sbatch"}),
    ("torchtitan", {"torchtitan.toml", "torchtitan_overrides.txt", "launch_torchrun.sh", "launch_slurm.sbatch"}),
])
def test_emit_other_frameworks(run_cli, tmp_path, framework, files):
    # Megatron-DeepSpeed has no Llama 3.1 RoPE scaling: Llama 2 70B there
    plan = [x.replace("llama3.1-70b", "llama2-70b") for x in PLAN] if framework == "deepspeed" else PLAN
    r = run_cli(*plan, "--framework", framework, "--emit", framework, "--output", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    assert {p.name for p in tmp_path.iterdir()} == files
    r2 = run_cli(*plan, "--framework", framework, "--emit", framework)  # no --output: stdout
    main = "ds_config.json" if framework == "deepspeed" else "torchtitan.toml"
    assert r2.stdout == (tmp_path / main).read_text()


def test_emit_rank_selects_the_plan(run_cli, tmp_path):
    doc = run_cli(*PLAN, "--format", "json").json()
    r = run_cli(*PLAN, "--emit", "megatron", "--rank", "2", "--output", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    assert shlex.split((tmp_path / "megatron_args.txt").read_text()) == doc["plans"][1]["launch"]["megatron"]


def test_emit_bad_rank_is_one_line_error(run_cli):
    r = run_cli("plan", "--top-k", "1", "--emit", "megatron", "--rank", "0")
    assert r.exit_code == 2 and "--rank" in r.stderr and "Traceback" not in r.stderr


def test_emit_stdout_megatron_keeps_command_line(run_cli):
    r = run_cli("plan", "--top-k", "1", "--emit", "megatron")
    assert r.exit_code == 0 and r.stdout.startswith("pretrain_gpt.py \\\n  --num-layers 32")


# ---------------------------------------------------------------------------------------------------- scripts
def _fake_bin(tmp: Path) -> Path:
    """A PATH folder whose torchrun/srun/scontrol print what they were given (one argument per line)."""
    b = tmp / "bin"
    b.mkdir()
    (b / "torchrun").write_text('#!/usr/bin/env bash\necho "CDMC=${CUDA_DEVICE_MAX_CONNECTIONS:-unset}"\n'
                                'printf "%s\\n" "$@"\n')
    (b / "srun").write_text('#!/usr/bin/env bash\nexec "$@"\n')
    (b / "scontrol").write_text('#!/usr/bin/env bash\necho node-a; echo node-b\n')
    for f in b.iterdir():
        f.chmod(0o755)
    return b


@pytest.mark.parametrize("kind", ["torchrun", "slurm"])
def test_launch_script_runs_torchrun_with_the_plan_arguments(tmp_path, kind):
    args = megatron_args(get_model("llama3.1-405b"), JOB, BRANCH_CASES[0][1])
    text = launch_script(kind, "pretrain_gpt.py", args, 16, 8, "test", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                         ["--mock-data"], ["--train-iters", "5"])
    script = tmp_path / "s.sh"
    script.write_text(text)
    env = {"PATH": f"{_fake_bin(tmp_path)}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "x"}
    out = subprocess.run(["bash", str(script), "--extra"], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "CDMC=1"
    i = lines.index("pretrain_gpt.py")
    assert lines[i + 1:] == args + ["--mock-data", "--train-iters", "5", "--extra"]
    head = lines[1:i]
    assert head[head.index("--nnodes") + 1] == "16" and head[head.index("--nproc-per-node") + 1] == "8"
    if kind == "slurm":
        assert head[head.index("--rdzv-endpoint") + 1] == "node-a:29500"


def test_schema_command_is_valid_json(run_cli):
    r = run_cli("schema")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["title"] == "PlanDocument"


def test_emit_deepspeed_refuses_pipeline_zero2_plan(run_cli, tmp_path):
    r = run_cli("evaluate", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus", "128", "--tp", "2", "--pp", "4",
                "--ep", "8", "--etp", "1", "--zero-stage", "2", "--sequence-parallel", "--emit", "deepspeed",
                "--output", str(tmp_path / "ds"))
    # --emit deepspeed evaluates under DeepSpeed's rules: the configuration is infeasible there (exit 1)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "infeasible, nothing emitted" in r.stderr and "ZeRO stage <= 1" in r.stderr
    assert not (tmp_path / "ds").exists()
    # under explicit Megatron rules it is feasible; the DeepSpeed emitter itself refuses it (exit 1 likewise)
    r = run_cli("evaluate", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus", "128", "--tp", "2", "--pp", "4",
                "--ep", "8", "--etp", "1", "--zero-stage", "2", "--sequence-parallel", "--emit", "deepspeed",
                "--framework", "megatron", "--output", str(tmp_path / "ds"))
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "ZeRO stage 0 or 1" in r.stderr and "--framework deepspeed" in r.stderr
    assert not (tmp_path / "ds").exists()


def test_hsdp_and_bf16_grad_reduce():
    par = ParallelConfig(tp=1, pp=1, dp=64, zero_stage=3, hsdp_shard_size=8, grad_reduce_in_bf16=True)
    lf = launch_fields(get_model("llama3.1-8b"), JOB, par, 8)
    a = parse_argv(lf["megatron"])
    assert a["num_distributed_optimizer_instances"] == 8 and a["grad_reduce_in_bf16"] is True  # 64 / 8 groups
    # neither DeepSpeed nor torchtitan 0.2.2 (mixed_precision_reduce: float32 only) reduces in bf16: refused
    assert lf["deepspeed"] is None and lf["torchtitan_toml"] is None
    assert "grad_reduce_in_bf16" in lf["unsupported"]["torchtitan"]
    lf = launch_fields(get_model("llama3.1-8b"), JOB, par.model_copy(update={"grad_reduce_in_bf16": False}), 8)
    # DeepSpeed 0.19.8's own DeepSpeedConfig rejects MiCS (mics_shard_size): no hybrid sharding to emit
    assert lf["deepspeed"] is None and "MiCS was removed" in lf["unsupported"]["deepspeed"]
    p = tomllib.loads(lf["torchtitan_toml"])["parallelism"]
    assert (p["data_parallel_shard_degree"], p["data_parallel_replicate_degree"]) == (8, 8)


def test_megatron_deepspeed_refuses_ulysses_with_megatron_sp():
    par = ParallelConfig(tp=4, pp=8, dp=2, cp=2, sequence_parallel=True, zero_stage=1)
    lf = launch_fields(get_model("llama2-70b"), JOB, par, 8)
    assert lf["megatron_deepspeed"] is None and "Ulysses" in lf["unsupported"]["megatron_deepspeed"]
    # the JSON alone does not set tp (the training script does): not emitted either, with both reasons
    assert lf["deepspeed"] is None and lf["unsupported"]["deepspeed"].startswith("tp 4: ds_config.json alone")
    assert "Ulysses" in lf["unsupported"]["deepspeed"]


def test_recipe_knobs_become_megatron_flags():
    m = get_model("deepseek-v3")
    par = BRANCH_CASES[7][1]
    a = parse_argv(megatron_args(m, JOB, par))
    assert a["pipeline_model_parallel_layout"] == par.pipeline_layout
    assert not {"num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                "decoder_first_pipeline_num_layers"} & set(a)  # validate_args: one of them at most
    assert a["recompute_modules"] == ["core_attn", "mla_up_proj"]
    assert (a["use_precision_aware_optimizer"], a["exp_avg_dtype"], a["exp_avg_sq_dtype"]) == (True, "bf16", "bf16")
    assert (a["optimizer_cpu_offload"], a["optimizer_offload_fraction"]) == (True, 0.5)
    a8 = parse_argv(megatron_args(get_model("llama2-70b"), _job("fp8"), BRANCH_CASES[1][1]))
    assert a8["fp8_param_gather"] is True and a8["fp8_recipe"] == "delayed"
    # delayed scaling cannot recompute moe_act/layernorm under FP8 (megatron-core): per-tensor current scaling
    moe_act = par.model_copy(update={"recompute_modules": ("moe_act",)})
    assert parse_argv(megatron_args(m, _job("fp8"), moe_act))["fp8_recipe"] == "tensorwise"
    a = parse_argv(megatron_args(get_model("llama2-70b"), JOB, BRANCH_CASES[8][1]))
    assert a["account_for_embedding_in_pipeline_split"] and a["account_for_loss_in_pipeline_split"]


def test_evaluate_never_emits_an_infeasible_configuration(run_cli, tmp_path):
    # Llama-3.1-70B on 8 GPUs without sharding: ~1.3 TB of states per GPU; nothing is written, exit 1
    r = run_cli("evaluate", "--model", "llama3.1-70b", "--gpus", "8", "--emit", "megatron",
                "--output", str(tmp_path / "out"))
    assert r.exit_code == 1 and r.stdout == "" and "infeasible, nothing emitted" in r.stderr
    assert not (tmp_path / "out").exists()


def test_emit_for_another_framework_than_the_ranking_says_so(run_cli):
    r = run_cli("plan", "--gpus", "8", "--framework", "megatron", "--emit", "torchtitan", "--zero-stage", "3")
    assert r.exit_code == 0 and "[parallelism]" in r.stdout
    assert "computed under megatron rules" in r.stderr and "--framework torchtitan" in r.stderr
    assert run_cli("plan", "--gpus", "8", "--emit", "torchtitan").stderr == ""


def test_emit_output_that_looks_like_a_file_is_refused(run_cli, tmp_path):
    r = run_cli("plan", "--emit", "megatron", "--output", str(tmp_path / "args.json"))
    assert r.exit_code == 2 and "--output is a directory" in r.stderr and not (tmp_path / "args.json").exists()


def test_combined_1f1b_is_megatrons_overlap_flags_and_refused_elsewhere():
    name, par, prec = BRANCH_CASES[-1]
    lf = launch_fields(get_model(name), _job(prec), par, 8)
    a = parse_argv(lf["megatron"])
    assert a["overlap_moe_expert_parallel_comm"] is True and a["delay_wgrad_compute"] is True
    assert a["num_layers_per_virtual_pipeline_stage"] == 4  # 32 layers / pp 4 / vpp 2
    assert "combined-1f1b" in lf["unsupported"]["torchtitan"] and "vpp 2" in lf["unsupported"]["deepspeed"]


@pytest.mark.parametrize("schedule,name", [("zb-v", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")])
def test_v_schedules_are_torchtitans_and_refused_by_megatron(schedule, name):
    par = ParallelConfig(tp=2, pp=4, dp=4, vpp=2, zero_stage=3, sequence_parallel=True, schedule=schedule)
    lf = launch_fields(get_model("llama3.1-8b"), JOB, par, 8)
    t = tomllib.loads(lf["torchtitan_toml"])
    p = t["parallelism"]
    # 32 layers over 2 x 4 V stages: 4 per stage; torch refuses compiled stage modules for these schedules
    assert (p["pipeline_parallel_schedule"], p["pipeline_parallel_layers_per_stage"]) == (name, 4)
    assert t["compile"]["components"] == ["loss"]
    assert p.get("pipeline_parallel_expert_parallel_overlap", False) == (schedule == "dualpipev")
    assert lf["unsupported"]["megatron"].startswith(f"pipeline schedule {schedule}: Megatron-LM runs")
    dual = launch_fields(get_model("llama3.1-8b"), JOB, par.model_copy(update={"schedule": "dualpipe", "vpp": 1}), 8)
    assert {"megatron", "deepspeed", "torchtitan"} <= set(dual["unsupported"])  # DualPipe runs in none of them


@pytest.mark.parametrize("dp,cp,zero", [(8, 1, 1), (4, 2, 0), (1, 1, 1)])
def test_megatron_plan_costs_the_dp_overlap_its_launch_runs(dp, cp, zero):
    # the Megatron launch passes --overlap-grad-reduce (and --overlap-param-gather under the distributed optimizer)
    # whenever dp x cp > 1; Megatron-LM's own default is off. The planner's step time must charge what the launch
    # runs (planner/launch_options.py), not the framework default.
    from cluster_specs import get_cluster
    from cost_models.step_time import estimate_step
    from planner.evaluation import evaluate
    model, cluster = get_model("llama3.1-8b"), get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=256, seq_length=4096)
    par = ParallelConfig(tp=1, pp=1, dp=dp, cp=cp, micro_batch_size=1, zero_stage=zero)
    names = megatron_args(model, job, par)
    overlapped = dp * cp > 1
    assert ("--overlap-grad-reduce" in names) == overlapped
    assert ("--overlap-param-gather" in names) == (overlapped and zero >= 1)
    ev = evaluate(model, cluster, job, par, par.world_size)
    assert ev.step.step_s == estimate_step(model, cluster, job, par, overlap_dp=overlapped).step_s
    if overlapped:  # the exposed reduction is slower: the overlap is what the ranking saw
        assert estimate_step(model, cluster, job, par, overlap_dp=False).step_s > ev.step.step_s


def test_ds_config_alone_refuses_what_the_training_script_sets():
    """Without a Megatron-DeepSpeed launch (a model it cannot express, e.g. Llama 3.1's RoPE scaling) the JSON alone
    must carry every knob: unfused attention and dropout belong to the script that builds the model, so both are
    refused by name (dropout was once accepted silently)."""
    from planner.emit.deepspeed import check_ds_config_alone
    for job, knob in ((TrainingJob(global_batch_size=8, dropout=True), "dropout"),
                      (TrainingJob(global_batch_size=8, flash_attention=False), "unfused attention")):
        with pytest.raises(EmitError, match=f"{knob}: ds_config.json alone does not set it"):
            check_ds_config_alone(job, ParallelConfig(dp=8))
    lf = launch_fields(get_model("llama3.1-8b"), TrainingJob(global_batch_size=8, dropout=True), ParallelConfig(dp=8),
                       8)
    assert lf["deepspeed"] is None and "dropout" in lf["unsupported"]["deepspeed"]


def test_torchtitan_03_overrides_run_the_plan_as_costed():
    """torchtitan 0.3.0's registry configs are not neutral (checked with its ConfigManager): ``llama3_8b`` and
    ``llama3_70b`` leave torch.compile off, which the costed (compiled) plan assumes on; ``llama3_405b`` turns async TP
    on and builds Float8 linears (torchao), and its model spec is no command-line field. The overrides now set
    compile, its components and the dtypes; a bf16 405B plan gets no overrides (the TOML for 0.2.2 still launches it)
    and its files say why."""
    from planner.emit import torchtitan_overrides
    job = TrainingJob(global_batch_size=8, seq_length=4096, framework="torchtitan")
    over = torchtitan_overrides(get_model("llama3.1-8b"), job, ParallelConfig(dp=2, zero_stage=3))
    flags = " ".join(over)
    assert "--compile.enable --compile.components model,loss --compile.no-enable-async-tensor-parallel" in flags
    assert "--training.mixed_precision_param bfloat16 --training.mixed_precision_reduce float32" in flags
    par = ParallelConfig(dp=2, tp=8, zero_stage=3, sequence_parallel=True)
    lf = launch_fields(get_model("llama3.1-405b"), job, par, 8)
    assert lf["torchtitan_toml"] is not None and lf["torchtitan_overrides"] is None
    assert "torchtitan" not in lf["unsupported"] and "Float8" in lf["unsupported"]["torchtitan_overrides"]
    import planner
    doc = planner.evaluate("llama3.1-405b", "dgx-h100", gpus=16, global_batch_size=8, seq_length=4096,
                           framework="torchtitan", tp=8, zero_stage=3, sequence_parallel=True)
    from planner.emit import emit_files
    files = emit_files(doc, "torchtitan")
    assert "torchtitan.toml" in files and "Float8" in files["torchtitan_overrides_unsupported.txt"]


#: torchtitan v0.2.2 models/qwen3/__init__.py qwen3_configs, transcribed: (n_layers, dim, n_heads, n_kv_heads,
#: head_dim, hidden_dim or moe_inter_dim, num_experts, top_k, rope_theta)
TORCHTITAN_QWEN3 = {"8B": (36, 4096, 32, 8, 128, 12288, None, None, 1e6),
                    "32B": (64, 5120, 64, 8, 128, 25600, None, None, 1e6),
                    "30B-A3B": (48, 2048, 32, 4, 128, 768, 128, 8, 1e6)}


def test_torchtitan_qwen3_flavors_are_the_zoo_models():
    """The Qwen3 models plan3d maps to torchtitan's built-in flavors have the flavors' dims (a mapped model must be
    the model plan3d costed); their launches name the torchtitan model and flavor, and the 0.3 registry config."""
    from planner.emit import torchtitan_overrides
    from planner.emit.torchtitan import TORCHTITAN_MODELS
    for name, (module, flavor) in TORCHTITAN_MODELS.items():
        if module != "qwen3":
            continue
        m = get_model(name)
        moe = m.moe
        got = (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim,
               moe.expert_ffn_hidden_size if moe else m.ffn_hidden_size, moe.num_experts if moe else None,
               moe.top_k if moe else None, m.rope_theta)
        assert got == TORCHTITAN_QWEN3[flavor] and m.qk_norm and not m.tie_word_embeddings, name
    job = TrainingJob(global_batch_size=8, seq_length=4096, framework="torchtitan")
    toml = tomllib.loads(torchtitan_toml(get_model("qwen3-30b-a3b"), job, ParallelConfig(dp=2, ep=2, zero_stage=3)))
    assert (toml["model"]["name"], toml["model"]["flavor"]) == ("qwen3", "30B-A3B")
    over = torchtitan_overrides(get_model("qwen3-32b"), job, ParallelConfig(dp=2, zero_stage=3))
    assert over[:4] == ["--module", "qwen3", "--config", "qwen3_32b"]


def test_torchtitan_launch_never_stands_in_another_model():
    # a model torchtitan has no built-in flavor / registered config for keeps its own name in the TOML and the
    # 0.3.x overrides, so that torchtitan refuses to start until it is registered; it once fell back to
    # llama3 / llama3_debugmodel, which trains the debug model (and a dense llama3 under expert parallelism)
    from planner.emit import torchtitan_overrides
    for name, par in (("mixtral-8x7b", ParallelConfig(dp=2, ep=2, zero_stage=3)),
                      ("qwen2.5-7b", ParallelConfig(dp=2, zero_stage=3))):
        model = get_model(name)
        job = TrainingJob(global_batch_size=8, seq_length=4096, framework="torchtitan")
        toml = tomllib.loads(torchtitan_toml(model, job, par))
        assert toml["model"]["name"] == name and toml["model"]["flavor"] == name
        over = torchtitan_overrides(model, job, par)
        assert over[:4] == ["--module", name, "--config", name]
    llama = torchtitan_overrides(get_model("llama3.1-8b"), TrainingJob(global_batch_size=8, framework="torchtitan"),
                                 ParallelConfig(dp=2, zero_stage=3))
    assert llama[:4] == ["--module", "llama3", "--config", "llama3_8b"]


def test_deepspeed_launch_takes_deepspeeds_own_split_and_refuses_others():
    # 96 layers over pp 7: Megatron-DeepSpeed runs 5 x 14 + 2 x 13 itself (layout.deepspeed_pipeline_layout); a
    # Megatron first/last split or another layout is not what it would run
    from cost_models.layout import deepspeed_pipeline_layout
    from planner.emit.deepspeed import megatron_deepspeed_args
    from planner.emit.megatron import EmitError
    gpt3 = get_model("gpt3-175b")
    own = deepspeed_pipeline_layout(96, 7)
    par = ParallelConfig(tp=8, pp=7, dp=2, zero_stage=1, sequence_parallel=True, pipeline_layout=own)
    a = parse_argv(megatron_deepspeed_args(gpt3, JOB, par))
    assert a["pipeline_model_parallel_size"] == 7 and "pipeline_model_parallel_layout" not in a
    other = par.model_copy(update={"pipeline_layout": None, "first_stage_layers": 12, "last_stage_layers": 12})
    with pytest.raises(EmitError, match="balances transformer layers over the stages itself"):
        megatron_deepspeed_args(gpt3, JOB, other)


def test_emit_deepspeed_for_a_model_megatron_deepspeed_cannot_build_searches_what_ds_config_carries(run_cli, tmp_path):
    """Llama 3.1's RoPE scaling has no Megatron-DeepSpeed option, so ``--emit deepspeed`` writes ``ds_config.json``
    alone; the search then keeps to what the JSON carries (tp, cp, ep 1; recompute none or full, the training
    script checkpointing each layer) instead of ranking plans it cannot emit. Found by a new-user trial: every one
    of the top 200 plans of Llama 3.1 70B on 64 H100s was refused, and the advice to pin knobs went in a circle."""
    from planner.api import launchable_pins
    from planner.errors import NoFeasiblePlan, PlanInputError
    pins, note = launchable_pins("deepspeed", "llama3.1-70b", gpus=64)
    assert pins == {"tp": 1, "cp": 1, "ep": 1, "recompute": ("none", "full")} and "rope_scaling llama3" in note
    assert launchable_pins("megatron", "llama3.1-70b", gpus=64) == ({}, None)
    assert launchable_pins("deepspeed", "llama2-70b", gpus=64) == ({}, None)  # Megatron-DeepSpeed builds it
    with pytest.raises(NoFeasiblePlan, match="--tp 2: ds_config.json alone does not set it"):
        launchable_pins("deepspeed", "llama3.1-70b", gpus=64, tp=2)
    r = run_cli("plan", "--model", "llama3.1-70b", "--gpus", "64", "--global-batch-size", "512", "--seq-length",
                "8192", "--emit", "deepspeed", "--output", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    cfg = json.loads((tmp_path / "ds_config.json").read_text())
    assert cfg["train_batch_size"] == 512
    # 70B at 8k tokens on 64 GPUs without tensor parallelism fits only with every layer recomputed (ZeRO-3, 55 GiB;
    # 211 GiB without): the JSON carries the checkpointing section and the note tells the script to turn it on
    assert "activation_checkpointing" in cfg
    note_file = (tmp_path / "megatron_deepspeed_unsupported.txt").read_text()
    assert "recompute full: checkpoint every transformer layer in the training script" in note_file
    printed = run_cli("plan", "--model", "llama3.1-70b", "--gpus", "64", "--global-batch-size", "512", "--seq-length",
                      "8192", "--emit", "deepspeed")  # printed, not written: the same instruction on stderr
    assert json.loads(printed.stdout) == cfg and "recompute full: checkpoint every transformer layer" in printed.stderr
    # the recompute pin as a string or a tuple inside what the JSON carries; anything else refused by name
    assert launchable_pins("deepspeed", "llama3.1-70b", gpus=64, recompute=("none", "full"))[0] == \
        {"tp": 1, "cp": 1, "ep": 1}
    assert "recompute full (" in launchable_pins("deepspeed", "llama3.1-70b", gpus=64, recompute="full")[1]
    with pytest.raises(PlanInputError, match="--recompute 'bogus': must be one of"):
        launchable_pins("deepspeed", "llama3.1-70b", gpus=64, recompute="bogus")
    with pytest.raises(NoFeasiblePlan, match="--framework megatron: .*DeepSpeed's own rules"):
        launchable_pins("deepspeed", "llama3.1-70b", gpus=64, framework="megatron")
    import planner
    with pytest.raises(PlanInputError, match="--recompute: give at least one of"):
        planner.plan("llama2-7b", gpus=8, recompute=())
    from planner.emit.deepspeed import check_ds_config_alone
    check_ds_config_alone(TrainingJob(global_batch_size=8), ParallelConfig(dp=8, recompute="full"))
    with pytest.raises(EmitError, match="recompute selective: ds_config.json alone"):
        check_ds_config_alone(TrainingJob(global_batch_size=8), ParallelConfig(dp=8, recompute="selective"))
