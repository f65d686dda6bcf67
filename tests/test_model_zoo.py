"""Tests for model_zoo: exact parameter counts against Hugging Face / published figures, loaders, errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import model_zoo as mz
from model_zoo import LayerParams, ModelSpec, ModelSpecError

DATA = Path(__file__).parent / "data"
HF = DATA / "hf_configs"
PARAM_COUNTS = json.loads((DATA / "param_counts.json").read_text())

# built-in name -> fixture file holding the same model's HF config.json
FIXTURE_OF = {
    "llama3.1-8b": "llama3.1-8b.json",
    "llama2-70b": "llama2-70b.json",
    "mixtral-8x7b": "mixtral-8x7b.json",
    "qwen2.5-7b": "qwen2.5-7b.json",
    "deepseek-v3": "deepseek-v3.json",
    "bloom-176b": "bloom.json",
}


# ---------------------------------------------------------------- exact HF totals (param_counts.json)
# source: PARAM_COUNTS["note"] — HF transformers model classes instantiated on the meta device.
@pytest.mark.parametrize("name", sorted(PARAM_COUNTS["models"]))
def test_param_counts_exact(name):
    ref = PARAM_COUNTS["models"][name]
    m = mz.get_model(name)
    assert m.num_parameters() == ref["total"]
    assert m.vocab_size * m.hidden_size == ref["embedding"]
    assert m.embedding_params() == ref["embedding"]  # RoPE models: embedding = V*h only
    cfg = ref["config"]
    assert (m.hidden_size, m.ffn_hidden_size, m.num_layers) == (
        cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"])
    assert (m.num_attention_heads, m.num_kv_heads, m.vocab_size, m.tie_word_embeddings) == (
        cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"], cfg["tie_word_embeddings"])


@pytest.mark.parametrize("name", sorted(PARAM_COUNTS["models"]))
def test_param_counts_from_synthetic_hf_config(name):
    ref = PARAM_COUNTS["models"][name]
    cfg = dict(ref["config"], model_type="mixtral" if name.startswith("mixtral") else "llama")
    if name.startswith("mixtral"):
        cfg.update(num_local_experts=8, num_experts_per_tok=2)
    assert mz.from_hf_config(cfg, name=name).num_parameters() == ref["total"]


@pytest.mark.parametrize("name,fixture", sorted(FIXTURE_OF.items()))
def test_builtin_equals_fixture(name, fixture):
    built_in = mz.get_model(name)
    loaded = mz.load_model(str(HF / fixture))
    assert loaded.num_parameters() == built_in.num_parameters()
    assert loaded.num_active_parameters() == built_in.num_active_parameters()
    assert [loaded.layer_params(i) for i in range(loaded.num_layers)] == [
        built_in.layer_params(i) for i in range(built_in.num_layers)]
    if name in PARAM_COUNTS["models"]:
        assert loaded.num_parameters() == PARAM_COUNTS["models"][name]["total"]


# ---------------------------------------------------------------- published figures
def test_gpt2_exact():
    # HF gpt2 (GPT2LMHeadModel): 124,439,808 parameters (tied lm_head counted once)
    m = mz.load_model(str(HF / "gpt2.json"))
    assert m.num_parameters() == 124_439_808
    assert m.embedding_params() == 50257 * 768 + 1024 * 768
    assert m.output_params() == 2 * 768  # tied head + ln_f (weight, bias)


def test_bloom_exact():
    # BigScience model card (bigscience/bloom): 176,247,271,424 parameters
    assert mz.get_model("bloom-176b").num_parameters() == 176_247_271_424
    assert mz.load_model(str(HF / "bloom.json")).num_parameters() == 176_247_271_424


def test_mixtral_8x7b_active():
    # Mistral AI blog "Mixtral of experts": 46.7B total, 12.9B used per token
    m = mz.get_model("mixtral-8x7b")
    assert m.num_active_parameters() == 12_879_925_248
    assert m.num_active_parameters() == pytest.approx(12.9e9, rel=0.01)


def test_mixtral_8x22b():
    # Mistral AI blog "Cheaper, Better, Faster, Stronger": 141B total, 39B active
    m = mz.get_model("mixtral-8x22b")
    assert m.num_parameters() == pytest.approx(141e9, rel=0.005)
    assert m.num_active_parameters() == pytest.approx(39e9, rel=0.01)


def test_deepseek_v3():
    # DeepSeek-V3 report (arXiv:2412.19437): 671B total, 37B activated; HF checkpoint 685B incl. MTP.
    # README_WEIGHTS.md: main model 671B; MTP module 11.5B unique params (excl. shared embedding/head).
    m = mz.get_model("deepseek-v3")
    # HF DeepseekV3ForCausalLM: e_score_correction_bias (58 x 256) is a buffer, not counted
    assert m.num_parameters() == 671_026_419_200 - 58 * 256
    assert m.num_active_parameters() == pytest.approx(37e9, rel=0.02)
    assert m.num_dense_layers == 3 and m.num_moe_layers == 58
    assert not m.is_moe_layer(2) and m.is_moe_layer(3) and m.is_moe_layer(60)
    assert m.num_mtp_layers == 1
    assert m.mtp_params() == pytest.approx(11.5e9, rel=0.015)
    assert m.num_parameters() + m.mtp_params() + 2 * m.vocab_size * m.hidden_size == pytest.approx(
        685e9, rel=0.005)  # safetensors store the shared embedding/head again in layer 61
    lp = m.layer_params(3)
    assert lp.expert == 256 * 3 * 7168 * 2048 and lp.expert_active == 8 * 3 * 7168 * 2048
    # router weight E*h + e_score_correction_bias E + 2 RMSNorms h + q_a/kv_a layernorms
    assert lp.replicated == 256 * 7168 + 256 + 2 * 7168 + 1536 + 512
    assert m.layer_params(0).expert == 0


def test_qwen_published():
    # Qwen2.5 model cards: 7.61B (non-embedding 6.53B), 72.7B
    q7 = mz.get_model("qwen2.5-7b")
    assert q7.num_parameters() == pytest.approx(7.61e9, abs=0.01e9)  # card truncates 7.6156B
    assert q7.num_parameters() - 2 * q7.vocab_size * q7.hidden_size == pytest.approx(6.53e9, abs=0.005e9)
    assert mz.get_model("qwen2.5-72b").num_parameters() == pytest.approx(72.7e9, abs=0.05e9)
    # Qwen3 model cards: Qwen3-8B 8.2B (non-embedding 6.95B); Qwen3-30B-A3B 30.5B total, 3.3B activated
    q3 = mz.load_model(str(HF / "qwen3-8b.json"))
    assert q3.qk_norm and q3.head_dim == 128
    assert q3.num_parameters() - 2 * q3.vocab_size * q3.hidden_size == pytest.approx(6.95e9, abs=0.005e9)
    q3m = mz.load_model(str(HF / "qwen3-30b-a3b.json"))
    assert q3m.num_parameters() == pytest.approx(30.5e9, abs=0.05e9)
    assert q3m.num_active_parameters() == pytest.approx(3.3e9, abs=0.06e9)
    assert q3m.num_moe_layers == 48
    # Qwen1.5-MoE-A2.7B blog: 14.3B total, 2.7B activated
    qm = mz.load_model(str(HF / "qwen1.5-moe-a2.7b.json"))
    assert qm.num_parameters() == pytest.approx(14.3e9, abs=0.05e9)
    assert qm.num_active_parameters() == pytest.approx(2.7e9, abs=0.05e9)
    lp = qm.layer_params(0)
    h = 2048
    # router h*60 + shared_expert_gate h + 2 RMSNorms; o_proj has no bias
    assert lp.replicated == h * 60 + h + 2 * h
    assert lp.tp_sharded == 4 * h * h + 3 * h + 3 * h * 5632  # q,k,v,o + qkv bias + shared expert


def test_qwen2_moe_sparse_step_and_mlp_only_layers():
    cfg = json.loads((HF / "qwen1.5-moe-a2.7b.json").read_text())
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[3])
    m = mz.from_hf_config(cfg)
    # HF Qwen2MoeDecoderLayer: MoE iff i not in mlp_only_layers and (i + 1) % step == 0
    expected = [(i not in (3,)) and (i + 1) % 2 == 0 for i in range(24)]
    assert [m.is_moe_layer(i) for i in range(24)] == expected
    assert m.layer_params(0).expert == 0 and m.layer_params(1).expert > 0


def test_sc21_gpt_table1():
    # SC21 Table 1 parameter counts (billions) for the weak-scaling GPT models
    table = {"gpt-1.7b": 1.7, "gpt-3.6b": 3.6, "gpt-7.5b": 7.5, "gpt-18b": 18.4, "gpt-39b": 39.1,
             "gpt-76b": 76.1, "gpt-145b": 145.6, "gpt-310b": 310.1, "gpt-530b": 529.6, "gpt-1t": 1008.0}
    for name, billions in table.items():
        m = mz.get_model(name)
        assert m.num_parameters() / 1e9 == pytest.approx(billions, abs=0.051), name
        # SC21 eq. 2: 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), plus the final LayerNorm (2h)
        l, h = m.num_layers, m.hidden_size
        assert m.num_parameters() == 12 * l * h * h + 13 * l * h + (m.vocab_size + 2048) * h + 2 * h


def test_gpt3_175b():
    # Brown et al. 2020 Table 2.1: 175.0B
    m = mz.get_model("gpt3-175b")
    assert m.num_parameters() == pytest.approx(175e9, rel=0.005)
    assert m.padded_vocab_size(tp=8) == 51200


def test_llama_405b_and_nemotron():
    # Meta: Llama 3.1 405B; Nemotron-4 340B report: 9.4B embedding + 331.6B non-embedding
    assert mz.get_model("llama3.1-405b").num_parameters() == pytest.approx(405e9, rel=0.005)
    n = mz.get_model("nemotron-4-340b")
    emb = n.embedding_params() + n.vocab_size * n.hidden_size
    assert emb == pytest.approx(9.4e9, abs=0.05e9)
    assert n.num_parameters() - emb == pytest.approx(331.6e9, abs=0.05e9)


def test_nemotron_fixture():
    m = mz.load_model(str(HF / "minitron-4b.json"))
    assert (m.activation, m.gated_mlp, m.normalization, m.head_dim) == ("relu2", False, "layernorm", 128)
    h, f = 3072, 9216
    lp = m.layer_params(0)
    assert lp.tp_sharded == h * 24 * 128 * 2 + 2 * h * 8 * 128 + 2 * h * f
    assert lp.replicated == 2 * 2 * h  # two LayerNorm1P with weight and bias
    assert m.num_parameters() == pytest.approx(4.19e9, abs=0.01e9)


# ---------------------------------------------------------------- structure / splits
def test_layer_params_split_llama():
    m = mz.get_model("llama3.1-8b")
    lp = m.layer_params(0)
    h, f, g, d = 4096, 14336, 8, 128
    assert lp == LayerParams(tp_sharded=2 * h * h + 2 * h * g * d + 3 * h * f, replicated=2 * h)
    assert lp.total == lp.active
    assert m.output_params() == m.vocab_size * h + h
    assert m.num_moe_layers == 0 and m.num_dense_layers == 32
    with pytest.raises(IndexError):
        m.layer_params(32)


def test_gpt_bias_split():
    m = mz.load_model(str(HF / "gpt2.json"))
    h = 768
    lp = m.layer_params(0)
    # column-parallel biases (qkv 3h, fc1 4h) sharded; row-parallel biases (attn proj h, fc2 h) replicated
    assert lp.tp_sharded == 12 * h * h + 3 * h + 4 * h
    assert lp.replicated == 4 * h + 2 * h


def test_mixtral_split():
    m = mz.get_model("mixtral-8x7b")
    lp = m.layer_params(5)
    assert lp.replicated == 2 * 4096 + 8 * 4096  # norms + router (no bias)
    assert lp.expert == 8 * 3 * 4096 * 14336 and lp.expert_active == 2 * 3 * 4096 * 14336


def test_padded_vocab():
    assert mz.get_model("llama2-7b").padded_vocab_size(tp=8) == 32768
    assert mz.get_model("llama2-7b").padded_vocab_size(tp=1) == 32000
    assert mz.load_model(str(HF / "gpt2.json")).padded_vocab_size(tp=1) == 50304
    assert mz.get_model("llama3.1-8b").padded_vocab_size(tp=8) == 129024
    assert mz.get_model("gpt-1.7b").padded_vocab_size(tp=4, make_vocab_size_divisible_by=128) == 51200


def test_zoo_listing_and_sources():
    names = mz.list_models()
    assert mz.DEFAULT_MODEL == "llama3.1-8b" and mz.DEFAULT_MODEL in names
    for required in ["gpt-1.7b", "gpt-1t", "gpt3-175b", "bloom-176b", "llama2-7b", "llama3.1-405b",
                     "mixtral-8x22b", "qwen2.5-72b", "nemotron-4-340b", "deepseek-v3"]:
        assert required in names
    for n in names:
        m = mz.get_model(n)
        assert m.name == n and m.source
        assert m.num_parameters() > 0
    assert mz.load_model("llama3.1-8b") == mz.get_model("llama3.1-8b")


def test_yaml_roundtrip(tmp_path):
    import yaml

    m = mz.get_model("deepseek-v3")
    p = tmp_path / "my-model.yaml"
    p.write_text(yaml.safe_dump(m.model_dump(mode="json")))
    assert mz.load_model(str(p)) == m
    q = tmp_path / "tiny.yaml"
    q.write_text("source: test\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nnum_kv_heads: 2\n"
                 "head_dim: 16\nffn_hidden_size: 128\ngated_mlp: true\nvocab_size: 100\n")
    t = mz.load_model(str(q))
    assert t.name == "tiny"
    assert t.num_parameters() == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 128) + 2 * 100 * 64 + 64


# ---------------------------------------------------------------- errors
def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_unknown_name_suggests():
    with pytest.raises(ModelSpecError) as e:
        mz.load_model("lama2-7b")
    msg = _one_line(e)
    assert "unknown model 'lama2-7b'" in msg and "did you mean" in msg and "llama2-7b" in msg
    with pytest.raises(ModelSpecError):
        mz.get_model("nonexistent-thing-xyz")


def test_missing_field(tmp_path):
    cfg = json.loads((HF / "llama2-70b.json").read_text())
    del cfg["num_attention_heads"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert _one_line(e) == "config.json: field 'num_attention_heads' missing"


def test_hidden_act_of_a_gated_mlp_is_read(tmp_path):
    """HF LlamaMLP computes down(ACT2FN[hidden_act](gate(x)) * up(x)): "gelu" is GeGLU, not SwiGLU. The loader read
    every Llama-family config as SwiGLU, so Megatron's launch carried --swiglu for another model; the emitters now
    refuse GeGLU by name (Megatron-LM's gated MLP flag is --swiglu only) and an unknown activation is an input error."""
    from cost_models.config import ParallelConfig, TrainingJob
    from planner.emit import EmitError, megatron_args

    assert mz.load_model(str(HF / "llama3.1-8b.json")).activation == "swiglu"
    cfg = json.loads((HF / "llama3.1-8b.json").read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**cfg, "hidden_act": "gelu_pytorch_tanh"}))
    m = mz.load_model(str(p))
    assert (m.activation, m.gated_mlp) == ("geglu", True)
    with pytest.raises(EmitError, match="activation 'geglu'"):
        megatron_args(m, TrainingJob(global_batch_size=8), ParallelConfig(dp=8))
    p.write_text(json.dumps({**cfg, "hidden_act": "mish"}))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert _one_line(e).startswith("config.json: field 'hidden_act': 'mish' is not supported; supported: silu")


