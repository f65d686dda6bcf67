"""Per-GPU memory of every pipeline stage (bytes).

Terms and their sources:

* Model states (weights, gradients, optimizer) — mixed-precision Adam with 16-bit weights, fp32 main
  gradients and fp32 master weights + Adam moments: 2 + 4 + 12 = 18 bytes/parameter, Megatron-LM
  ``theoretical_memory_usage.py`` (formulas.md Sec. 1.3). ZeRO stages after Rajbhandari et al. SC20 Sec. 5
  (formulas.md Sec. 4.1): stage 1 (= Megatron's distributed optimizer, ``6 + 12/d``) shards the 12 optimizer
  bytes, stage 2 also the gradients, stage 3 also the weights, each over the data-parallel x context-parallel
  group (Megatron shards over ``intra_dp_cp_group``; formulas.md Sec. 1.5). Expert parameters are sharded by
  ``ep x etp`` and their states over the expert data-parallel group ``world / (etp x ep x pp)``.
* Activations per layer and micro-batch — Korthikanti et al. 2022 (K22) Sec. 4.1 term by term (formulas.md
  Sec. 2), generalised to GQA (K and V are ``g*d_h`` wide), gated MLPs (SwiGLU's fc1 output is ``2f`` wide),
  fused attention (no ``5*a*s^2*b`` score term, only the fp32 log-sum-exp ``4*a*s*b``), dropout on/off (1-byte
  masks), context parallelism (each rank holds ``s/cp`` tokens) and MoE (``top_k`` token copies through the
  experts, K22's per-token terms applied to the expert FFN width).
* In-flight micro-batches — 1F1B: stage i holds ``min(pp - i, m)``; interleaved 1F1B: Megatron's warm-up of
  ``(pp - i - 1)*2 + (vpp - 1)*pp + 1`` model chunks (formulas.md Sec. 5; equals K22's first-stage factor
  ``1 + (p-1)/(p*v)``); GPipe: ``m``; ZB-H1: as 1F1B (Qi et al. 2024, Table 1).
* Logits on the last stage: bf16 output-layer result plus its fp32 copy in the vocab-parallel cross entropy,
  ``s*b*V/tp*(2+4)`` bytes for one micro-batch (Megatron ``fused_vocab_parallel_cross_entropy`` upcasts; the
  Megatron estimator counts the 4-byte part only, formulas.md Sec. 1.4 step 6).
* ZeRO-3 all-gather buffers: the 16-bit parameters of the largest layer, twice (current + prefetch), after
  DeepSpeed's estimator term ``4 * largest_layer_params`` (formulas.md Sec. 4.2).
* Reserve: CUDA context and allocator fragmentation, from the cluster's calibration.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob
from .layout import stage_layer_ranges

#: Adam: fp32 master weights + first and second moments (ZeRO paper K = 12, Sec. 3.1).
OPTIMIZER_BYTES_PER_PARAM = 12
#: Megatron keeps fp32 main gradients (formulas.md Sec. 1.3: the 4 of 18 bytes).
GRAD_BYTES_PER_PARAM = BYTES_FP32
#: 16-bit parameters.
WEIGHT_BYTES_PER_PARAM = BYTES_16BIT
#: Token ids + position ids held for the first stage's embedding, 8 bytes/token (Megatron estimator, Sec. 1.4).
TOKEN_ID_BYTES = 8


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage, split by the group that shards their optimizer state."""

    dense: float  # after TP sharding; states sharded over dp x cp
    expert: float  # after EP x ETP sharding; states sharded over the expert data-parallel group
    largest_layer: float  # 16-bit gather unit for ZeRO-3 (params of the largest layer on this GPU)

    @property
    def total(self) -> float:
        return self.dense + self.expert


