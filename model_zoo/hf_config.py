"""Hugging Face ``config.json`` -> ``ModelSpec``, one translator per ``model_type``.

HF field conventions follow the transformers modeling code of each ``model_type``
(``src/transformers/models/<type>/modeling_<type>.py`` and ``configuration_<type>.py``):

- llama / mistral: q,k,v,o with ``attention_bias``; gate/up/down with ``mlp_bias`` (llama only);
  ``head_dim`` field (default h/a); RMSNorm.
- mixtral: llama attention without biases, ``num_local_experts`` SwiGLU experts of
  ``intermediate_size``, router ``gate`` Linear(h, E, bias=False), ``num_experts_per_tok``.
- qwen2: q,k,v bias=True, o_proj bias=False.
- qwen2_moe: qwen2 attention (``qkv_bias`` defaults True); MoE layer iff i not in
  ``mlp_only_layers`` and ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step == 0``; experts of
  ``moe_intermediate_size``; ``shared_expert`` MLP of ``shared_expert_intermediate_size`` and
  ``shared_expert_gate`` Linear(h, 1, bias=False); dense layers use ``intermediate_size``.
- qwen3 / qwen3_moe: ``attention_bias`` on q,k,v,o; ``q_norm``/``k_norm`` RMSNorm(head_dim);
  ``head_dim`` field; qwen3_moe has no shared expert.
- gpt2: ``n_embd``, ``n_layer``, ``n_head``, ``n_inner`` (default 4h), ``n_positions`` learned
  positions, LayerNorm with bias, biases on every Conv1D, tied ``lm_head``.
- nemotron: ``NemotronLayerNorm1P`` (LayerNorm, weight + bias), non-gated ``relu2`` MLP
  (up/down, ``mlp_bias``), ``attention_bias``, ``head_dim`` (or ``kv_channels``), untied by default.
- deepseek_v3: MLA (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``), first ``first_k_dense_replace`` layers dense with ``intermediate_size``, then MoE
  with ``n_routed_experts`` experts of ``moe_intermediate_size``, ``n_shared_experts`` x
  ``moe_intermediate_size`` shared expert, router weight (E x h) + ``e_score_correction_bias`` (E),
  ``num_nextn_predict_layers`` MTP layers (not built by HF).
- gpt_oss: llama-style attention with biases and ``sinks`` (one logit per head), every layer MoE with a biased
  router and biased experts (``num_local_experts``, ``num_experts_per_tok``), ``layer_types`` sliding/full.
- llama4: the decoder of ``text_config``; MoE every ``interleave_moe_layer_step`` layers with one shared expert,
  dense layers of ``intermediate_size_mlp``; kimi_k2: the deepseek_v3 architecture.
- bloom: ``n_embed``/``hidden_size``, ``n_layer``, ``n_head``/``num_attention_heads``, 4h GeLU MLP,
  every linear with bias, LayerNorm with bias, ``word_embeddings_layernorm``, ALiBi, tied.
"""
from __future__ import annotations

from typing import Any, Callable

from . import spec as _s
from .build import spec_from_dict
from .errors import ModelSpecError
from .input_guard import check_shape
from .spec import ModelSpec