def test_model_name_is_one_printable_line(tmp_path):
    """A model YAML named "evil\necho INJECTED" reached the launch scripts' header comment unescaped: the second line
    ran as a command under bash (and broke the k8s manifest). Names are one line of printable characters."""
    import yaml
    spec = yaml.safe_load(mz.get_model("llama3.1-8b").model_dump_json())
    p = tmp_path / "evil.yaml"
    for bad in ("evil\necho INJECTED", "tab\tname", "   "):
        p.write_text(yaml.safe_dump({**spec, "name": bad}))
        with pytest.raises(ModelSpecError) as e:
            mz.load_model(str(p))
        assert "must be one line of printable characters" in _one_line(e)


def test_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    msg = _one_line(e)
    assert "config.json" in msg and "line 3" in msg


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("num_layers: 2\nhidden_size: [64\n")
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    msg = _one_line(e)
    assert "bad.yaml" in msg and "line" in msg


def test_unsupported_model_type(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    msg = _one_line(e)
    assert "mamba" in msg and "llama" in msg and "deepseek_v3" in msg


def test_validation_errors_are_one_line(tmp_path):
    cfg = json.loads((HF / "llama2-70b.json").read_text())
    cfg["num_key_value_heads"] = 7
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    msg = _one_line(e)
    assert "config.json" in msg and "num_attention_heads" in msg and "num_kv_heads" in msg

    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    cfg["num_experts_per_tok"] = 9
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert "top_k" in _one_line(e)

    y = tmp_path / "m.yaml"
    y.write_text("source: x\nnum_layers: -1\nhidden_size: 64\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
                 "head_dim: 16\nffn_hidden_size: 128\ngated_mlp: true\nvocab_size: 100\n")
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(y))
    msg = _one_line(e)
    assert "m.yaml" in msg and "'num_layers'" in msg

    cfg = json.loads((HF / "llama2-70b.json").read_text())
    cfg["hidden_size"] = "big"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert "'hidden_size'" in _one_line(e)


