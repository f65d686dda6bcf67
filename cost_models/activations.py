"""Activation memory of one GPU (bytes): what one decoder layer stores for one micro-batch, by tensor, and how
many micro-batches each pipeline stage holds at its peak (``cost_models/memory.py`` composes them into the
stage peaks).

Activations per layer and micro-batch: Korthikanti et al. 2022 (K22) Sec. 4.1 term by term (formulas.md Sec. 2),
generalised to GQA/MLA projection widths, gated MLPs (SwiGLU's fc1 output is ``2f`` wide), fused attention (no
``5*a*s^2*b`` score term, only the fp32 log-sum-exp ``4*a*s*b``), dropout on/off (1-byte masks), context
parallelism (each rank holds ``s/cp`` tokens), MoE (``top_k`` token copies dispatched and combined, the expert
FFN width, fp32 router logits; the busiest expert-parallel rank holds more than the balanced share under dropless
routing, ``cost_models/moe_imbalance.py``, or exactly a padded capacity factor) and FP8 (GEMM inputs kept in 1-byte FP8 by Transformer Engine).
Recompute: ``selective`` drops what ``recompute_modules`` names (Megatron ``--recompute-modules``; default
``core_attn``, the attention core of K22 / ``--recompute-activations``): ``layernorm`` the 16-bit norm outputs,
``mla_up_proj`` MLA's Q, K, V, ``moe_act`` the expert fc2 inputs, ``mlp`` / ``moe`` / ``shared_experts`` the whole
dense MLP / MoE layer / shared experts (checkpointed: only their input stays; megatron-core ``transformer_config.py``
``recompute_modules``: output-discarding for moe_act, layernorm, mla_up_proj, normal checkpointing otherwise); for
``torchtitan``, follows its per-op SAC policy (every second matmul output recomputed; torchtitan
``torchtitan/distributed/activation_checkpoint.py`` ``_get_custom_policy``); ``full`` keeps only the layer input
(K22 Table 2) for ``recompute_num_layers`` layers (Megatron ``--recompute-method block``; ``uniform`` keeps one
input per group of ``recompute_num_layers`` layers and recomputes every layer).

In-flight micro-batches (formulas.md Sec. 5): 1F1B stage i holds ``min(pp - i, m)``; interleaved 1F1B Megatron's
warm-up ``(pp - i - 1)*2 + (vpp - 1)*pp + 1`` chunks (K22's ``1 + (p-1)/(p*v)`` on the first stage); GPipe
``m``; ZB-H1 as 1F1B (Qi et al. 2024 Table 1); ZB-V, DualPipe, DualPipeV and combined 1F1B from their op orders
(``in_flight_microbatches``). DualPipe's ranks hold two model stages (two parameter copies), V schedules put the
embedding and the output layer on rank 0 (``layout.holds_embedding`` / ``holds_output``).
"""
from __future__ import annotations

from model_zoo.spec import ModelSpec

from .config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob, compute_bytes
from .moe_imbalance import rank_load_ratio
from .pipeline import OP_ORDER_SCHEDULES, chunks_per_rank, in_flight_chunks


def recompute_modules_of(par: ParallelConfig) -> frozenset[str]:
    """Modules whose activations selective recompute drops: ``par.recompute_modules``, or Megatron's default
    ``core_attn`` (``--recompute-activations``); empty unless ``par.recompute == 'selective'``."""
    if par.recompute != "selective":
        return frozenset()
    mods = getattr(par, "recompute_modules", None)
    return frozenset(mods) if mods is not None else frozenset({"core_attn"})


def _attention_widths(model: ModelSpec) -> tuple[float, float, float, float]:
    """(query, key, value) projection widths and replicated latent width (MLA)."""
    a, g = model.num_attention_heads, model.num_kv_heads
    if model.mla is not None:
        q_w = a * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim)
        return q_w, q_w, a * model.mla.v_head_dim, model.mla.kv_lora_rank + (model.mla.q_lora_rank or 0)
    return a * model.head_dim, g * model.head_dim, g * model.head_dim, 0.0


def activation_bytes_per_layer(model: ModelSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                               framework: str = "megatron") -> float:
    """Stored activation bytes of one decoder layer for one micro-batch on one GPU under ``par.recompute``
    ``none`` or ``selective`` (K22 Sec. 4.1, generalised as described in the module docstring): the sum of
    ``activation_terms_per_layer``."""
    return sum(activation_terms_per_layer(model, job, par, layer, framework).values())