class _Cfg:
    """Field access on a config.json dict with one-line errors naming file and field."""

    def __init__(self, where: str, d: dict[str, Any]):
        self.where, self.d = where, d

    def req(self, *names: str) -> Any:
        for n in names:
            if n in self.d and self.d[n] is not None:
                return self._check(n, self.d[n])
        raise ModelSpecError(f"{self.where}: field '{names[0]}' missing")

    def get(self, name: str, default: Any) -> Any:
        v = self.d.get(name)
        return default if v is None else self._check(name, v)

    def _check(self, name: str, v: Any) -> Any:
        if isinstance(v, float) and v.is_integer() and name not in ("rope_theta",):
            return int(v)
        return v

    def int_(self, *names: str, default: int | None = None) -> int:
        v = self.req(*names) if default is None else next(
            (self.d[n] for n in names if self.d.get(n) is not None), default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelSpecError(f"{self.where}: field '{names[0]}' must be an integer, got {v!r}")
        return v


_ROPE_SCALING_KEYS = ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                      "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def _rope_and_norm(c: _Cfg, eps_keys: tuple[str, ...], eps_default: float) -> dict[str, Any]:
    """Settings that define the model without holding parameters: ``rope_theta``, ``partial_rotary_factor``,
    ``rope_scaling`` (``rope_type`` or the older ``type``; "default" = none) and the norm epsilon (the first of
    ``eps_keys`` present, else the HF configuration class default ``eps_default``)."""
    out: dict[str, Any] = {"rope_theta": float(c.d.get("rope_theta") or 10000.0),
                           "norm_eps": float(next((c.d[k] for k in eps_keys if c.d.get(k) is not None),
                                                  eps_default))}
    if c.d.get("partial_rotary_factor") is not None:
        out["rotary_percent"] = float(c.d["partial_rotary_factor"])
    rs = c.d.get("rope_scaling")
    if isinstance(rs, dict):
        kind = rs.get("rope_type", rs.get("type"))
        if kind not in (None, "default"):
            if kind not in ("llama3", "yarn", "linear"):
                raise ModelSpecError(f"{c.where}: field 'rope_scaling.rope_type': '{kind}' is not supported; "
                                     f"supported: llama3, yarn, linear")
            out["rope_scaling"] = {"type": kind, **{k: rs[k] for k in _ROPE_SCALING_KEYS if rs.get(k) is not None}}
    return out


#: HF ``hidden_act`` of a gated MLP (``down(act(gate(x)) * up(x))``: transformers ``LlamaMLP`` and its copies,
#: ``ACT2FN``) -> plan3d's activation name.
_GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu",
                      "gelu_pytorch_tanh": "geglu", "gelu_fast": "geglu", "relu": "reglu"}


def _gated_activation(c: _Cfg) -> str:
    """The gated MLP's activation from ``hidden_act`` (default ``silu``: LlamaConfig, MistralConfig, Qwen2/3Config,
    DeepseekV3Config); one-line ``ModelSpecError`` for a value with no entry in ``_GATED_ACTIVATIONS``."""
    act = c.get("hidden_act", "silu")
    if not isinstance(act, str) or act.lower() not in _GATED_ACTIVATIONS:
        raise ModelSpecError(f"{c.where}: field 'hidden_act': {act!r} is not supported; supported: "
                             f"{', '.join(_GATED_ACTIVATIONS)}")
    return _GATED_ACTIVATIONS[act.lower()]


