"""Emitted launch configs define the plan's model and can be pasted into a shell.

* The Megatron command line printed by ``plan --emit megatron`` passes ``bash -n`` and splits back into the plan's
  arguments (DeepSeek-V3's ``--moe-layer-freq ([0]*3+[1]*58)`` is quoted).
* The settings that define a model without holding parameters come out with the values of the model's HF
  ``config.json`` (tests/data/hf_configs): RoPE base, norm epsilon, RoPE scaling, rotary fraction, activation,
  LayerNorm1P, router score function / expert bias / group-limited routing / top-k scaling / pre-softmax.
* megatron-core's own ``MLATransformerConfig`` takes them (validators extra), and its YaRN and Llama-3.1 defaults
  that have no command-line option equal the HF values.
* Every emitted option is in Megatron-LM's parser list (tests/data/megatron_arg_names.txt).
* ``--emit deepspeed`` plans under DeepSpeed's rules (README example exits 0); ``--output`` into a missing folder
  is a one-line error (exit 2).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import warnings

import pytest

from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model, list_models, load_model
from planner.emit import EmitError, launch_fields, megatron_args, torchtitan_toml
from test_emit_support import DATA, megatron_arg_names, parse_argv

JOB = TrainingJob(global_batch_size=1024, seq_length=4096)
HF = DATA / "hf_configs"
HAS_MCORE = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("megatron") is not None \
    and importlib.util.find_spec("megatron.core") is not None
needs_mcore = pytest.mark.skipif(not HAS_MCORE, reason="validators extra not installed (megatron-core)")


def _hf(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def _args(model, par: ParallelConfig | None = None) -> dict:
    return parse_argv(megatron_args(model, JOB, par or ParallelConfig(tp=1, pp=1, dp=8)))


# ------------------------------------------------------------------------------------------- pasteable stdout
@pytest.mark.parametrize("model,gpus", [("deepseek-v3", 2048), ("llama3.1-405b", 1024)])
def test_printed_megatron_command_is_valid_shell(run_cli, tmp_path, model, gpus):
    r = run_cli("plan", "--model", model, "--gpus", str(gpus), "--emit", "megatron")
    assert r.exit_code == 0, r.stderr
    script = tmp_path / "cmd.sh"
    script.write_text(r.stdout)
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # run it with pretrain_gpt.py as a shell function printing its arguments: bash hands over the plan's arguments
    run = tmp_path / "run.sh"
    run.write_text("pretrain_gpt.py() { printf '%s\\0' \"$@\"; }\n" + r.stdout)
    got = subprocess.run(["bash", str(run)], capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    doc = run_cli("plan", "--model", model, "--gpus", str(gpus), "--format", "json").json()
    assert got == doc["plans"][0]["launch"]["megatron"]
    if model == "deepseek-v3":
        assert "--moe-layer-freq '([0]*3+[1]*58)'" in r.stdout


# ------------------------------------------------------------------------------------- values from config.json
def test_deepseek_v3_settings_from_config_json():
    cfg = _hf("deepseek-v3")
    rs = cfg["rope_scaling"]
    for m in (get_model("deepseek-v3"), load_model(HF / "deepseek-v3.json")):
        a = _args(m, ParallelConfig(tp=1, pp=1, dp=8, ep=8))
        assert a["rotary_base"] == cfg["rope_theta"] == 10000
        assert a["norm_epsilon"] == cfg["rms_norm_eps"] == 1e-6
        # YaRN (config.json rope_scaling type yarn, factor 40, mscale 1.0, mscale_all_dim 1.0)
        assert (a["rope_type"], a["rotary_scaling_factor"], a["mscale"], a["mscale_all_dim"]) == \
            ("yarn", rs["factor"], rs["mscale"], rs["mscale_all_dim"]) == ("yarn", 40, 1.0, 1.0)
        # router: sigmoid scores + e_score_correction_bias, 8 groups / top-4 groups, routed_scaling_factor 2.5
        assert a["moe_router_score_function"] == cfg["scoring_func"] == "sigmoid"
        assert a["moe_router_enable_expert_bias"] is True and cfg["topk_method"] == "noaux_tc"
        assert (a["moe_router_num_groups"], a["moe_router_group_topk"]) == (cfg["n_group"], cfg["topk_group"]) == (8, 4)
        assert a["moe_router_topk_scaling_factor"] == cfg["routed_scaling_factor"] == 2.5
        assert "moe_router_pre_softmax" not in a  # norm_topk_prob true
        # MLA dims
        assert (a["multi_latent_attention"], a["q_lora_rank"], a["kv_lora_rank"], a["qk_head_dim"],
                a["qk_pos_emb_head_dim"], a["v_head_dim"]) == \
            (True, cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
             cfg["v_head_dim"])
        # the latent RMSNorms (HF q_a_layernorm, kv_a_layernorm) are built by megatron-core only with qk_layernorm
        assert a["qk_layernorm"] is True
        # no dropout (Megatron's default is 0.1 for both)
        assert (a["attention_dropout"], a["hidden_dropout"]) == (0.0, 0.0)


@pytest.mark.parametrize("name,zoo", [("llama3.1-8b", "llama3.1-8b"), ("llama3.1-8b", "llama3.1-405b")])
def test_llama31_rope_base_scaling_and_eps(name, zoo):
    cfg = _hf(name)
    for m in (get_model(zoo), load_model(HF / f"{name}.json")):
        a = _args(m)
        assert a["rotary_base"] == cfg["rope_theta"] == 500000
        assert a["norm_epsilon"] == cfg["rms_norm_eps"] == 1e-5
        assert a["use_rope_scaling"] is True and a["rope_scaling_factor"] == cfg["rope_scaling"]["factor"] == 8.0
        assert "rope_type" not in a


@pytest.mark.parametrize("name,theta,eps", [("qwen2.5-7b", 1_000_000, 1e-6), ("mixtral-8x7b", 1_000_000, 1e-5),
                                            ("llama2-70b", 10000, 1e-5)])
def test_rope_base_and_norm_eps_of_hf_configs(name, theta, eps):
    cfg = _hf(name)
    assert cfg.get("rope_theta", 10000) == theta and cfg["rms_norm_eps"] == eps  # LlamaConfig default 10000
    for m in (get_model(name), load_model(HF / f"{name}.json")):
        a = _args(m)
        assert (a["rotary_base"], a["norm_epsilon"]) == (theta, eps)
        assert not {"use_rope_scaling", "rope_type", "moe_router_score_function", "moe_router_pre_softmax"} & set(a)


def test_qwen_moe_without_renormalised_topk_uses_pre_softmax():
    # Qwen1.5-MoE-A2.7B config.json norm_topk_prob false: softmax over all 60 experts, top-4 weights kept as they
    # are = megatron-core's --moe-router-pre-softmax
    cfg = _hf("qwen1.5-moe-a2.7b")
    assert cfg["norm_topk_prob"] is False
    a = _args(load_model(HF / "qwen1.5-moe-a2.7b.json"))
    assert a["moe_router_pre_softmax"] is True and "moe_router_score_function" not in a
    assert (a["rotary_base"], a["norm_epsilon"]) == (cfg["rope_theta"], cfg["rms_norm_eps"]) == (1_000_000, 1e-6)
    q3 = _args(load_model(HF / "qwen3-30b-a3b.json"))  # norm_topk_prob true: Megatron's default softmax after top-k
    assert "moe_router_pre_softmax" not in q3


def test_nemotron_partial_rotary_squared_relu_layernorm1p():
    cfg = _hf("minitron-4b")  # nemotron: relu2, partial_rotary_factor 0.5, norm_eps 1e-5, NemotronLayerNorm1P
    for m in (load_model(HF / "minitron-4b.json"), get_model("nemotron-4-340b")):
        a = _args(m)
        assert a["squared_relu"] is True and "swiglu" not in a and cfg["hidden_act"] == "relu2"
        assert a["rotary_percent"] == cfg["partial_rotary_factor"] == 0.5
        assert a["apply_layernorm_1p"] is True and "normalization" not in a  # LayerNorm (Megatron's default)
        assert a["norm_epsilon"] == cfg["norm_eps"] == 1e-5


def test_every_emitted_flag_is_a_megatron_lm_option():
    _, names = megatron_arg_names()
    models = [get_model(n) for n in list_models()] + [load_model(p) for p in sorted(HF.glob("*.json"))]
    refused = {}
    for m in models:
        par = ParallelConfig(tp=1, pp=1, dp=8, ep=8 if m.moe is not None and m.moe.num_experts % 8 == 0 else 1)
        try:
            args = megatron_args(m, JOB, par)
        except EmitError as e:  # a model Megatron-LM's options cannot express: refused with the setting named
            refused[m.name] = str(e)
            continue
        flags = [x for x in args if x.startswith("--")]
        unknown = sorted(set(flags) - names)
        assert not unknown, f"{m.name}: {unknown}"
    # only the models with settings the launch has no option for (gpt-oss sinks, Llama 4 chunked attention,
    # Kimi K2's YaRN betas, BLOOM's ALiBi: the zoo entry and the HF config.json) are refused
    assert set(refused) == {"gpt-oss-20b", "gpt-oss-120b", "llama4-scout", "llama4-maverick", "kimi-k2", "bloom-176b",
                            "bloom"}, refused


# --------------------------------------------------------------------------------------- megatron-core itself
@needs_mcore
def test_megatron_core_builds_deepseek_v3_with_these_settings():
    from test_emit_support import megatron_core_config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = _args(get_model("deepseek-v3"), ParallelConfig(tp=1, pp=1, dp=8, ep=8))
        cfg = megatron_core_config(a, None)
    rs = _hf("deepseek-v3")["rope_scaling"]
    assert type(cfg).__name__ == "MLATransformerConfig"
    assert (cfg.rope_type, cfg.rotary_base, cfg.rotary_scaling_factor, cfg.mscale, cfg.mscale_all_dim) == \
        ("yarn", 10000, rs["factor"], rs["mscale"], rs["mscale_all_dim"])
    # YaRN values without a command-line option: megatron-core's defaults are DeepSeek-V3's
    assert (cfg.original_max_position_embeddings, cfg.beta_fast, cfg.beta_slow) == \
        (rs["original_max_position_embeddings"], rs["beta_fast"], rs["beta_slow"]) == (4096, 32, 1)
    assert (cfg.moe_router_score_function, cfg.moe_router_enable_expert_bias, cfg.moe_router_num_groups,
            cfg.moe_router_group_topk, cfg.moe_router_topk_scaling_factor) == ("sigmoid", True, 8, 4, 2.5)
    assert cfg.qk_layernorm is True and (cfg.attention_dropout, cfg.hidden_dropout) == (0.0, 0.0)


@needs_mcore
def test_megatron_core_llama31_scaling_defaults_match_config_json():
    """``--use-rope-scaling`` has only a factor option; megatron-core's fixed low/high frequency factors and original
    context equal Llama 3.1's config.json (1.0, 4.0, 8192)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    p = inspect.signature(RotaryEmbedding._apply_scaling).parameters
    rs = _hf("llama3.1-8b")["rope_scaling"]
    assert (p["low_freq_factor"].default, p["high_freq_factor"].default,
            p["original_max_position_embeddings"].default) == \
        (rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"])


# ----------------------------------------------------------------------------------- DeepSpeed and torchtitan
def test_megatron_deepspeed_carries_or_refuses_the_settings():
    par = ParallelConfig(tp=2, pp=1, dp=4, zero_stage=1)
    a = parse_argv(launch_fields(get_model("mixtral-8x7b"), JOB, par, 8)["megatron_deepspeed"])
    assert (a["rope_theta"], a["layernorm_epsilon"]) == (1_000_000, 1e-5)  # Mixtral config.json
    a = parse_argv(launch_fields(get_model("qwen2.5-7b"), JOB, par, 8)["megatron_deepspeed"])
    assert (a["rope_theta"], a["layernorm_epsilon"]) == (1_000_000, 1e-6)
    for name, why in (("deepseek-v3", "multi-latent attention"), ("llama3.1-8b", "rope_scaling llama3"),
                      ("nemotron-4-340b", "rotary_percent 0.5")):
        lf = launch_fields(get_model(name), JOB, par, 8)
        assert lf["megatron_deepspeed"] is None and why in lf["unsupported"]["megatron_deepspeed"]


def test_torchtitan_toml_names_the_settings_of_an_unregistered_model():
    toml = torchtitan_toml(get_model("qwen2.5-7b"), JOB, ParallelConfig(tp=1, pp=1, dp=8))
    assert "rope_theta 1e+06; norm_eps 1e-06" in toml


# ----------------------------------------------------------------------------------------------- CLI options
def test_readme_emit_deepspeed_plans_under_deepspeed_rules(run_cli):
    r = run_cli("plan", "--model", "mixtral-8x7b", "--gpus", "64", "--emit", "deepspeed")
    assert r.exit_code == 0, r.stderr
    ds = json.loads(r.stdout)
    # DeepSpeed's pipeline engine: ZeRO stage 0/1 with pipeline stages (runtime/pipe/engine.py)
    assert not ("pipeline" in ds and ds["zero_optimization"]["stage"] >= 2)
    doc = run_cli("plan", "--model", "mixtral-8x7b", "--gpus", "64", "--framework", "deepspeed",
                  "--format", "json").json()
    assert doc["plans"][0]["launch"]["deepspeed"] == ds  # same plan as an explicit --framework deepspeed
    # an explicit --framework wins over the --emit target
    r = run_cli("plan", "--model", "mixtral-8x7b", "--gpus", "64", "--framework", "megatron", "--emit", "deepspeed",
                "--zero-stage", "2", "--pp", "2")
    assert r.exit_code == 1 and "ZeRO stage 0 or 1" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("extra", [[], ["--format", "json"]])
def test_output_into_missing_folder_is_one_line(run_cli, tmp_path, extra):
    path = tmp_path / "missing" / "x.json"
    r = run_cli("plan", "--top-k", "1", *extra, "--output", str(path))
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == f"plan3d: error: --output {path}: No such file or directory\n"


def test_emit_output_under_a_file_is_one_line(run_cli, tmp_path):
    (tmp_path / "f").write_text("")
    r = run_cli("plan", "--top-k", "1", "--emit", "megatron", "--output", str(tmp_path / "f" / "run"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Not a directory" in r.stderr
    assert "Traceback" not in r.stderr
