"""Floating-point operations of a training step (FLOPs, multiply-add = 2 FLOPs).

* GEMM FLOPs: ``2 x tokens x weight elements`` per forward (Narayanan et al. SC21, Sec. 5.1 / eq. 3 counting),
  backward = 2 x forward, so training = 3 x forward.
* Attention core: ``QK^T`` and ``score x V`` cost ``2*s*(a*d_qk) + 2*s*(a*d_v)`` FLOPs per token per layer
  forward; causal masking halves it in Megatron-LM's count (``num_floating_point_operations`` in
  ``megatron/training/training.py``, formulas.md Sec. 3.2), not in PaLM's (Chowdhery et al. 2022, App. B:
  ``6N + 12*L*H*Q*T`` per token, formulas.md Sec. 3.3) or torchtitan's. A sliding-window layer (gpt-oss, Mistral)
  is counted over its window in the causal count, as Megatron-Bridge counts it (``flop_utils.py``, commit
  067f987df); Megatron-LM's own logger (commit d48bd6be) counts such layers as full causal attention.
* Recompute adds hardware FLOPs (HFU, PaLM App. B): full recompute one more forward of every recomputed
  layer; selective recompute re-runs the attention core only (K22 Sec. 5).
"""
from __future__ import annotations

from collections.abc import Iterable

from model_zoo.spec import ModelSpec

from .config import FlopsConvention, ParallelConfig, TrainingJob
from .layout import parse_pipeline_layout, stage_layer_ranges


def attention_widths(model: ModelSpec) -> tuple[int, int]:
    """(query/key width ``a*d_qk``, value width ``a*d_v``) of the attention core."""
    a = model.num_attention_heads
    if model.mla is not None:
        return a * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim), a * model.mla.v_head_dim
    return a * model.head_dim, a * model.head_dim


def layer_gemm_flops_per_token(model: ModelSpec, layer: int, router: bool = True) -> float:
    """Forward GEMM FLOPs per token of decoder layer ``layer``: 2 x (matrix weights a token passes through).

    Norm weights and biases are excluded (element-wise, not GEMMs); the router GEMM (``h x E``) is included unless
    ``router`` is False (the model-FLOP count of Megatron's loggers leaves it out: ``model_flops_per_token``).
    """
    lp = model.layer_params(layer)
    return 2.0 * (lp.tp_sharded + lp.expert_active) + (router_flops_per_token(model, layer) if router else 0.0)


def router_flops_per_token(model: ModelSpec, layer: int) -> float:
    """Forward FLOPs per token of a MoE layer's router GEMM, ``2*h*E``; 0 for a dense layer. (The router is
    replicated: ``layer_params`` counts its weights with the norms and biases, not as sharded GEMM weights.)"""
    if model.moe is None or not model.is_moe_layer(layer):
        return 0.0
    return 2.0 * model.hidden_size * model.moe.num_experts


def attention_core_flops_per_token(model: ModelSpec, seq_length: int, causal_halved: bool,
                                   window: int | None = None) -> float:
    """Forward FLOPs per token of ``QK^T`` and ``score x V`` for one layer (sequence ``seq_length``):
    ``2 x context x (a*d_qk + a*d_v)`` with ``context`` the keys a query is counted against: ``s`` (full matrix),
    ``s/2`` (causal, Megatron-LM's count), or for a causal sliding window of ``window`` keys shorter than the
    sequence the exact mean ``w - w(w-1)/(2s)`` (``sum_i min(i, w) / s``; Megatron-Bridge ``flop_utils.py``
    ``calculate_swa_context``, commit 067f987df). The window applies only with ``causal_halved`` (an unmasked count
    is the full matrix)."""
    qk, v = attention_widths(model)
    if not causal_halved:
        context = float(seq_length)
    elif window is not None and window < seq_length:
        context = window - window * (window - 1) / (2.0 * seq_length)
    else:
        context = seq_length / 2.0
    return 2.0 * context * (qk + v)