def _llama_like(c: _Cfg, family: str, *, qkv_bias_default: bool = False, o_bias: bool | None = None,
                qk_norm: bool = False) -> dict[str, Any]:
    h = c.int_("hidden_size")
    a = c.int_("num_attention_heads")
    g = c.int_("num_key_value_heads", default=a)
    d = c.int_("head_dim", default=h // a)
    attn_bias = bool(c.get("attention_bias", qkv_bias_default))
    return dict(
        family=family,
        num_layers=c.int_("num_hidden_layers"),
        hidden_size=h,
        num_attention_heads=a,
        num_kv_heads=g,
        head_dim=d,
        ffn_hidden_size=c.int_("intermediate_size"),
        gated_mlp=True,
        activation=_gated_activation(c),
        normalization="rmsnorm",
        qkv_bias=attn_bias,
        attention_out_bias=attn_bias if o_bias is None else o_bias,
        mlp_bias=bool(c.get("mlp_bias", False)),
        qk_norm=qk_norm,
        vocab_size=c.int_("vocab_size"),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        position_embedding="rope",
        max_position_embeddings=c.int_("max_position_embeddings", default=4096),
        # LlamaConfig / MistralConfig / Qwen2Config: rms_norm_eps default 1e-6
        **_rope_and_norm(c, ("rms_norm_eps",), 1e-6),
    )


def _hf_llama(c: _Cfg) -> dict[str, Any]:
    return _llama_like(c, "llama")


def _windowed(c: _Cfg, d: dict[str, Any], every_layer: bool) -> dict[str, Any]:
    """``d`` with the sliding-window attention of a Mistral / Mixtral (``every_layer``) or Qwen2 / Qwen3-family
    config.json: an explicit ``layer_types`` list wins; else Mistral and Mixtral window every layer when
    ``sliding_window`` is set (HF ``MistralAttention`` / ``MixtralAttention``: ``sliding_window=config.sliding_window``;
    Mistral-7B-v0.1 4096, null from v0.2), the Qwen families only with ``use_sliding_window`` true, and then the
    layers from ``max_window_layers`` on (HF ``Qwen2Config``: ``sliding_attention`` if ``i >= max_window_layers``).
    All-full layers leave ``d`` as it is. The emitters refuse windowed layers by name (a launch without them trains
    another model); the cost models price their attention over the window (``ModelSpec.attention_window``)."""
    n = d["num_layers"]
    kinds = _layer_types(c, n)
    window = c.get("sliding_window", None)
    if kinds is None and window is not None:
        if every_layer:
            kinds = ("sliding_attention",) * n
        elif c.get("use_sliding_window", False) is True:
            first = c.int_("max_window_layers", default=n)
            if first < 0:
                raise ModelSpecError(f"{c.where}: field 'max_window_layers' = {first} must be >= 0 (the first "
                                     f"windowed layer; 0 = every layer, {n} or more = none)")
            kinds = tuple("sliding_attention" if i >= first else "full_attention" for i in range(n))
    if kinds is None or set(kinds) == {"full_attention"}:
        return d
    if "sliding_attention" in kinds:
        d["sliding_window"] = c.int_("sliding_window")
    d["layer_types"] = kinds
    return d


def _hf_mistral(c: _Cfg) -> dict[str, Any]:
    return _windowed(c, _llama_like(c, "mistral"), every_layer=True)


def _hf_mixtral(c: _Cfg) -> dict[str, Any]:
    d = _windowed(c, _llama_like(c, "mixtral"), every_layer=True)
    d["norm_eps"] = float(c.d.get("rms_norm_eps") or 1e-5)  # MixtralConfig default 1e-5
    d["moe"] = dict(
        num_experts=c.int_("num_local_experts"),
        top_k=c.int_("num_experts_per_tok"),
        expert_ffn_hidden_size=c.int_("intermediate_size"),
        aux_loss_coeff=c.get("router_aux_loss_coef", 0.0),
    )
    return d


def _hf_qwen2(c: _Cfg) -> dict[str, Any]:
    # Qwen2Attention: q/k/v bias=True, o_proj bias=False
    d = _windowed(c, _llama_like(c, "qwen2"), every_layer=False)
    d.update(qkv_bias=True, attention_out_bias=False)
    return d


def _hf_qwen2_moe(c: _Cfg) -> dict[str, Any]:
    d = _windowed(c, _llama_like(c, "qwen2_moe"), every_layer=False)
    d.update(qkv_bias=bool(c.get("qkv_bias", True)), attention_out_bias=False)
    shared = c.int_("shared_expert_intermediate_size", default=0)
    d["moe"] = _qwen_moe(c, num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared,
                         shared_expert_gate=bool(shared))
    return d


def _qwen_moe(c: _Cfg, **shared: Any) -> dict[str, Any]:
    """The ``moe`` fields Qwen2-MoE and Qwen3-MoE configs share: routed experts, every ``decoder_sparse_step``-th
    layer sparse (the first ``step - 1`` dense) except ``mlp_only_layers``; ``norm_topk_prob`` defaults to False in
    both (``Qwen2MoeConfig``, ``Qwen3MoeConfig``). ``shared``: the shared-expert fields (Qwen2-MoE only)."""
    step = c.int_("decoder_sparse_step", default=1)
    return dict(
        num_experts=c.int_("num_experts"),
        top_k=c.int_("num_experts_per_tok"),
        expert_ffn_hidden_size=c.int_("moe_intermediate_size"),
        **shared,
        first_k_dense_layers=step - 1,
        moe_layer_freq=step,
        dense_layer_indices=tuple(c.get("mlp_only_layers", [])),
        norm_topk_prob=bool(c.get("norm_topk_prob", False)),
        aux_loss_coeff=c.get("router_aux_loss_coef", 0.0),
    )


def _hf_qwen3(c: _Cfg) -> dict[str, Any]:
    return _windowed(c, _llama_like(c, "qwen3", qk_norm=True), every_layer=False)


def _hf_qwen3_moe(c: _Cfg) -> dict[str, Any]:
    d = _windowed(c, _llama_like(c, "qwen3_moe", qk_norm=True), every_layer=False)
    d["moe"] = _qwen_moe(c)
    return d


def _hf_gpt2(c: _Cfg) -> dict[str, Any]:
    h = c.int_("n_embd", "hidden_size")
    a = c.int_("n_head", "num_attention_heads")
    return dict(
        family="gpt2",
        num_layers=c.int_("n_layer", "num_hidden_layers"),
        hidden_size=h,
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        ffn_hidden_size=c.int_("n_inner", default=4 * h),
        gated_mlp=False,
        activation="gelu",
        normalization="layernorm",
        qkv_bias=True,
        linear_bias=True,
        vocab_size=c.int_("vocab_size"),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        position_embedding="learned",
        max_position_embeddings=c.int_("n_positions", "max_position_embeddings"),
        norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),  # GPT2Config default 1e-5
    )