def test_missing_file():
    with pytest.raises(ModelSpecError) as e:
        mz.load_model("/nonexistent/config.json")
    assert "no such file" in _one_line(e)


def test_direct_validation():
    with pytest.raises(Exception):
        ModelSpec(name="x", source="y", num_layers=1, hidden_size=8, num_attention_heads=3, num_kv_heads=2,
                  head_dim=2, ffn_hidden_size=8, gated_mlp=True, vocab_size=10)


# ---------------------------------------------------------------- properties
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 6), heads=st.sampled_from([4, 8]), groups=st.sampled_from([1, 2, 4]),
    d=st.sampled_from([8, 16]), f=st.integers(8, 64), vocab=st.integers(10, 500),
    experts=st.integers(0, 8), k=st.integers(1, 8), first_k=st.integers(0, 3), freq=st.integers(1, 3),
    tied=st.booleans(), gated=st.booleans(), tp=st.integers(1, 8),
)
def test_counting_invariants(layers, heads, groups, d, f, vocab, experts, k, first_k, freq, tied, gated, tp):
    moe = None
    if experts:
        moe = dict(num_experts=experts, top_k=min(k, experts), expert_ffn_hidden_size=f,
                   first_k_dense_layers=min(first_k, layers), moe_layer_freq=freq)
    m = ModelSpec(name="p", source="hypothesis", num_layers=layers, hidden_size=heads * d,
                  num_attention_heads=heads, num_kv_heads=groups, head_dim=d, ffn_hidden_size=f,
                  gated_mlp=gated, vocab_size=vocab, tie_word_embeddings=tied, moe=moe)
    total = m.embedding_params() + sum(m.layer_params(i).total for i in range(layers)) + m.output_params()
    assert m.num_parameters() == total
    assert m.num_active_parameters() <= m.num_parameters()
    assert m.num_moe_layers + m.num_dense_layers == layers
    if moe is None or moe["top_k"] == experts:
        assert m.num_active_parameters() == m.num_parameters()
    pv = m.padded_vocab_size(tp)
    assert pv >= vocab and pv % (128 * tp) == 0 and pv - vocab < 128 * tp


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", 0, "field 'num_attention_heads' = 0 is outside [1, 16000] (one to 100x the 160 heads of GPT-1T"),
    ("hidden_size", "4096", "field 'hidden_size' must be an integer, got '4096'"),
    ("rope_theta", "abc", "field 'rope_theta' must be a number, got 'abc'"),
    ("rms_norm_eps", float("inf"), "field 'rms_norm_eps' = inf is outside [1e-12, 0.1] (published ones are 1e-6 to 1e-5)"),
    ("tie_word_embeddings", "yes", "field 'tie_word_embeddings' must be true or false, got 'yes'"),
    ("model_type", ["llama"], "unsupported model_type ['llama']"),
    ("rope_scaling", {"rope_type": "llama3", "factor": "eight"},
     "field 'rope_scaling.factor' must be a number, got 'eight'"),
    ("rope_scaling", "llama3", "field 'rope_scaling' must be an object or null"),
])
def test_impossible_hf_values_are_one_line_errors(tmp_path, field, value, needle):
    # a new user's malformed config.json: one line naming the field, never a traceback (ZeroDivisionError,
    # float('abc'), an infinite epsilon reaching the emitters, an unhashable model_type)
    cfg = json.loads((Path(__file__).parent / "data" / "hf_configs" / "llama3.1-8b.json").read_text())
    cfg[field] = value
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert needle in _one_line(e)