def activation_terms_per_layer(model: ModelSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                               framework: str = "megatron") -> dict[str, float]:
    """``activation_bytes_per_layer`` split by the tensor that holds the bytes (one micro-batch, one GPU):
    ``attn_norm_in`` / ``mlp_norm_in`` (the two norm inputs), ``qkv_in`` / ``fc1_in`` (the QKV and fc1 GEMM inputs:
    the norm outputs), ``dropout_masks``, ``qkv`` (Q, K, V), ``attn_out`` (the attention output, also the output
    projection's input), ``mla_latent``, ``softmax_stats`` (fp32 log-sum-exp, or the unfused softmax/dropout
    scores), ``fc1_out`` / ``fc2_in`` (dense MLP), the MoE terms of ``_moe_terms``, and ``saved`` (torchtitan's
    per-op selective policy, not split). Activation offloading (``cost_models/activation_offload.py``) moves some
    of them to the host."""
    b, s, h, t = par.micro_batch_size, job.seq_length / par.cp, model.hidden_size, par.tp
    sb = s * b
    a = model.num_attention_heads
    q_w, kv_w, v_w, latent = _attention_widths(model)
    drop = 1 if job.dropout else 0
    ab = compute_bytes(job.precision)  # 16-bit activations, 4 bytes in fp32 training
    gemm_in = 1 if job.precision == "fp8" else ab  # TE keeps FP8 GEMM inputs (1 byte)
    mult = 2 if model.gated_mlp else 1
    is_moe = model.moe is not None and model.is_moe_layer(layer)
    capacity_factor = expert_buffer_factor(model, job, par) if is_moe else None
    f = (model.moe.dense_ffn_hidden_size if model.moe and model.moe.dense_ffn_hidden_size else model.ffn_hidden_size)

    if framework == "torchtitan" and par.recompute == "selective":
        # Per-op SAC: the layer input, attention output + fp32 LSE, and every second matmul output (half of all).
        mm = q_w + kv_w + v_w + h + (mult * f + h if not is_moe else 0)  # wq wk wv wo (w1 w3) w2
        saved = sb * ab * (h + 0.5 * mm) / t + sb * ab * q_w / t + 4 * a * sb / t
        if is_moe:
            saved += sum(_moe_terms(model, par, sb, gemm_in, mult, capacity_factor, ab=ab).values()) * 0.5
        return {"saved": saved}

    mods = recompute_modules_of(par)
    out: dict[str, float] = {}
    # Outside the TP region (split only under SP): 2 norm inputs (2+2), QKV and fc1 GEMM inputs, 2 dropout masks.
    # ``layernorm`` recompute discards the norm outputs (output-discarding checkpoint); in FP8 the GEMMs keep their
    # own 1-byte copies of them, so only 16-bit GEMM inputs go.
    norm_out = 0 if ("layernorm" in mods and gemm_in == ab) else gemm_in
    sp = t if par.sequence_parallel else 1
    out["attn_norm_in"] = out["mlp_norm_in"] = sb * h * ab / sp
    out["qkv_in"] = out["fc1_in"] = sb * h * norm_out / sp
    out["dropout_masks"] = sb * h * 2 * drop / sp
    if par.sequence_parallel and framework == "torchtitan":
        # DTensor SP: the QKV and fc1 linears save their all-gathered (Replicate) input, full size; Megatron
        # re-gathers it in backward instead (torchtitan parallelize_llama.py apply_tp: PrepareModuleInput
        # desired_input_layouts=Replicate() before attention and feed_forward).
        out["qkv_in"] += sb * h * gemm_in * (1 - 1 / t)
        out["fc1_in"] += sb * h * gemm_in * (1 - 1 / t)
    # Attention inside TP: Q, K, V and the attention output O (kept for the attention backward; O is also the
    # output-projection GEMM input).
    ctx_w = v_w if model.mla is not None else q_w  # attention output = output-projection input
    # ``mla_up_proj`` recompute (MLA only) discards Q, K, V after the attention forward and recomputes them from
    # the stored latents before its backward (output-discarding checkpoint).
    qkv = 0 if ("mla_up_proj" in mods and model.mla is not None) else q_w + kv_w + v_w
    out["qkv"] = sb * ab * qkv / t
    out["attn_out"] = sb * gemm_in * ctx_w / t
    out["mla_latent"] = sb * ab * latent
    if job.flash_attention:
        out["softmax_stats"] = 4 * a * sb / t  # fp32 log-sum-exp per head and token
    elif "core_attn" not in mods:
        # K22: softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b (queries local s/cp, keys all s).
        out["softmax_stats"] = (2 + 3 * drop) * a * s * job.seq_length * b / t
    if is_moe:
        if "moe" not in mods:
            out.update(_moe_terms(model, par, sb, gemm_in, mult, capacity_factor, mods, ab))
    elif "mlp" not in mods:  # else the dense MLP is checkpointed: only its input (fc1_in) is kept
        # fc1 output (mult*f, the activation's input) and fc2 input (f, a GEMM input).
        out["fc1_out"] = sb * ab * mult * f / t
        out["fc2_in"] = sb * gemm_in * f / t
    return out


