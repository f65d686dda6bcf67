"""Model architecture specification (``ModelSpec``) and exact parameter counting.

INTERFACE SKELETON — field names and method signatures are the contract used by ``cost_models`` and
``planner``. Bodies marked TODO are filled in by the model_zoo work.
"""
from __future__ import annotations

from typing import Annotated, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .input_guard import Plausible

# Plausible ranges (issue 14): from one unit to 100x the largest published value (the built-in zoo,
# model_zoo/data/models.yaml, with its sources). Outside them a value is an input error naming the field, before it
# can reach the cost models as an overflow, a NaN or a plan nobody can train.
#: Deepest model plan3d accepts: plan time grows with depth (measured on 64 H100s: 1,000 layers 1.2 s, 4,096 layers
#: 5.6 s; 100,000 ran for minutes); published LLMs stop at ~160 layers (GPT-3: 96; Megatron 1T: 128; Llama 3.1
#: 405B: 126).
MAX_LAYERS = 4096
WIDTH = Plausible(1, 100 * 25600, "one to 100x the hidden size of GPT-1T, 25,600, SC21 Table 1")
FFN = Plausible(1, 100 * 102400, "one to 100x the FFN width of GPT-1T, 102,400, SC21 Table 1")
HEADS = Plausible(1, 100 * 160, "one to 100x the 160 heads of GPT-1T, SC21 Table 1")
HEAD_DIM = Plausible(1, 100 * 256, "one to 100x the widest published head, 256, Gemma's; the zoo's widest is 192")
EXPERTS = Plausible(1, 100 * 256, "one to 100x the 256 routed experts of DeepSeek-V3")
POSITIONS = Plausible(1, 2**30, "one to ~100x the 10M-token context of Llama 4 Scout, HF "
                                 "max_position_embeddings 10,485,760")
LAYER_COUNT = Plausible(0, MAX_LAYERS, f"none to MAX_LAYERS {MAX_LAYERS}")
ROPE_SCALING_SETTING = Plausible(0, 1e4, "a finite RoPE-scaling setting;"
                                 " published ones are 0.7-40, DeepSeek-V3 factor 40")
#: RoPE scaling factor: positive (a factor of 0 divides positions by 0); linear interpolation below 1 is possible
ROPE_SCALING_FACTOR = Plausible(1e-3, 1e4, "published factors are 2-40, DeepSeek-V3 40")
LAYERS = Plausible(1, MAX_LAYERS, "plan time grows with depth; published LLMs have <= ~160 layers")
VOCAB = Plausible(1, 100 * 256000, "one to 100x Nemotron-4 340B's 256,000 tokens")
ROPE_THETA = Plausible(1, 1e8, "one to 100x the 1e6 of Mixtral and Qwen2.5")
ROTARY_PERCENT = Plausible(1e-3, 1, "a fraction of each head; Nemotron 0.5")
NORM_EPS = Plausible(1e-12, 0.1, "published ones are 1e-6 to 1e-5")
ROUTED_SCALING = Plausible(1e-3, 250, "100x either way of DeepSeek-V3's 2.5")