def test_depth_is_capped_with_a_one_line_error(tmp_path):
    # 100,000 layers made the planner run for minutes (breaker pass): refused at load, naming the field and bound
    cfg = json.loads((Path(__file__).parent / "data" / "hf_configs" / "llama3.1-8b.json").read_text())
    cfg["num_hidden_layers"] = 100_000
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert "field 'num_hidden_layers' = 100000 is outside [1, 4096]" in _one_line(e)


def test_sliding_window_attention_is_read_and_refused_at_launch():
    # HF MistralAttention windows every layer when sliding_window is set (Mistral-7B-v0.1: 4096); Qwen2Config only
    # with use_sliding_window, from max_window_layers on. A launch without the window trains another model.
    from planner.emit.megatron import unexpressed_features
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    assert mz.from_hf_config(cfg).layer_types is None  # sliding_window null
    mistral = {**cfg, "model_type": "mistral", "sliding_window": 4096}
    mistral.pop("num_local_experts")
    m = mz.from_hf_config(mistral)
    assert m.layer_types == ("sliding_attention",) * 32 and m.sliding_window == 4096
    assert "sliding_attention (window 4096 tokens)" in unexpressed_features(m)
    qwen = json.loads((HF / "qwen2.5-7b.json").read_text())
    assert qwen["use_sliding_window"] is False and mz.from_hf_config(qwen).layer_types is None
    q = mz.from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": 20})
    assert q.layer_types == ("full_attention",) * 20 + ("sliding_attention",) * 8
    assert q.sliding_window == qwen["sliding_window"]
    with pytest.raises(ModelSpecError) as e:
        mz.from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": -3})
    assert "field 'max_window_layers' = -3 must be >= 0" in _one_line(e)
    with pytest.raises(ModelSpecError) as e:
        mz.from_hf_config({**mistral, "sliding_window": 10**19})
    assert "field 'sliding_window' = 1.00000e+19 is outside [1, 1073741824]" in _one_line(e)