def _hf_bloom(c: _Cfg) -> dict[str, Any]:
    h = c.int_("n_embed", "hidden_size")
    a = c.int_("n_head", "num_attention_heads")
    return dict(
        family="bloom",
        num_layers=c.int_("n_layer", "num_hidden_layers"),
        hidden_size=h,
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        ffn_hidden_size=4 * h,
        gated_mlp=False,
        activation="gelu",
        normalization="layernorm",
        qkv_bias=True,
        linear_bias=True,
        vocab_size=c.int_("vocab_size"),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        position_embedding="alibi",
        max_position_embeddings=c.int_("seq_length", default=2048),
        embedding_layernorm=True,
        norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),  # BloomConfig default 1e-5
    )


def _hf_nemotron(c: _Cfg) -> dict[str, Any]:
    h = c.int_("hidden_size")
    a = c.int_("num_attention_heads")
    attn_bias = bool(c.get("attention_bias", False))
    act = c.get("hidden_act", "relu2")
    return dict(
        family="nemotron",
        num_layers=c.int_("num_hidden_layers"),
        hidden_size=h,
        num_attention_heads=a,
        num_kv_heads=c.int_("num_key_value_heads", default=a),
        head_dim=c.int_("head_dim", "kv_channels", default=h // a),
        ffn_hidden_size=c.int_("intermediate_size"),
        gated_mlp=False,
        activation=str(act),
        normalization="layernorm",  # NemotronLayerNorm1P: weight + bias
        qkv_bias=attn_bias,
        attention_out_bias=attn_bias,
        mlp_bias=bool(c.get("mlp_bias", False)),
        vocab_size=c.int_("vocab_size"),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        position_embedding="rope",
        max_position_embeddings=c.int_("max_position_embeddings", default=4096),
        layernorm_1p=True,
        # NemotronConfig defaults: norm_eps 1e-5, partial_rotary_factor 0.5
        **{"rotary_percent": 0.5, **_rope_and_norm(c, ("norm_eps",), 1e-5)},
    )


def _hf_deepseek_v3(c: _Cfg) -> dict[str, Any]:
    h = c.int_("hidden_size")
    a = c.int_("num_attention_heads")
    nope = c.int_("qk_nope_head_dim")
    rope = c.int_("qk_rope_head_dim")
    q_lora = c.get("q_lora_rank", None)
    attn_bias = bool(c.get("attention_bias", False))
    moe_f = c.int_("moe_intermediate_size")
    n_shared = c.int_("n_shared_experts", default=0)
    return dict(
        family="deepseek_v3",
        num_layers=c.int_("num_hidden_layers"),
        hidden_size=h,
        num_attention_heads=a,
        num_kv_heads=c.int_("num_key_value_heads", default=a),
        head_dim=nope + rope,
        ffn_hidden_size=c.int_("intermediate_size"),
        gated_mlp=True,
        activation=_gated_activation(c),
        normalization="rmsnorm",
        qkv_bias=attn_bias,
        attention_out_bias=attn_bias,
        vocab_size=c.int_("vocab_size"),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        position_embedding="rope",
        max_position_embeddings=c.int_("max_position_embeddings", default=4096),
        num_mtp_layers=c.int_("num_nextn_predict_layers", default=0),
        # DeepseekV3Config defaults: rms_norm_eps 1e-6
        **_rope_and_norm(c, ("rms_norm_eps",), 1e-6),
        mla=dict(
            q_lora_rank=q_lora,
            kv_lora_rank=c.int_("kv_lora_rank"),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=c.int_("v_head_dim"),
        ),
        moe=dict(
            num_experts=c.int_("n_routed_experts"),
            top_k=c.int_("num_experts_per_tok"),
            expert_ffn_hidden_size=moe_f,
            num_shared_experts=n_shared,
            shared_expert_ffn_hidden_size=n_shared * moe_f,
            first_k_dense_layers=c.int_("first_k_dense_replace", default=0),
            moe_layer_freq=c.int_("moe_layer_freq", default=1),
            router_bias=c.get("topk_method", "noaux_tc") == "noaux_tc",
            n_group=c.get("n_group", None),
            topk_group=c.get("topk_group", None),
            # DeepseekV3Config defaults: scoring_func sigmoid, routed_scaling_factor 2.5, norm_topk_prob True
            score_function=c.get("scoring_func", "sigmoid"),
            routed_scaling_factor=float(c.get("routed_scaling_factor", 2.5)),
            norm_topk_prob=bool(c.get("norm_topk_prob", True)),
        ),
    )


def _layer_types(c: _Cfg, n: int) -> tuple[str, ...] | None:
    lt = c.get("layer_types", None)
    if lt is None:
        return None
    if not isinstance(lt, list) or len(lt) != n:
        raise ModelSpecError(f"{c.where}: field 'layer_types' must list one attention kind per layer ({n})")
    return tuple(lt)


def _hf_gpt_oss(c: _Cfg) -> dict[str, Any]:
    # GptOssAttention: q/k/v/o with bias=attention_bias (true in the released configs), head_dim field,
    # ``sinks`` (num_attention_heads); GptOssTopKRouter Linear(h, E) with bias; GptOssExperts gate_up_proj
    # (E, h, 2f) + gate_up_proj_bias (E, 2f), down_proj (E, f, h) + down_proj_bias (E, h); every layer MoE;
    # ``layer_types`` alternate sliding_attention (``sliding_window``) and full_attention.
    # Without ``layer_types`` GptOssConfig alternates from a sliding layer: ``"sliding_attention" if
    # bool((i + 1) % 2) else "full_attention"`` (transformers ``configuration_gpt_oss.py``).
    d = _llama_like(c, "gpt_oss")
    n = d["num_layers"]
    kinds = _layer_types(c, n) or tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n))
    if "sliding_window" in c.d and c.d["sliding_window"] is None and "sliding_attention" in kinds:
        # GptOssConfig defaults a missing window to 128, but an explicit null reaches GptOssAttention as no window
        # at all: the "sliding" layers would attend over the whole sequence. Contradictory; refused.
        raise ModelSpecError(f"{c.where}: field 'sliding_window' is null while 'layer_types' names "
                             f"sliding_attention layers: give the window in tokens (gpt-oss: 128)")
    d.update(attention_sinks=True, layer_types=kinds, sliding_window=c.int_("sliding_window", default=128))
    d["norm_eps"] = float(c.d.get("rms_norm_eps") or 1e-5)  # GptOssConfig default 1e-5
    d["moe"] = dict(
        num_experts=c.int_("num_local_experts"),
        top_k=c.int_("num_experts_per_tok", "experts_per_token"),
        expert_ffn_hidden_size=c.int_("intermediate_size"),
        router_linear_bias=True,
        expert_bias=True,
        aux_loss_coeff=c.get("router_aux_loss_coef", 0.0),
    )
    return d


