"""Model architecture specification (``ModelSpec``) and exact parameter counting.

INTERFACE SKELETON — field names and method signatures are the contract used by ``cost_models`` and
``planner``. Bodies marked TODO are filled in by the model_zoo work.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class MoESpec(BaseModel):
    """Mixture-of-experts block of a decoder layer (all counts are per MoE layer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_experts: int = Field(gt=0, description="routed experts per MoE layer (E)")
    top_k: int = Field(gt=0, description="routed experts per token (k)")
    expert_ffn_hidden_size: int = Field(gt=0, description="FFN width of one routed expert (f_e)")
    num_shared_experts: int = Field(0, ge=0)
    shared_expert_ffn_hidden_size: int = Field(0, ge=0, description="FFN width of ALL shared experts together (f_sh)")
    shared_expert_gate: bool = Field(False, description="sigmoid gate h->1 on the shared expert (qwen2_moe)")
    first_k_dense_layers: int = Field(0, ge=0, description="leading layers with a dense MLP (DeepSeek first_k_dense_replace)")
    moe_layer_freq: int = Field(1, gt=0, description="after the dense prefix, layer i is MoE iff (i - first_k) % freq == 0")
    router_bias: bool = Field(False, description="per-expert router score bias parameter (DeepSeek-V3 e_score_correction_bias)")
    dense_ffn_hidden_size: int | None = Field(None, description="FFN width of the dense layers if different from ModelSpec.ffn_hidden_size")


class MLASpec(BaseModel):
    """Multi-head latent attention dims (DeepSeek-V2/V3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_lora_rank: int | None = None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


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
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0, description="KV heads (query groups); = num_attention_heads for MHA")
    head_dim: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0)
    gated_mlp: bool = Field(description="SwiGLU/GeGLU: three h x f matrices instead of two")
    activation: str = "swiglu"
    normalization: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    qkv_bias: bool = False
    linear_bias: bool = Field(False, description="biases on attention output and MLP linears (GPT-2/BLOOM style)")
    qk_norm: bool = False
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    position_embedding: Literal["rope", "learned", "alibi", "none"] = "rope"
    max_position_embeddings: int = 4096
    embedding_layernorm: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    num_mtp_layers: int = Field(0, ge=0, description="multi-token-prediction layers (DeepSeek-V3); not built by HF")

    # ---- structure -------------------------------------------------------------------------
    def is_moe_layer(self, i: int) -> bool: ...  # TODO
    @property
    def num_moe_layers(self) -> int: ...  # TODO
    @property
    def num_dense_layers(self) -> int: ...  # TODO

    # ---- parameter counts (exact, as HF transformers builds them) -----------------------------
    def layer_params(self, i: int) -> LayerParams: ...  # TODO
    def embedding_params(self) -> int: ...  # TODO input embedding (+ learned positions, + embedding norm)
    def output_params(self) -> int: ...  # TODO output layer (0 when tied) + final norm
    def num_parameters(self) -> int: ...  # TODO total, HF convention
    def num_active_parameters(self) -> int: ...  # TODO
    def padded_vocab_size(self, tp: int = 1, make_vocab_size_divisible_by: int = 128) -> int: ...  # TODO