class MoESpec(BaseModel):
    """Mixture-of-experts block of a decoder layer (all counts are per MoE layer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_experts: Annotated[int, EXPERTS] = Field(description="routed experts per MoE layer (E)")
    top_k: Annotated[int, EXPERTS] = Field(description="routed experts per token (k)")
    expert_ffn_hidden_size: Annotated[int, FFN] = Field(description="FFN width of one routed expert (f_e)")
    num_shared_experts: Annotated[int, Plausible(0, 100 * 256, "none to 100x DeepSeek-V3's routed experts")] = 0
    shared_expert_ffn_hidden_size: Annotated[int, Plausible(0, 100 * 102400, "none to 100x GPT-1T's FFN width")] = \
        Field(0, description="FFN width of ALL shared experts together (f_sh)")
    shared_expert_gate: bool = Field(False, description="sigmoid gate h->1 on the shared expert (qwen2_moe)")
    first_k_dense_layers: Annotated[int, LAYER_COUNT] = Field(
        0, description="leading layers with a dense MLP (DeepSeek first_k_dense_replace)")
    moe_layer_freq: Annotated[int, Plausible(1, MAX_LAYERS, f"every layer to one in MAX_LAYERS {MAX_LAYERS}")] = Field(
        1, description="after the dense prefix, layer i is MoE iff (i - first_k) % freq == 0")
    router_bias: bool = Field(False, description="per-expert router score bias parameter (DeepSeek-V3 e_score_correction_bias)")
    dense_ffn_hidden_size: Annotated[int, FFN] | None = Field(None, description="FFN width of the dense layers if different from ModelSpec.ffn_hidden_size")
    dense_layer_indices: tuple[int, ...] = Field((), max_length=MAX_LAYERS,
                                                 description="layers forced dense (Qwen2/3-MoE mlp_only_layers)")
    n_group: Annotated[int, EXPERTS] | None = Field(None, description="expert groups of node-limited routing (DeepSeek-V3 HF "
                                "config n_group; the experts split into n_group equal, contiguous groups)")
    topk_group: Annotated[int, EXPERTS] | None = Field(None, description="groups a token may be routed to (HF topk_group; "
                                   "DeepSeek-V3 Sec. 2.1.2: at most 4 nodes per token); None = no limit")
    score_function: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="router score function (DeepSeek-V3 HF scoring_func 'sigmoid'; Mixtral/Qwen softmax)")
    routed_scaling_factor: Annotated[float, ROUTED_SCALING] = Field(
        1.0, description="routed-expert weights are multiplied by this "
                                         "(DeepSeek-V3 HF routed_scaling_factor 2.5)")
    norm_topk_prob: bool = Field(True, description="the top-k routing weights are renormalised to sum 1 (HF "
                                 "norm_topk_prob; Mixtral always; Qwen1.5-MoE false = softmax over all experts)")
    router_linear_bias: bool = Field(False, description="the router is a Linear(h, E) WITH bias, a parameter of E "
                                     "elements (HF GptOssTopKRouter.bias)")
    expert_bias: bool = Field(False, description="biases on every routed expert's linears: gate/up (2 f_e, or f_e "
                              "ungated) and down (h) per expert (HF GptOssExperts gate_up_proj_bias, down_proj_bias)")
    aux_loss_coeff: Annotated[float, Plausible(0, 10, "none to ~10x gpt-oss's 0.9")] = Field(
        0.0, description="weight of the load-balancing auxiliary loss (HF router_aux_loss_coef: Mixtral-8x7B 0.02, "
                         "Qwen MoE 0.001; Megatron-LM --moe-aux-loss-coeff, default 0 = no balancing loss; Switch "
                         "Transformer, Fedus et al. 2022 Eq. 4). Holds no parameters; the expert-load imbalance the "
                         "cost models assume is TrainingJob.expert_load_imbalance's")


class RopeScalingSpec(BaseModel):
    """RoPE frequency scaling of a long-context model (HF ``config.json`` ``rope_scaling``).

    ``llama3``: Llama 3.1 (``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``; HF ``_compute_llama3_parameters``). ``yarn``: YaRN, arXiv:2309.00071
    (``factor``, ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``mscale``,
    ``mscale_all_dim``; DeepSeek-V3). ``linear``: position interpolation by ``factor``. Unitless except the
    position counts (tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["llama3", "yarn", "linear"]
    factor: Annotated[float, ROPE_SCALING_FACTOR]
    original_max_position_embeddings: Annotated[int, POSITIONS] | None = None
    low_freq_factor: Annotated[float, ROPE_SCALING_SETTING] | None = None
    high_freq_factor: Annotated[float, ROPE_SCALING_SETTING] | None = None
    beta_fast: Annotated[float, ROPE_SCALING_SETTING] | None = None
    beta_slow: Annotated[float, ROPE_SCALING_SETTING] | None = None
    mscale: Annotated[float, ROPE_SCALING_SETTING] | None = None
    mscale_all_dim: Annotated[float, ROPE_SCALING_SETTING] | None = None


class MLASpec(BaseModel):
    """Multi-head latent attention dims (DeepSeek-V2/V3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_lora_rank: Annotated[int, WIDTH] | None = None
    kv_lora_rank: Annotated[int, WIDTH]
    qk_nope_head_dim: Annotated[int, HEAD_DIM]
    qk_rope_head_dim: Annotated[int, HEAD_DIM]
    v_head_dim: Annotated[int, HEAD_DIM]


class LayerParams(BaseModel):
    """Parameter count of one decoder layer split by how parallelism shards it.

    - ``tp_sharded``: split over tensor parallel ranks (attention projections, dense MLP, shared experts).
    - ``replicated``: held whole by every TP rank (norms, router, biases of row-parallel layers, gates).
    - ``expert``: routed expert weights of ALL experts (split over EP x expert-TP).
    - ``expert_active``: routed expert weights of the top-k experts a token uses.
    """

    model_config = ConfigDict(frozen=True)

    tp_sharded: int
    replicated: int
    expert: int = 0
    expert_active: int = 0

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.expert

    @property
    def active(self) -> int:
        return self.tp_sharded + self.replicated + self.expert_active


class ModelSpec(BaseModel):
    """A dense or MoE decoder-only transformer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str = Field(description="where the dims come from (paper table / config.json URL)")
    family: str = ""
    num_layers: Annotated[int, LAYERS] = Field(description=f"decoder layers (at most {MAX_LAYERS})")
    hidden_size: Annotated[int, WIDTH]
    num_attention_heads: Annotated[int, HEADS]
    num_kv_heads: Annotated[int, HEADS] = Field(description="KV heads (query groups); = num_attention_heads for MHA")
    head_dim: Annotated[int, HEAD_DIM]
    ffn_hidden_size: Annotated[int, FFN]
    gated_mlp: bool = Field(description="SwiGLU/GeGLU: three h x f matrices instead of two")
    activation: str = "swiglu"
    normalization: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    qkv_bias: bool = False
    linear_bias: bool = Field(False, description="biases on attention output and MLP linears (GPT-2/BLOOM style)")
    qk_norm: bool = False
    vocab_size: Annotated[int, VOCAB]
    tie_word_embeddings: bool = False
    position_embedding: Literal["rope", "learned", "alibi", "none"] = "rope"
    max_position_embeddings: Annotated[int, POSITIONS] = 4096
    embedding_layernorm: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    num_mtp_layers: Annotated[int, Plausible(0, 100, "none to 100x DeepSeek-V3's one")] = Field(
        0, description="multi-token-prediction layers (DeepSeek-V3); not built by HF")
    attention_out_bias: bool | None = Field(None, description="bias on the attention output projection; None = linear_bias")
    mlp_bias: bool | None = Field(None, description="biases on the MLP linears; None = linear_bias")
    seq_length: Annotated[int, POSITIONS] | None = Field(
        None, description="training sequence length of the reference run, if known")
    # ---- settings that define the model but hold no parameters (emitted into launch configs) -----------------
    rope_theta: Annotated[float, ROPE_THETA] = Field(
        10000.0, description="RoPE base (HF rope_theta; default 10000 as HF "
                              "LlamaConfig and Megatron-LM --rotary-base)")
    rotary_percent: Annotated[float, ROTARY_PERCENT] = Field(
        1.0, description="fraction of each head's dims rotated by RoPE "
                                  "(HF partial_rotary_factor; Nemotron 0.5)")
    rope_scaling: RopeScalingSpec | None = Field(None, description="RoPE frequency scaling (HF rope_scaling)")
    norm_eps: Annotated[float, NORM_EPS] = Field(
        1e-5, description="epsilon of every norm (HF rms_norm_eps / layer_norm_epsilon "
                            "/ norm_eps; default 1e-5 as Megatron-LM --norm-epsilon)")
    layernorm_1p: bool = Field(False, description="LayerNorm storing gamma - 1 (HF NemotronLayerNorm1P, "
                               "Megatron-LM --apply-layernorm-1p)")
    attention_sinks: bool = Field(False, description="one learned sink logit per attention head and layer (HF "
                                  "GptOssAttention.sinks, num_attention_heads elements; split with the heads)")
    sliding_window: Annotated[int, POSITIONS] | None = Field(None, description="window (tokens) of the sliding-window attention "
                                       "layers (HF sliding_window; gpt-oss 128)")
    layer_types: tuple[Literal["full_attention", "sliding_attention", "chunked_attention"], ...] | None = Field(
        None, description="attention kind of each decoder layer (HF layer_types); None = all full attention. "
                          "Holds no parameters; the cost models price a sliding_attention layer's attention core "
                          "by its window (attention_window) and a chunked_attention layer as full attention (an "
                          "upper bound: no chunk size is recorded)")

    # ---- validation ------------------------------------------------------------------------
    @model_validator(mode="after")
    def _check_consistency(self) -> "ModelSpec":
        if not self.name.strip() or not self.name.isprintable():
            # the name goes into launch scripts' comments, TOML strings and file headers: one printable line
            raise ValueError(f"name {self.name!r} must be one line of printable characters")
        a, g = self.num_attention_heads, self.num_kv_heads
        if a % g != 0:
            raise ValueError(
                f"num_attention_heads ({a}) must be divisible by num_kv_heads ({g})"
            )
        if self.moe is not None:
            m = self.moe
            if m.top_k > m.num_experts:
                raise ValueError(f"moe.top_k ({m.top_k}) must be <= moe.num_experts ({m.num_experts})")
            if m.num_shared_experts > 0 and m.shared_expert_ffn_hidden_size == 0:
                raise ValueError("moe.shared_expert_ffn_hidden_size must be > 0 when moe.num_shared_experts > 0")
            if m.shared_expert_gate and m.shared_expert_ffn_hidden_size == 0:
                raise ValueError("moe.shared_expert_gate requires moe.shared_expert_ffn_hidden_size > 0")
            if m.first_k_dense_layers > self.num_layers:
                raise ValueError(
                    f"moe.first_k_dense_layers ({m.first_k_dense_layers}) exceeds num_layers ({self.num_layers})"
                )
            bad = [i for i in m.dense_layer_indices if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(f"moe.dense_layer_indices {bad} out of range [0, {self.num_layers})")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        if self.layer_types is not None and "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        return self

    # ---- structure -------------------------------------------------------------------------
    def _check_layer(self, i: int) -> None:
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer index {i} out of range [0, {self.num_layers})")

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based) has a routed-expert MLP.

        Rule: after the dense prefix ``first_k_dense_layers`` (DeepSeek ``first_k_dense_replace``),
        layer i is MoE iff ``(i - first_k) % moe_layer_freq == 0`` and i is not listed in
        ``dense_layer_indices`` (Qwen2-MoE/Qwen3-MoE ``mlp_only_layers``). HF qwen2_moe's
        ``(i + 1) % decoder_sparse_step == 0`` is the case ``first_k = step - 1, freq = step``.
        """
        self._check_layer(i)
        return self._table().moe_mask[i]

    def _moe_rule(self, i: int) -> bool:
        m = self.moe
        if m is None:
            return False
        if i < m.first_k_dense_layers or i in m.dense_layer_indices:
            return False
        return (i - m.first_k_dense_layers) % m.moe_layer_freq == 0

    def _table(self) -> "_LayerTable":
        """Per-layer facts computed once per spec object (``_layer_table``): the cost models ask for them per layer,
        per candidate, so on a 4,096-layer model they dominated the search (issue 14)."""
        return _layer_table(self)

    @property
    def num_moe_layers(self) -> int:
        return self._table().num_moe

    @property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        """``is_moe_layer(i)`` for every layer i, computed once per spec."""
        return self._table().moe_mask

    def attention_window(self, i: int) -> int | None:
        """Window (tokens) of decoder layer ``i``'s sliding-window attention: each query attends to itself and the
        ``sliding_window - 1`` keys before it (HF ``sliding_window``; Megatron-LM ``--window-size (w - 1, 0)``);
        None for a full (causal) or chunked attention layer."""
        self._check_layer(i)
        return self._table().window[i]

    def layer_kind(self, i: int) -> tuple[bool, int | None]:
        """Kind of decoder layer ``i``: (MoE MLP, attention window). Every per-layer cost depends on the layer only
        through it (``layer_kinds``)."""
        t = self._table()
        return t.moe_mask[i], t.window[i]

    def layer_kinds(self, layers: Iterable[int] | None = None) -> list[tuple[int, int]]:
        """(a representative layer index, how many) per layer kind (``layer_kind``: dense or MoE, full or windowed
        attention) among ``layers`` (default: all), in order of first appearance. Every per-layer quantity depends on
        the layer only through its kind, so a sum over layers is a sum over these pairs: O(kinds) for the cost models
        instead of O(layers)."""
        t = self._table()
        if layers is None:
            return t.kinds
        first, count = {}, {}
        for i in layers:
            k = t.key[i]
            if k not in first:
                first[k], count[k] = i, 0
            count[k] += 1
        return [(first[k], count[k]) for k in first]

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---- component sizes --------------------------------------------------------------------
    @property
    def _norm_size(self) -> int:
        """Parameters of one norm over h: RMSNorm has a weight (h); LayerNorm weight + bias (2h).

        Nemotron's LayerNorm1P (HF ``NemotronLayerNorm1P(nn.LayerNorm)``) also has weight and bias.
        """
        return self.hidden_size * (2 if self.normalization == "layernorm" else 1)

    @property
    def _attn_out_bias(self) -> bool:
        return self.linear_bias if self.attention_out_bias is None else self.attention_out_bias

    @property
    def _mlp_bias(self) -> bool:
        return self.linear_bias if self.mlp_bias is None else self.mlp_bias

    def _attention_params(self) -> tuple[int, int]:
        """(tp_sharded, replicated) parameters of one self-attention block.

        Standard MHA/GQA (HF LlamaAttention & co.): q_proj h x a*d, k_proj and v_proj h x g*d,
        o_proj a*d x h; biases q/k/v (a*d + 2*g*d, column parallel -> sharded) when ``qkv_bias``;
        o_proj bias h (row parallel -> replicated) when the attention output has a bias.
        q_norm/k_norm (Qwen3 ``Qwen3RMSNorm(head_dim)``) -> 2*d replicated.

        MLA (HF ``DeepseekV3Attention``): q_a_proj h x r_q, q_a_layernorm r_q, q_b_proj
        r_q x a*(d_nope+d_rope) (or q_proj h x a*(d_nope+d_rope) without a q LoRA),
        kv_a_proj_with_mqa h x (r_kv + d_rope), kv_a_layernorm r_kv,
        kv_b_proj r_kv x a*(d_nope + d_v), o_proj a*d_v x h. All projections counted as
        TP-sharded (as in Megatron's theoretical_memory_usage.py P_attn), norms replicated.
        """
        h, a, g, d = self.hidden_size, self.num_attention_heads, self.num_kv_heads, self.head_dim
        sharded = replicated = 0
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank is None:
                sharded += h * a * qk
            else:
                sharded += h * m.q_lora_rank + m.q_lora_rank * a * qk
                replicated += m.q_lora_rank  # q_a_layernorm (RMSNorm)
            sharded += h * (m.kv_lora_rank + m.qk_rope_head_dim)
            replicated += m.kv_lora_rank  # kv_a_layernorm (RMSNorm)
            sharded += m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
            sharded += a * m.v_head_dim * h
            if self.qkv_bias:  # DeepSeek attention_bias: q_a_proj and kv_a_proj biases
                sharded += (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
            if self._attn_out_bias:
                replicated += h
            return sharded, replicated
        sharded += h * a * d + 2 * h * g * d + a * d * h
        if self.qkv_bias:
            sharded += a * d + 2 * g * d
        if self._attn_out_bias:
            replicated += h
        if self.qk_norm:
            replicated += 2 * d
        if self.attention_sinks:  # HF GptOssAttention.sinks: (num_attention_heads,), split with the heads
            sharded += a
        return sharded, replicated

    def _mlp_weights(self, f: int) -> int:
        """Weights of one MLP of width f: 3*h*f gated (gate/up/down), 2*h*f otherwise (fc1/fc2)."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * f

    def _dense_mlp_params(self, f: int) -> tuple[int, int]:
        """(tp_sharded, replicated) of a dense MLP: weights + column-parallel biases (f or 2f)
        sharded; row-parallel fc2/down_proj bias (h) replicated."""
        sharded = self._mlp_weights(f)
        replicated = 0
        if self._mlp_bias:
            sharded += (2 if self.gated_mlp else 1) * f
            replicated += self.hidden_size
        return sharded, replicated

    def layer_params(self, i: int) -> LayerParams:
        """Parameter count of decoder layer ``i`` split by how parallelism shards it (``_layer_params``; the same
        for every layer of a kind, dense or MoE, so computed once per kind)."""
        self._check_layer(i)
        t = self._table()
        return t.moe_params if t.moe_mask[i] else t.dense_params

    def _layer_params(self, i: int) -> LayerParams:
        """Parameter count of decoder layer ``i`` split by how parallelism shards it.

        layer = input norm + attention + post-attention norm + (dense MLP | MoE block).
        MoE block (HF MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / DeepseekV3MoE):
        router h*E (+E score-correction bias, DeepSeek-V3) replicated; E routed experts of
        width f_e (``expert``, top_k of them ``expert_active``); shared expert(s) of total width
        f_sh TP-sharded; Qwen2-MoE ``shared_expert_gate`` Linear(h, 1, bias=False) replicated.
        """
        h = self.hidden_size
        sharded, replicated = self._attention_params()
        replicated += 2 * self._norm_size  # input_layernorm + post_attention_layernorm
        if not self._moe_rule(i):
            f = self.ffn_hidden_size
            if self.moe is not None and self.moe.dense_ffn_hidden_size is not None:
                f = self.moe.dense_ffn_hidden_size
            s, r = self._dense_mlp_params(f)
            return LayerParams(tp_sharded=sharded + s, replicated=replicated + r)
        m = self.moe
        assert m is not None
        replicated += h * m.num_experts + (m.num_experts if m.router_bias else 0)
        replicated += m.num_experts if m.router_linear_bias else 0
        if m.shared_expert_ffn_hidden_size:
            s, r = self._dense_mlp_params(m.shared_expert_ffn_hidden_size)
            sharded += s
            replicated += r
            if m.shared_expert_gate:
                replicated += h
        per_expert = self._mlp_weights(m.expert_ffn_hidden_size)
        if m.expert_bias:  # gate/up biases (2 f_e gated, f_e otherwise) + down bias (h)
            per_expert += (2 if self.gated_mlp else 1) * m.expert_ffn_hidden_size + h
        return LayerParams(
            tp_sharded=sharded,
            replicated=replicated,
            expert=m.num_experts * per_expert,
            expert_active=m.top_k * per_expert,
        )

    # ---- parameter counts (exact, as HF transformers builds them) -----------------------------
    def embedding_params(self) -> int:
        """Input embedding V*h (+ learned positions max_pos*h, GPT-2 ``wpe``; + BLOOM
        ``word_embeddings_layernorm`` 2h). Unpadded V, as HF builds it."""
        h = self.hidden_size
        n = self.vocab_size * h
        if self.position_embedding == "learned":
            n += self.max_position_embeddings * h
        if self.embedding_layernorm:
            n += self._norm_size
        return n

    def final_norm_params(self) -> int:
        """Final norm before the output layer (HF ``model.norm`` / GPT-2 ``ln_f``)."""
        return self._norm_size

    def output_params(self) -> int:
        """Output layer V*h (0 when tied to the input embedding, counted once by HF) + final norm."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return head + self.final_norm_params()

    def num_parameters(self) -> int:
        """Total parameters, HF convention: sum of numel of ``model.parameters()`` (tied weights
        counted once), unpadded vocab, MTP layers excluded (HF does not build them).

        DeepSeek-V3's ``e_score_correction_bias`` (E per MoE layer, ``moe.router_bias``) is excluded here:
        in-tree transformers ``DeepseekV3TopkRouter`` registers it as a buffer, not a parameter
        (58 * 256 = 14,848 elements for DeepSeek-V3). ``layer_params`` still counts it, because it is a
        stored checkpoint tensor (an ``nn.Parameter`` in DeepSeek's own ``modeling_deepseek.py``) that
        occupies memory on every rank.
        """
        return (
            self.embedding_params()
            + sum(self.layer_params(i).total for i in range(self.num_layers))
            + self.output_params()
            - self._router_bias_buffers()
        )

    def num_active_parameters(self) -> int:
        """Parameters touched per token: as ``num_parameters`` with E routed experts replaced by top_k
        (the router-bias buffer excluded likewise)."""
        return (
            self.embedding_params()
            + sum(self.layer_params(i).active for i in range(self.num_layers))
            + self.output_params()
            - self._router_bias_buffers()
        )

    def _router_bias_buffers(self) -> int:
        """Elements of DeepSeek-V3's ``e_score_correction_bias``, a buffer (not a parameter) in HF."""
        return self.num_moe_layers * self.moe.num_experts if self.moe is not None and self.moe.router_bias else 0

    def mtp_layer_params(self) -> LayerParams:
        """One DeepSeek-V3 multi-token-prediction module, without the embedding and output head
        it shares with the main model.

        Source: deepseek-ai/DeepSeek-V3 README_WEIGHTS.md ("MTP Modules": ``enorm`` & ``hnorm``
        RMSNorms, ``eh_proj`` projection, one extra transformer layer structured as the main
        model's layers, ``shared_head`` sharing the output head; 11.5B unique parameters) and
        arXiv:2412.19437 §2.2 (M_k in R^{d x 2d}); the module's own ``shared_head.norm`` RMSNorm
        is in the checkpoint (vLLM ``deepseek_mtp.py`` SharedHead). Layer kind = last decoder
        layer's. Split: eh_proj (2h*h) TP-sharded; enorm, hnorm, shared_head.norm replicated.
        """
        h = self.hidden_size
        base = self.layer_params(self.num_layers - 1)
        return LayerParams(
            tp_sharded=base.tp_sharded + 2 * h * h,
            replicated=base.replicated + 3 * self._norm_size,
            expert=base.expert,
            expert_active=base.expert_active,
        )

    def mtp_params(self) -> int:
        """Unique parameters of all ``num_mtp_layers`` MTP modules (0 when none); see mtp_layer_params."""
        if self.num_mtp_layers == 0:
            return 0
        return self.num_mtp_layers * self.mtp_layer_params().total

    def mtp_active_params(self) -> int:
        if self.num_mtp_layers == 0:
            return 0
        return self.num_mtp_layers * self.mtp_layer_params().active

    def padded_vocab_size(self, tp: int = 1, make_vocab_size_divisible_by: int = 128) -> int:
        """Megatron's padded vocabulary: round V up to a multiple of
        ``make_vocab_size_divisible_by * tp`` (Megatron-LM ``_vocab_size_with_padding`` in
        megatron/training/tokenizer/tokenizer.py)."""
        if tp < 1 or make_vocab_size_divisible_by < 1:
            raise ValueError("tp and make_vocab_size_divisible_by must be >= 1")
        multiple = make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


class _LayerTable:
    """What ``ModelSpec`` computes per layer, once: the MoE mask, the MoE layer count, each layer's attention window
    and kind (MoE, window), and the parameters of a dense and of a MoE layer (every layer of a kind has the same)."""

    __slots__ = ("moe_mask", "num_moe", "dense_params", "moe_params", "kinds", "window", "key")

    def __init__(self, m: ModelSpec):
        self.moe_mask = tuple(m._moe_rule(i) for i in range(m.num_layers))
        self.num_moe = sum(self.moe_mask)
        types = m.layer_types or ("full_attention",) * m.num_layers
        self.window = tuple(m.sliding_window if k == "sliding_attention" else None for k in types)
        self.key = tuple(zip(self.moe_mask, self.window))
        first: dict[tuple, int] = {}
        count: dict[tuple, int] = {}
        for i, k in enumerate(self.key):
            first.setdefault(k, i)
            count[k] = count.get(k, 0) + 1
        self.kinds = [(first[k], count[k]) for k in first]
        dense = next((i for i, x in enumerate(self.moe_mask) if not x), None)
        moe = next((i for i, x in enumerate(self.moe_mask) if x), None)
        self.dense_params = m._layer_params(dense) if dense is not None else None
        self.moe_params = m._layer_params(moe) if moe is not None else None


#: id(spec) -> (spec, its table). Holding the spec keeps its id from being reused; a spec is frozen, and
#: ``model_copy`` makes a new object (a new entry). Bounded: the oldest entries go first.
_TABLES: dict[int, tuple[ModelSpec, _LayerTable]] = {}
_MAX_TABLES = 64


def _layer_table(m: ModelSpec) -> _LayerTable:
    e = _TABLES.get(id(m))
    if e is not None and e[0] is m:
        return e[1]
    t = _LayerTable(m)
    while len(_TABLES) >= _MAX_TABLES:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[id(m)] = (m, t)
    return t