@dataclass
class StageMemory:
    """Peak bytes on one GPU of pipeline stage ``stage`` by term."""

    stage: int
    num_layers: int
    num_parameters: float
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    logits: float
    buffers: float
    reserve: float
    in_flight_microbatches: float

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer_states + self.activations + self.logits
                + self.buffers + self.reserve)

    def terms(self) -> dict[str, float]:
        """Term name -> bytes, largest first."""
        t = {"weights": self.weights, "gradients": self.gradients, "optimizer_states": self.optimizer_states,
             "activations": self.activations, "logits": self.logits, "buffers": self.buffers,
             "reserve": self.reserve}
        return dict(sorted(t.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class MemoryEstimate:
    """Per-stage memory; ``peak_bytes`` is the most loaded stage's total."""

    stages: list[StageMemory] = field(default_factory=list)
    capacity_bytes: int = 0

    @property
    def peak_stage(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.total, -s.stage))

    @property
    def peak_bytes(self) -> float:
        return self.peak_stage.total

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_bytes


def stage_params(model: ModelSpec, par: ParallelConfig, stage: int, layers: range, tp_vocab: int) -> StageParams:
    """Parameters on one GPU of ``stage``: its layers, plus the embedding (first stage) and the output layer and
    final norm (last stage; with tied embeddings and pp > 1 the last stage keeps its own copy of the word
    embeddings for the output layer, as Megatron does: ``share_embeddings_and_output_weights``)."""
    tp, ets = par.tp, par.ep * par.expert_tp
    dense = 0.0
    expert = 0.0
    largest = 0.0
    for i in layers:
        lp = model.layer_params(i)
        d = lp.tp_sharded / tp + lp.replicated
        e = lp.expert / ets
        dense += d
        expert += e
        largest = max(largest, d + e)
    h = model.hidden_size
    emb_table = tp_vocab * h / tp
    if stage == 0:
        extra = model.embedding_params() - model.vocab_size * h  # learned positions / embedding norm
        dense += emb_table + extra
    if stage == par.pp - 1:
        out = model.output_params()
        final_norm = out - (0 if model.tie_word_embeddings else model.vocab_size * h)
        dense += final_norm
        if not model.tie_word_embeddings or par.pp > 1:
            dense += emb_table
    return StageParams(dense=dense, expert=expert, largest_layer=largest)


def activation_bytes_per_layer(model: ModelSpec, job: TrainingJob, par: ParallelConfig, layer: int) -> float:
    """Stored activation bytes of one decoder layer for one micro-batch on one GPU, no recompute (K22 Sec. 4.1,
    generalised as described in the module docstring)."""
    b, s, h, t = par.micro_batch_size, job.seq_length / par.cp, model.hidden_size, par.tp
    sb = s * b
    a, g = model.num_attention_heads, model.num_kv_heads
    if model.mla is not None:
        q_w = a * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim)
        kv_w = q_w  # K is materialised per head after the up-projection
        v_w = a * model.mla.v_head_dim
        latent = model.mla.kv_lora_rank + (model.mla.q_lora_rank or 0)
    else:
        q_w = a * model.head_dim
        kv_w = g * model.head_dim
        v_w = kv_w
        latent = 0
    drop = 1 if job.dropout else 0
    # Outside the TP region (split only under SP): 2 norm inputs, QKV and fc1 GEMM inputs (K22: 4+4), 2 masks.
    outside = sb * h * (8 + 2 * drop)
    if par.sequence_parallel:
        outside /= t
    # Attention inside TP: Q, K, V, context (output-projection input); MLA latents are replicated.
    attn = sb * 2 * (q_w + kv_w + v_w + v_w) / t + sb * 2 * latent
    if job.flash_attention:
        attn += 4 * a * sb / t  # fp32 log-sum-exp per head and token
    elif par.recompute != "selective":
        # K22: softmax output 2as^2b, dropout mask as^2b, dropout output 2as^2b (s here is the local s/cp
        # for queries; keys span the whole sequence under CP).
        attn += (2 + 3 * drop) * a * s * job.seq_length * b / t
    # MLP
    mult = 2 if model.gated_mlp else 1
    if model.moe is not None and model.is_moe_layer(layer):
        moe = model.moe
        k = moe.top_k
        fe = moe.expert_ffn_hidden_size / par.expert_tp
        # k routed copies of each token: dispatched input (2h), fc1 output (2*mult*fe), fc2 input (2fe),
        # combine input (2h); tokens are spread evenly over EP ranks (uniform routing).
        mlp = sb * k * (2 * h * 2 + 2 * mult * fe + 2 * fe)
        if moe.shared_expert_ffn_hidden_size:
            fs = moe.shared_expert_ffn_hidden_size / t
            mlp += sb * (2 * mult * fs + 2 * fs)
        mlp += sb * 4 * moe.num_experts  # fp32 router logits
    else:
        f = (model.moe.dense_ffn_hidden_size if model.moe and model.moe.dense_ffn_hidden_size else
             model.ffn_hidden_size)
        mlp = sb * (2 * mult * f + 2 * f) / t
    return outside + attn + mlp