def _hf_llama4(c: _Cfg) -> dict[str, Any]:
    # Llama4ForConditionalGeneration: the decoder is ``text_config`` (Llama4TextConfig); the vision encoder and
    # projector are not part of the ModelSpec (plan3d plans the language model). Llama4TextAttention: q/k/v/o
    # (attention_bias), qk L2 norm without weights; Llama4TextMoe: router Linear(h, E, bias=False), E experts of
    # ``intermediate_size``, one shared expert of ``intermediate_size``; dense layers Llama4TextMLP of
    # ``intermediate_size_mlp``; layer i is MoE iff i in range(step - 1, L, step), step =
    # ``interleave_moe_layer_step``. Attention is chunked (``attention_chunk_size``) on RoPE layers, full on the
    # NoPE layers (``no_rope_layers`` 0).
    t = c.d.get("text_config", c.d)
    if not isinstance(t, dict):
        raise ModelSpecError(f"{c.where}: field 'text_config' must be an object")
    tc = _Cfg(c.where, t)
    d = _llama_like(tc, "llama4")
    n, step = d["num_layers"], tc.int_("interleave_moe_layer_step", default=1)
    f_e = tc.int_("intermediate_size")
    d["ffn_hidden_size"] = tc.int_("intermediate_size_mlp", default=f_e)
    nope = tc.get("no_rope_layers", None)
    if isinstance(nope, list) and len(nope) == n:
        d["layer_types"] = tuple("chunked_attention" if r else "full_attention" for r in nope)
    d["moe"] = dict(
        num_experts=tc.int_("num_local_experts"),
        top_k=tc.int_("num_experts_per_tok", default=1),
        expert_ffn_hidden_size=f_e,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=f_e,
        first_k_dense_layers=step - 1,
        moe_layer_freq=step,
        dense_ffn_hidden_size=d["ffn_hidden_size"],
        score_function="sigmoid",  # Llama4Router: sigmoid of the top-k logits, not renormalised
        norm_topk_prob=False,
        aux_loss_coeff=tc.get("router_aux_loss_coef", 0.0),
    )
    return d