@pytest.mark.parametrize("field", ["num_layers", "head_dim", "sliding_window", "rope_theta"])
def test_model_yaml_refuses_a_boolean_for_a_number(tmp_path, field):
    """YAML ``true`` is a boolean, not the integer 1 (pydantic's lax mode would read it as 1); the JSON path's
    translators refuse it as well."""
    import yaml
    data = mz.get_model("llama3.1-8b").model_dump(mode="json", exclude_none=True)
    data[field] = True
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ModelSpecError) as e:
        mz.load_model(str(p))
    assert f"field '{field}' = true is not a number" in _one_line(e)


def test_router_aux_loss_coefficient_is_read_and_emitted():
    # HF router_aux_loss_coef (Mixtral-8x7B 0.02, Qwen MoE 0.001); Megatron-LM's --moe-aux-loss-coeff defaults to 0,
    # which would train without the model's load-balancing loss
    from planner.emit.megatron import router_args
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    m = mz.from_hf_config(cfg)
    assert m.moe.aux_loss_coeff == 0.02 == mz.get_model("mixtral-8x7b").moe.aux_loss_coeff
    args = router_args(m)
    assert args[args.index("--moe-aux-loss-coeff") + 1] == "0.02"
    assert mz.from_hf_config(json.loads((HF / "qwen3-30b-a3b.json").read_text())).moe.aux_loss_coeff == 0.001
    assert "--moe-aux-loss-coeff" not in router_args(mz.from_hf_config({**cfg, "router_aux_loss_coef": 0.0}))
    with pytest.raises(ModelSpecError, match="aux_loss_coeff"):
        mz.from_hf_config({**cfg, "router_aux_loss_coef": "lots"})