def layer_input_bytes(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Bytes of one layer's input (the checkpoint kept under full recompute): ``2*s*b*h``, ``/tp`` under SP
    (K22 Table 2 "full recompute" row; derived note in formulas.md Sec. 2)."""
    x = BYTES_16BIT * job.seq_length / par.cp * par.micro_batch_size * model.hidden_size
    return x / par.tp if par.sequence_parallel else x


def in_flight_microbatches(par: ParallelConfig, stage: int, num_microbatches: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in whole-stage units (formulas.md Sec. 5).

    For interleaved 1F1B the count is of model chunks divided by ``vpp`` (each chunk is 1/vpp of the stage).
    """
    p, v, m = par.pp, par.vpp, max(1, num_microbatches)
    sched = par.pipeline_schedule
    if p == 1:
        return 1.0
    if sched == "gpipe":
        return float(m)
    if sched == "interleaved" and v > 1:
        chunks = (p - stage - 1) * 2 + (v - 1) * p + 1
        return min(chunks, m * v) / v
    return float(min(p - stage, m))


def estimate_memory(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig) -> MemoryEstimate:
    """Per-stage memory of ``par`` (bytes). ``capacity_bytes`` is the GPU's usable memory (nvidia-smi).

    Raises:
        LayoutError: the layer split is impossible for this ``pp``.
    """
    m = par.num_microbatches(job.global_batch_size)
    vocab = model.padded_vocab_size(par.tp)
    dense_shard = par.dp * par.cp
    expert_shard = par.expert_dp
    z = par.zero_stage
    ranges = stage_layer_ranges(model.num_layers, par)
    layer_in = layer_input_bytes(model, job, par)
    out: list[StageMemory] = []
    for stage, layers in enumerate(ranges):
        sp = stage_params(model, par, stage, layers, vocab)
        w_div_d = dense_shard if z >= 3 else 1
        w_div_e = expert_shard if z >= 3 else 1
        g_div_d = dense_shard if z >= 2 else 1
        g_div_e = expert_shard if z >= 2 else 1
        o_div_d = dense_shard if z >= 1 else 1
        o_div_e = expert_shard if z >= 1 else 1
        weights = WEIGHT_BYTES_PER_PARAM * (sp.dense / w_div_d + sp.expert / w_div_e)
        grads = GRAD_BYTES_PER_PARAM * (sp.dense / g_div_d + sp.expert / g_div_e)
        opt = OPTIMIZER_BYTES_PER_PARAM * (sp.dense / o_div_d + sp.expert / o_div_e)

        # Activations of one micro-batch through this stage's layers.
        per_layer = [activation_bytes_per_layer(model, job, par, i) for i in layers]
        if par.recompute == "full":
            n_rc = len(per_layer) if par.recompute_num_layers is None else min(par.recompute_num_layers, len(per_layer))
            stored = layer_in * n_rc + sum(sorted(per_layer)[: len(per_layer) - n_rc])
            working = max(per_layer, default=0.0)  # one layer recomputed at a time in backward
        else:
            stored = sum(per_layer)
            working = 0.0
        if stage == 0:
            tokens = job.seq_length / par.cp * par.micro_batch_size
            stored += TOKEN_ID_BYTES * tokens + (tokens * model.hidden_size if job.dropout else 0) / (
                par.tp if par.sequence_parallel else 1)
        n_inflight = in_flight_microbatches(par, stage, m)
        acts = stored * n_inflight + working
        logits = 0.0
        if stage == par.pp - 1:
            tokens = job.seq_length / par.cp * par.micro_batch_size
            logits = tokens * vocab / par.tp * (BYTES_16BIT + BYTES_FP32)
        buffers = 0.0
        if z >= 3:
            buffers += 2 * BYTES_16BIT * sp.largest_layer  # gathered layer + prefetched next layer
        out.append(StageMemory(
            stage=stage, num_layers=len(layers), num_parameters=sp.total, weights=weights, gradients=grads,
            optimizer_states=opt, activations=acts, logits=logits, buffers=buffers,
            reserve=float(cluster.calibration.memory_reserve_bytes), in_flight_microbatches=n_inflight))
    return MemoryEstimate(stages=out, capacity_bytes=cluster.gpu.memory_bytes)
