"""FLOP counts against the published formulas and the FLOPs per token that published runs imply."""
from __future__ import annotations

import pytest

from cost_models.flops import (attention_core_flops_per_token, layer_gemm_flops_per_token, layer_gemm_shapes,
                               model_flops_per_token, model_flops_per_token_variant)
from model_zoo import get_model


def test_n21_eq3_for_gpt3_175b():
    # Narayanan et al. SC21 eq. (3): F = 96 B s l h^2 (1 + s/6h + V/16lh) per B*s tokens (full recompute)
    m = get_model("gpt3-175b")
    l, h, s, v = m.num_layers, m.hidden_size, 2048, m.vocab_size
    eq3 = 96 * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    got = model_flops_per_token_variant(m, s, "n21_hardware", "full")
    assert got == pytest.approx(eq3, rel=2e-4)  # biases (not in eq. 3) are the only difference
    # without recompute: the derived 72-form (formulas.md Sec. 3.1)
    eq72 = 72 * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_token_variant(m, s, "full_attention") == pytest.approx(eq72, rel=2e-4)


def test_conventions_match_what_published_runs_imply():
    # Llama 3 8B at 8k tokens. NeMo 24.07 (H100, FP8): 697 TFLOP/s at 12036 tokens/s/GPU -> 57.9 GFLOP/token, the
    # full-attention count; Megatron-Bridge 25.11 (H100): 744 TFLOP/s at 14451 tokens/s/GPU -> 51.5 GFLOP/token,
    # Megatron's causal-halved count (published_runs.yaml rows nemo-2407-h100-llama3-8b-fp8-8 and
    # bridge-2511-h100-llama3-8b-fp8cs-8).
    m = get_model("llama3.1-8b")
    assert model_flops_per_token_variant(m, 8192, "full_attention") == pytest.approx(697e12 / 12036, rel=0.005)
    assert model_flops_per_token_variant(m, 8192, "causal") == pytest.approx(744e12 / 14451, rel=0.005)
    assert model_flops_per_token(m, 8192, "megatron") == model_flops_per_token_variant(m, 8192, "causal")


def test_palm_counts_full_attention_and_megatron_halves_it():
    m = get_model("llama3.1-8b")
    for s in (2048, 131072):
        diff = model_flops_per_token(m, s, "palm") - model_flops_per_token(m, s, "megatron")
        # PaLM 12*L*H*Q*T vs Megatron's causal 6*L*H*Q*T; PaLM's 6N also counts the norm weights (6 x 65 x 4096)
        attn_half = 6.0 * m.num_layers * s * m.num_attention_heads * m.head_dim
        norms = 6.0 * (2 * m.num_layers + 1) * m.hidden_size
        assert diff == pytest.approx(attn_half + norms, rel=1e-9)


def test_attention_core_flops():
    m = get_model("llama3.1-8b")  # 32 heads x 128
    assert attention_core_flops_per_token(m, 4096, causal_halved=False) == 2 * 4096 * (4096 + 4096)
    assert attention_core_flops_per_token(m, 4096, causal_halved=True) == 4096 * (4096 + 4096)


@pytest.mark.parametrize("name", ["llama3.1-8b", "deepseek-v3", "mixtral-8x7b", "llama3.1-405b"])
def test_gemm_shapes_add_up_to_the_layer_flops(name):
    m = get_model(name)
    for i in {0, m.num_layers - 1}:
        shapes = layer_gemm_shapes(m, i)
        assert sum(2 * k * n * share * c for k, n, share, _, c in shapes) == pytest.approx(
            layer_gemm_flops_per_token(m, i), rel=1e-9)


def test_deepseek_v3_active_flops():
    # DeepSeek-V3: 37B activated parameters (arXiv:2412.19437 abstract); 6N per token is ~2.2e11 (+attention)
    m = get_model("deepseek-v3")
    f = model_flops_per_token(m, 4096, "megatron")
    assert 6 * 30e9 < f < 6 * 45e9


def test_unknown_convention_is_rejected():
    with pytest.raises(ValueError, match="convention must be one of"):
        model_flops_per_token_variant(get_model("llama3.1-8b"), 4096, "bogus")


def megatron_logger_flops_per_token(m, s):
    """Megatron-LM ``num_floating_point_operations`` (``megatron/training/training.py`` at d48bd6be,
    ``transformer_flops``) per token, transcribed for a GQA model with swiglu MoE layers (no shared experts, no MLA):
    3 x 2 x [h x (dense FFN x 3 x dense layers + moe_ffn x top_k x 3 x MoE layers) + attention projections x layers
    + MTP norms/projection + logits x (1 + MTP)] + the causal core. No router GEMM."""
    h, a, g, d = m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim
    moe_layers = sum(1 for i in range(m.num_layers) if m.is_moe_layer(i))
    dense_layers = m.num_layers - moe_layers
    q, kv = d * a, d * g
    attn = 3 * 2 * (h * (q + 2 * kv) + q * h)
    core = 3 * 2 * q / 2 * 2
    ffn = h * (m.ffn_hidden_size * 3 * dense_layers + m.moe.expert_ffn_hidden_size * m.moe.top_k * 3 * moe_layers)
    return 3 * 2 * ffn + attn * m.num_layers + 3 * 2 * h * m.vocab_size + s * core * m.num_layers


def test_megatron_convention_is_megatron_loggers_count():
    # Qwen3-30B-A3B (48 MoE layers, GQA 32/4 x 128, 128 experts top-8 x 768): the router GEMM (h x E) is not in
    # Megatron-LM's count (nor Megatron-Bridge's flop_utils.py): the megatron convention leaves it out
    m = get_model("qwen3-30b-a3b")
    assert model_flops_per_token(m, 4096, "megatron") == pytest.approx(megatron_logger_flops_per_token(m, 4096),
                                                                       rel=1e-12)
    # the hardware count keeps it (3 x 2 x h x E per MoE layer and token)
    from cost_models.config import ParallelConfig, TrainingJob
    from cost_models.flops import step_hardware_flops, step_model_flops
    job = TrainingJob(global_batch_size=8, seq_length=4096)
    extra = step_hardware_flops(m, job, ParallelConfig(dp=8)) - step_model_flops(m, job)
    assert extra == pytest.approx(3 * 2 * 2048 * 128 * 48 * job.tokens_per_step, rel=1e-9)


def test_megatron_counts_the_mtp_module():
    # Megatron-LM counts each MTP module as one more layer of the last layer's kind (attention included), plus
    # 3 x 2 x (3h + 2h^2) for its norms and eh_proj, plus one more pass through the output head
    from cost_models.flops import attention_core_flops_per_token, logits_flops_per_token
    m = get_model("deepseek-v3")
    assert m.num_mtp_layers == 1
    without = m.model_copy(update={"num_mtp_layers": 0})
    h, last = m.hidden_size, m.num_layers - 1
    layer = layer_gemm_flops_per_token(m, last, router=False) + attention_core_flops_per_token(m, 4096, True)
    mtp = 3 * (layer + 2 * (3 * h + 2 * h * h) + logits_flops_per_token(m))
    assert model_flops_per_token(m, 4096, "megatron") - model_flops_per_token(without, 4096, "megatron") == \
        pytest.approx(mtp, rel=1e-12)
    # ~4% of DeepSeek-V3's count at 4k (a MoE layer of 61 plus a second pass through the 129k-token head): what
    # Megatron's logged TFLOP/s includes and plan3d's megatron convention left out before 2026-12
    assert 0.035 < mtp / model_flops_per_token(without, 4096, "megatron") < 0.045