_HF_LOADERS: dict[str, Callable[[_Cfg], dict[str, Any]]] = {
    "llama": _hf_llama,
    "mistral": _hf_mistral,
    "mixtral": _hf_mixtral,
    "qwen2": _hf_qwen2,
    "qwen2_moe": _hf_qwen2_moe,
    "qwen3": _hf_qwen3,
    "qwen3_moe": _hf_qwen3_moe,
    "gpt2": _hf_gpt2,
    "bloom": _hf_bloom,
    "nemotron": _hf_nemotron,
    "deepseek_v3": _hf_deepseek_v3,
    "kimi_k2": _hf_deepseek_v3,  # moonshotai/Kimi-K2-*: DeepseekV3ForCausalLM with its own model_type name
    "gpt_oss": _hf_gpt_oss,
    "llama4": _hf_llama4,
    "llama4_text": _hf_llama4,
}


#: config.json fields that are dimensions or counts: an integer in the range of the ModelSpec field they become
#: (model_zoo/spec.py, with its reason) wherever present; 0 or a string would divide by zero or build nothing.
_INT_RANGES: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "n_embd", "n_embed", "kv_lora_rank", "q_lora_rank"), _s.WIDTH),
    **dict.fromkeys(("num_hidden_layers", "n_layer"), _s.LAYERS),
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "n_head"), _s.HEADS),
    **dict.fromkeys(("intermediate_size", "n_inner", "moe_intermediate_size", "shared_expert_intermediate_size"),
                    _s.FFN),
    **dict.fromkeys(("head_dim", "kv_channels", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), _s.HEAD_DIM),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "seq_length"), _s.POSITIONS),
    **dict.fromkeys(("num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "n_group",
                     "topk_group", "n_shared_experts"), _s.EXPERTS),
    **dict.fromkeys(("decoder_sparse_step", "moe_layer_freq"), _s.LAYERS),
    **dict.fromkeys(("first_k_dense_replace", "num_nextn_predict_layers"), _s.LAYER_COUNT),
    "vocab_size": _s.VOCAB,
}
#: config.json fields that are real-valued settings: a finite number in the range of their ModelSpec field.
_FLOAT_RANGES: dict[str, Any] = {
    "rope_theta": _s.ROPE_THETA, "partial_rotary_factor": _s.ROTARY_PERCENT,
    "routed_scaling_factor": _s.ROUTED_SCALING,
    **dict.fromkeys(("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"), _s.NORM_EPS),
}
#: HF configs that allow 0 for a count (DeepSeek n_shared_experts 0, first_k_dense_replace 0, Qwen2-MoE no shared
#: expert): 0 is checked as "none" by the range of the field itself.
_ZERO_OK = ("n_shared_experts", "shared_expert_intermediate_size")