def attention_core_flops_all_layers(model: ModelSpec, seq_length: int, layers: Iterable[int] | None = None) -> float:
    """Causal attention-core forward FLOPs per token summed over ``layers`` (default: all), each at its own
    attention window (``attention_core_flops_per_token``)."""
    return sum(n * attention_core_flops_per_token(model, seq_length, True, model.attention_window(i))
               for i, n in model.layer_kinds(layers))


def logits_flops_per_token(model: ModelSpec, vocab: int | None = None) -> float:
    """Forward FLOPs per token of the output layer: ``2*h*V``."""
    return 2.0 * model.hidden_size * (vocab or model.vocab_size)


def model_flops_per_token(model: ModelSpec, seq_length: int, convention: FlopsConvention = "megatron") -> float:
    """Training (forward + backward) model FLOPs per token, no recompute.

    ``megatron``: 3 x (GEMMs + causal-halved attention core + logits + MTP modules, ``mtp_flops_per_token``) —
    Megatron-LM's reported TFLOP/s. The MoE
    router GEMM is not counted, as neither Megatron-LM's ``num_floating_point_operations``
    (``megatron/training/training.py`` at d48bd6be: dense and routed / shared expert FFNs, attention, MTP, logits)
    nor Megatron-Bridge's ``flop_utils.py`` (commit 067f987d) counts it; the hardware count
    (``step_hardware_flops``) and the step time do.
    ``palm``: ``6*N + 6*L*H*(d_qk + d_v)*T`` with N the active parameters minus the input embedding
    (PaLM App. B; torchtitan's ``get_dense_model_nparams_and_flops``, formulas.md Sec. 3.5).
    """
    if convention == "palm":
        n = model.num_active_parameters() - model.embedding_params()
        if model.tie_word_embeddings:
            n += model.vocab_size * model.hidden_size
        qk, v = attention_widths(model)
        return 6.0 * n + 6.0 * model.num_layers * seq_length * (qk + v)
    # per kind: O(1) in depth
    fwd = sum(n * layer_gemm_flops_per_token(model, i, router=False) for i, n in model.layer_kinds())
    fwd += attention_core_flops_all_layers(model, seq_length)
    fwd += logits_flops_per_token(model)
    return 3.0 * (fwd + mtp_flops_per_token(model, seq_length))


