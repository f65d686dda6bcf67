"""Floating-point operations of a training step (FLOPs, multiply-add = 2 FLOPs).

* GEMM FLOPs: ``2 x tokens x weight elements`` per forward (Narayanan et al. SC21, Sec. 5.1 / eq. 3 counting),
  backward = 2 x forward, so training = 3 x forward.
* Attention core: ``QK^T`` and ``score x V`` cost ``2*s*(a*d_qk) + 2*s*(a*d_v)`` FLOPs per token per layer
  forward; causal masking halves it in Megatron-LM's count (``num_floating_point_operations`` in
  ``megatron/training/training.py``, formulas.md Sec. 3.2), not in PaLM's (Chowdhery et al. 2022, App. B:
  ``6N + 12*L*H*Q*T`` per token, formulas.md Sec. 3.3) or torchtitan's.
* Recompute adds hardware FLOPs (HFU, PaLM App. B): full recompute one more forward of every recomputed
  layer; selective recompute re-runs the attention core only (K22 Sec. 5).
"""
from __future__ import annotations

from model_zoo.spec import ModelSpec

from .config import FlopsConvention, ParallelConfig, TrainingJob


def attention_widths(model: ModelSpec) -> tuple[int, int]:
    """(query/key width ``a*d_qk``, value width ``a*d_v``) of the attention core."""
    a = model.num_attention_heads
    if model.mla is not None:
        return a * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim), a * model.mla.v_head_dim
    return a * model.head_dim, a * model.head_dim


def layer_gemm_flops_per_token(model: ModelSpec, layer: int) -> float:
    """Forward GEMM FLOPs per token of decoder layer ``layer``: 2 x (matrix weights a token passes through).

    Norm weights and biases are excluded (element-wise, not GEMMs); the router GEMM is included.
    """
    lp = model.layer_params(layer)
    # replicated params are norms/biases/router; count only the router (h x E) as GEMM work
    router = 0
    if model.moe is not None and model.is_moe_layer(layer):
        router = model.hidden_size * model.moe.num_experts
    return 2.0 * (lp.tp_sharded + lp.expert_active + router)


def attention_core_flops_per_token(model: ModelSpec, seq_length: int, causal_halved: bool) -> float:
    """Forward FLOPs per token of ``QK^T`` and ``score x V`` for one layer (sequence ``seq_length``)."""
    qk, v = attention_widths(model)
    f = 2.0 * seq_length * (qk + v)
    return f / 2 if causal_halved else f


def logits_flops_per_token(model: ModelSpec, vocab: int | None = None) -> float:
    """Forward FLOPs per token of the output layer: ``2*h*V``."""
    return 2.0 * model.hidden_size * (vocab or model.vocab_size)


def model_flops_per_token(model: ModelSpec, seq_length: int, convention: FlopsConvention = "megatron") -> float:
    """Training (forward + backward) model FLOPs per token, no recompute.

    ``megatron``: 3 x (GEMMs + causal-halved attention core + logits) — Megatron-LM's reported TFLOP/s.
    ``palm``: ``6*N + 6*L*H*(d_qk + d_v)*T`` with N the active parameters minus the input embedding
    (PaLM App. B; torchtitan's ``get_dense_model_nparams_and_flops``, formulas.md Sec. 3.5).
    """
    if convention == "palm":
        n = model.num_active_parameters() - model.embedding_params()
        if model.tie_word_embeddings:
            n += model.vocab_size * model.hidden_size
        qk, v = attention_widths(model)
        return 6.0 * n + 6.0 * model.num_layers * seq_length * (qk + v)
    fwd = sum(layer_gemm_flops_per_token(model, i) for i in range(model.num_layers))
    fwd += model.num_layers * attention_core_flops_per_token(model, seq_length, causal_halved=True)
    fwd += logits_flops_per_token(model)
    return 3.0 * fwd


def recompute_flops_per_token(model: ModelSpec, seq_length: int, par: ParallelConfig) -> float:
    """Extra forward FLOPs per token that recomputation executes (hardware, not model FLOPs)."""
    if par.recompute == "none":
        return 0.0
    attn = attention_core_flops_per_token(model, seq_length, causal_halved=True)
    if par.recompute == "selective":
        return model.num_layers * attn
    n = model.num_layers
    if par.recompute_num_layers is not None:
        n = min(model.num_layers, par.recompute_num_layers * par.pp)
    per_layer = sum(layer_gemm_flops_per_token(model, i) for i in range(model.num_layers)) / model.num_layers
    return n * (per_layer + attn)


def step_model_flops(model: ModelSpec, job: TrainingJob, convention: FlopsConvention = "megatron") -> float:
    """Model FLOPs of one optimizer step (all GPUs)."""
    return model_flops_per_token(model, job.seq_length, convention) * job.tokens_per_step


def step_hardware_flops(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Hardware FLOPs of one step (Megatron counting plus recompute)."""
    return (model_flops_per_token(model, job.seq_length, "megatron")
            + recompute_flops_per_token(model, job.seq_length, par)) * job.tokens_per_step