def _check_hf_values(where: str, config: dict[str, Any]) -> None:
    """One-line ``ModelSpecError`` naming the first field with an impossible or implausible value."""
    for k, rng in _INT_RANGES.items():
        v = config.get(k)
        if v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelSpecError(f"{where}: field '{k}' must be an integer, got {config[k]!r:.60}")
        if v == 0 and k in _ZERO_OK:
            continue
        bad = rng.message(k, v)
        if bad:
            raise ModelSpecError(f"{where}: {bad}")
    for k, rng in _FLOAT_RANGES.items():
        v = config.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelSpecError(f"{where}: field '{k}' must be a number, got {config[k]!r:.60}")
        bad = rng.message(k, v)
        if bad:
            raise ModelSpecError(f"{where}: {bad}")
    rs = config.get("rope_scaling")
    if rs is not None:
        if not isinstance(rs, dict):
            raise ModelSpecError(f"{where}: field 'rope_scaling' must be an object or null, got {rs!r:.60}")
        for k in _ROPE_SCALING_KEYS:
            v = rs.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ModelSpecError(f"{where}: field 'rope_scaling.{k}' must be a number, got {v!r:.60}")
            rng_k = (_s.POSITIONS if k.startswith("original") else _s.ROPE_SCALING_FACTOR if k == "factor"
                     else _s.ROPE_SCALING_SETTING)
            bad = None if v is None else rng_k.message(f"rope_scaling.{k}", v)
            if bad:
                raise ModelSpecError(f"{where}: {bad}")
    ng, tg = config.get("n_group"), config.get("topk_group")
    if isinstance(ng, int) and isinstance(tg, int) and not 0 < tg <= ng:
        raise ModelSpecError(f"{where}: field 'topk_group' {tg} must be between 1 and n_group {ng}")
    for k in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        if config.get(k) is not None and not isinstance(config[k], bool):
            raise ModelSpecError(f"{where}: field '{k}' must be true or false, got {config[k]!r}")


def supported_model_types() -> list[str]:
    """The Hugging Face ``model_type`` values ``from_hf_config`` translates, sorted."""
    return sorted(_HF_LOADERS)


def from_hf_config(config: dict[str, Any], *, name: str | None = None, where: str = "config.json",
                   source: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a parsed HF ``config.json`` dict (dispatch on ``model_type``)."""
    if not isinstance(config, dict):
        raise ModelSpecError(f"{where}: top level must be a JSON object")
    mt = config.get("model_type")
    if mt is None:
        raise ModelSpecError(f"{where}: field 'model_type' missing")
    if not isinstance(mt, str) or mt not in _HF_LOADERS:
        raise ModelSpecError(
            f"{where}: unsupported model_type {mt!r}; supported: {', '.join(supported_model_types())}"
        )
    check_shape(config, where, ModelSpecError)
    _check_hf_values(where, config)
    try:
        data = _HF_LOADERS[mt](_Cfg(where, config))
    except ModelSpecError:
        raise
    except (ArithmeticError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # a combination the per-field checks above let through (e.g. dims that do not divide)
        raise ModelSpecError(f"{where}: inconsistent {mt} config ({type(exc).__name__}: {exc})") from None
    data["name"] = name or config.get("_name_or_path") or mt
    data["source"] = source or where
    return spec_from_dict(where, data)