def expert_buffer_factor(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Routed token copies held by the busiest expert-parallel rank over the balanced share (dimensionless): the
    job's capacity factor when it pads the expert buffers (``TrainingJob.moe_expert_capacity_factor``:
    ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``, every expert holds exactly that
    many), else dropless routing's imbalance ``moe_imbalance.rank_load_ratio`` for ``job.expert_load_imbalance`` (1
    at ep 1, growing with ep)."""
    capacity_factor = getattr(job, "moe_expert_capacity_factor", None)
    if capacity_factor:
        return capacity_factor
    if model.moe is None:
        return 1.0
    return rank_load_ratio(model.moe.num_experts, par.ep, getattr(job, "expert_load_imbalance", None))


def _moe_terms(model: ModelSpec, par: ParallelConfig, sb: float, gemm_in: int, mult: int,
               capacity_factor: float | None, mods: frozenset[str] = frozenset(),
               ab: int = BYTES_16BIT) -> dict[str, float]:
    """MoE layer activations by tensor: ``k`` routed copies of every token times ``capacity_factor`` (the busiest
    rank's share over the balanced one, ``expert_buffer_factor``: dropless imbalance, or padding to a capacity), each
    stored as the expert fc1 GEMM input (``expert_fc1_in``: the dispatched token, h, kept by the grouped GEMM in its
    input dtype: 1 byte in FP8; the fused permutation's backward needs only the routing map), the expert fc1 output
    (``expert_fc1_out``, mult*f_e), the fc2 input (``expert_fc2_in``, f_e) and the un-permutation input
    (``unpermute_in``: the fc2 output, 2h bytes, kept for the gradient of the routing probabilities); shared
    experts as a dense MLP (``shared_experts``); fp32 router logits and probabilities (``router``) (Megatron
    ``moe_utils.permute``/``unpermute``, ``router.py``, ``experts.py`` TEGroupedMLP). Tokens per GPU: under
    sequence parallelism each TP rank routes its own ``s/tp`` tokens and the expert-TP group all-gathers them,
    ``s*b*etp/tp`` (Megatron ``token_dispatcher.py``: all-to-all over the TP x EP group with etp 1, all-gather over
    ETP otherwise; etp = tp gives the whole ``s*b``). Selective recompute ``mods``: ``moe_act`` discards the expert
    (and shared-expert) activation outputs, the fc2 inputs (output-discarding checkpoint); ``shared_experts``
    checkpoints the shared experts."""
    moe = model.moe
    assert moe is not None
    h, k = model.hidden_size, moe.top_k
    fe = moe.expert_ffn_hidden_size / par.expert_tp
    cf = capacity_factor or 1.0
    fc2_in = 0 if "moe_act" in mods else gemm_in
    local = sb / par.tp if par.sequence_parallel else sb  # tokens this rank routes
    routed = min(sb, local * par.expert_tp)  # tokens whose copies reach this rank's experts
    copies = routed * k * cf
    out = {"expert_fc1_in": copies * gemm_in * h, "unpermute_in": copies * ab * h,
           "expert_fc1_out": copies * ab * mult * fe, "expert_fc2_in": copies * fc2_in * fe}
    if moe.shared_expert_ffn_hidden_size and "shared_experts" not in mods:
        fs = moe.shared_expert_ffn_hidden_size / par.tp
        out["shared_experts"] = sb * (ab * mult * fs + fc2_in * fs)
    out["router"] = local * 2 * BYTES_FP32 * moe.num_experts  # fp32 router logits + probabilities
    return out


def layer_input_bytes(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Bytes of one layer's input (the checkpoint kept under full recompute): ``2*s*b*h``, ``/tp`` under SP
    (K22 Table 2 "full recompute" row; derived note in formulas.md Sec. 2)."""
    x = compute_bytes(job.precision) * job.seq_length / par.cp * par.micro_batch_size * model.hidden_size
    return x / par.tp if par.sequence_parallel else x


def in_flight_microbatches(par: ParallelConfig, stage: int, num_microbatches: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in whole-stage units (formulas.md Sec. 5).

    For interleaved 1F1B the count is of model chunks divided by ``vpp`` (each chunk is 1/vpp of the stage). ZB-V,
    DualPipe, DualPipeV and combined 1F1B count the chunks alive at once in their op order
    (``pipeline.in_flight_chunks``: DualPipe ``p + 1`` chunks of two per rank, DualPipeV ``2p + 1`` half-stage chunks,
    DeepSeek-V3 report Table 2; ZB-V ``2p`` half-stage chunks = 1F1B's ``p``; combined 1F1B one chunk more than
    interleaved), divided by the chunks per rank.
    """
    p, v, m = par.pp, par.vpp, max(1, num_microbatches)
    sched = par.pipeline_schedule
    if sched in OP_ORDER_SCHEDULES and (p > 1 or sched == "combined-1f1b"):
        per_rank = 2 if sched == "dualpipe" else chunks_per_rank(sched, v)
        try:
            return in_flight_chunks(sched, p, m, v)[stage] / per_rank
        except ValueError:  # a micro-batch count the schedule cannot run (the checker reports it): 1F1B's count
            return float(min(p - stage, m))
    if p == 1:
        return 1.0
    if sched == "gpipe":
        return float(m)
    if sched == "interleaved" and v > 1:
        chunks = (p - stage - 1) * 2 + (v - 1) * p + 1
        return min(chunks, m * v) / v
    return float(min(p - stage, m))