def mtp_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Forward model FLOPs per token of the multi-token-prediction modules (DeepSeek-V3 Sec. 2.2), as Megatron-LM
    counts them (``num_floating_point_operations`` at d48bd6be: each MTP module one more layer of the last layer's
    kind, attention included, plus ``2*(3h + 2h^2)`` for its norms and ``eh_proj``, plus one more pass through the
    shared output head); 0 without MTP. The layer's GEMMs come from ``mtp_layer_params`` (the last layer's, with
    ``eh_proj``), router excluded as in ``model_flops_per_token``."""
    k = model.num_mtp_layers
    if not k:
        return 0.0
    last = model.num_layers - 1
    mp = model.mtp_layer_params()
    per_module = (2.0 * (mp.tp_sharded + mp.expert_active) + 2.0 * 3 * model.hidden_size
                  + attention_core_flops_per_token(model, seq_length, True, model.attention_window(last))
                  + logits_flops_per_token(model))
    return k * per_module


def recomputed_layers(model: ModelSpec, par: ParallelConfig) -> list[int]:
    """Global indices of the decoder layers that full recompute re-runs in backward (empty unless
    ``par.recompute == 'full'``).

    ``recompute_num_layers`` None: every layer. Otherwise Megatron's ``--recompute-method block``: the first
    ``recompute_num_layers`` layers of each model chunk (each pipeline stage, or each virtual stage under the
    interleaved schedule) are checkpointed and the rest keep their activations (megatron-core 0.16.1
    ``transformer/transformer_block.py`` ``TransformerBlock._checkpointed_forward``, method ``block``: ``layer_idx <
    recompute_num_layers`` over ``num_layers_per_pipeline_rank = len(self.layers)``, the chunk's layers). The chunks
    follow ``step_time.estimate_step``: ``pipeline_layout`` chunks, else each stage's range split evenly by vpp.
    """
    if par.recompute != "full":
        return []
    if par.recompute_num_layers is None or getattr(par, "recompute_method", "block") == "uniform":
        return list(range(model.num_layers))  # uniform: every layer, in groups of N (megatron-core recompute.py)
    v = par.vpp if par.pipeline_schedule == "interleaved" else 1
    if par.pipeline_layout is not None:
        counts = [c.count("t") for c in parse_pipeline_layout(par.pipeline_layout)]
        starts = [sum(counts[:k]) for k in range(len(counts))]
        chunks = [list(range(starts[k], starts[k] + counts[k])) for k in range(len(counts))]
        per_rank = max(1, len(counts) // par.pp)
        if per_rank != v:  # without interleaving a rank runs its chunks back to back as one block
            chunks = [[i for c in range(per_rank) for i in chunks[c * par.pp + r]] for r in range(par.pp)]
    else:
        chunks = []
        for rg in stage_layer_ranges(model.num_layers, par):
            lay = list(rg)
            chunks += [lay[c * len(lay) // v:(c + 1) * len(lay) // v] for c in range(v)]
    return sorted(i for ch in chunks for i in ch[:par.recompute_num_layers])


def recompute_flops_per_token(model: ModelSpec, seq_length: int, par: ParallelConfig) -> float:
    """Extra forward FLOPs per token that recomputation executes (hardware, not model FLOPs): selective, the
    attention core of every layer; full, one more forward (GEMMs + attention core) of each layer in
    ``recomputed_layers`` (the same layers ``step_time`` charges)."""
    if par.recompute == "none":
        return 0.0
    if par.recompute == "selective":
        return attention_core_flops_all_layers(model, seq_length)
    layers = recomputed_layers(model, par)
    return (sum(n * layer_gemm_flops_per_token(model, i) for i, n in model.layer_kinds(layers))
            + attention_core_flops_all_layers(model, seq_length, layers))


def step_model_flops(model: ModelSpec, job: TrainingJob, convention: FlopsConvention = "megatron") -> float:
    """Model FLOPs of one optimizer step (all GPUs)."""
    return model_flops_per_token(model, job.seq_length, convention) * job.tokens_per_step


def padded_expert_flops_per_token(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Training FLOPs per token the routed experts spend on padded slots under drop-and-pad routing (hardware, not
    model FLOPs): the experts' forward GEMMs (``lp.expert_active``: the ``top_k`` routed copies) times
    ``capacity_factor - 1``, 3 passes (4 in layers full recompute re-runs); 0 when dropless."""
    cf = job.moe_expert_capacity_factor
    if not cf or model.moe is None:
        return 0.0
    def fwd(i: int) -> float:
        return 2.0 * model.layer_params(i).expert_active * (cf - 1.0)
    return (3 * sum(n * fwd(i) for i, n in model.layer_kinds())
            + sum(n * fwd(i) for i, n in model.layer_kinds(recomputed_layers(model, par))))


def step_hardware_flops(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Hardware FLOPs of one step (Megatron counting plus the MoE router GEMMs, recompute and drop-and-pad's padded
    expert slots)."""
    return (model_flops_per_token(model, job.seq_length, "megatron")
            + 3.0 * sum(n * router_flops_per_token(model, i) for i, n in model.layer_kinds())
            + recompute_flops_per_token(model, job.seq_length, par)
            + padded_expert_flops_per_token(model, job, par)) * job.tokens_per_step


#: FLOP conventions a published number may use (``model_flops_per_token_variant``).
ROW_FLOP_CONVENTIONS = ("causal", "full_attention", "palm", "n21_hardware", "bloom_hardware")


def model_flops_per_token_variant(model: ModelSpec, seq_length: int, convention: str,
                                  recompute: str = "none") -> float:
    """Training FLOPs per token as a given source counts them (multiply-add = 2 FLOPs).

    * ``causal``: Megatron-LM's current ``num_floating_point_operations`` (causal attention halved; formulas.md
      Sec. 3.2) = ``model_flops_per_token(..., "megatron")``.
    * ``full_attention``: the same with the attention core over the whole ``s x s`` matrix (Megatron-LM before
      April 2025, commit 2bfe9beaae; NeMo 24.07 ``flops_formulas``): 3 x (GEMMs + full attention + logits).
    * ``palm``: PaLM App. B ``6N + 12·L·H·Q·T`` (``model_flops_per_token(..., "palm")``).
    * ``n21_hardware``: Narayanan et al. SC21 eq. (3) ``96·B·s·l·h²(1 + s/6h + V/16lh)`` per ``B·s`` tokens:
      layers (GEMMs + full attention) 4 passes when fully recomputed (3 otherwise), logits 3 passes.
    * ``bloom_hardware``: Megatron-DeepSpeed's logger, the same with the checkpoint factor 4 on the logits too.
    """
    if convention == "causal":
        return model_flops_per_token(model, seq_length, "megatron")
    if convention == "palm":
        return model_flops_per_token(model, seq_length, "palm")
    if convention not in ROW_FLOP_CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(ROW_FLOP_CONVENTIONS)}, got {convention!r}")
    layers = sum(n * layer_gemm_flops_per_token(model, i, router=False) for i, n in model.layer_kinds())
    layers += model.num_layers * attention_core_flops_per_token(model, seq_length, causal_halved=False)
    logits = logits_flops_per_token(model)
    if convention == "full_attention":
        return 3.0 * (layers + logits)
    passes = 4.0 if recompute == "full" else 3.0
    return passes * layers + (passes if convention == "bloom_hardware" else 3.0) * logits


class GemmShape(tuple):
    """One weight GEMM of a layer: ``(k, n, token_share, shard, count)``: input width ``k``, output width ``n``,
    the share of the layer's tokens that pass through it (1, or ``top_k/E`` for one routed expert under balanced
    routing), how tensor parallelism splits it (``"tp"`` on n or k, ``"etp"`` for experts, ``"none"``) and how many
    such GEMMs run (``E`` routed experts). ``2*k*n`` FLOPs per token through it."""

    __slots__ = ()

    def __new__(cls, k: int, n: int, token_share: float = 1.0, shard: str = "tp", count: int = 1):
        return super().__new__(cls, (k, n, token_share, shard, count))


def layer_gemm_shapes(model: ModelSpec, layer: int) -> list[GemmShape]:
    """The weight GEMMs of decoder layer ``layer`` (shapes as Megatron-LM's column/row-parallel linears).

    MHA/GQA: fused QKV ``h x (q + 2·kv)``, output ``q x h``; MLA (DeepSeek-V2/V3): q down/up, kv down/up, output;
    dense MLP ``h x f`` (x2 when gated) and ``f x h``; MoE: router ``h x E`` (replicated), ``E`` routed experts each
    seeing ``top_k/E`` of the tokens, shared experts as a dense MLP of width ``f_sh``.
    """
    h, a = model.hidden_size, model.num_attention_heads
    up = 2 if model.gated_mlp else 1
    out: list[GemmShape] = []
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            out.append(GemmShape(h, a * qk))
        else:
            out += [GemmShape(h, m.q_lora_rank, shard="none"), GemmShape(m.q_lora_rank, a * qk)]
        out += [GemmShape(h, m.kv_lora_rank + m.qk_rope_head_dim, shard="none"),
                GemmShape(m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim)), GemmShape(a * m.v_head_dim, h)]
    else:
        q, kv = a * model.head_dim, model.num_kv_heads * model.head_dim
        out += [GemmShape(h, q + 2 * kv), GemmShape(q, h)]
    if model.moe is not None and model.is_moe_layer(layer):
        moe = model.moe
        e, k, fe = moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size
        out.append(GemmShape(h, e, shard="none"))
        out += [GemmShape(h, up * fe, k / e, "etp", e), GemmShape(fe, h, k / e, "etp", e)]
        if moe.shared_expert_ffn_hidden_size:
            fs = moe.shared_expert_ffn_hidden_size
            out += [GemmShape(h, up * fs), GemmShape(fs, h)]
    else:
        f = model.ffn_hidden_size
        if model.moe is not None and model.moe.dense_ffn_hidden_size:
            f = model.moe.dense_ffn_hidden_size
        out += [GemmShape(h, up * f), GemmShape(f, h)]
    return out
