"""Memory-bound work of a layer and of the model's ends, on one GPU (seconds): HBM traffic at the HBM bandwidth.

Norms, residual adds, activation functions, rotary, dropout, MoE permutation: ``layer_passes`` x 2 bytes x the
hidden state (divided by TP only under sequence parallelism, else replicated on every TP rank) and x the local
attention heads' width (rotary, head layout copies), plus the MLP
activation over the TP-sharded FFN width, plus FP8 casts of GEMM inputs and weights; backward = 2 x forward (the
caller applies it). Output layer: the fused cross-entropy's passes over the ``V/tp`` logits; input: the
embedding gather.
"""
from __future__ import annotations

from typing import NamedTuple

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import BYTES_FP32, ParallelConfig, TrainingJob, compute_bytes
from .flops import layer_gemm_shapes
from .gemm import hbm_rate

#: HBM passes over the 16-bit hidden state per layer forward, by framework, without rotary embeddings
#: (``ROTARY_PASSES``). Megatron-LM / NeMo with Transformer Engine's fused kernels, counted (not fitted): 2 norms
#: (read + write: 2 x 2) and 2 residual adds (2 reads + 1 write: 2 x 3) = 10 (the MLP activation, MoE permutation and
#: FP8 casts are charged apart; biases and dropout are fused into the residual adds). DeepSpeed (Megatron-DeepSpeed,
#: BLOOM era): fitted on the dev rows (``FIT_RANGES``), on the top of its range: memory-bound work the count does not
#: name, or time the other terms do not charge for Megatron-DeepSpeed. torchtitan: counted from its source
#: (``torchtitan_passes``).
ELEMENTWISE_PASSES = {"megatron": 10.0, "nemo": 10.0, "deepspeed": 40.0}
#: Extra passes of rotary position embeddings (read + write of q and k, about the hidden width) in models that use
#: them (``ModelSpec.position_embedding == "rope"``; GPT-3-style learned positions are added once at the input).
ROTARY_PASSES = 2.0

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them), against the fused
#: count of 10 passes (Megatron-LM / NeMo above).
FIT_RANGES = {
    "ELEMENTWISE_PASSES.deepspeed": FitRange(8.0, 40.0, "HBM passes over the hidden state per layer forward",
                                             "Megatron-DeepSpeed (2022): fused softmax and bias-gelu, unfused norms "
                                             "and dropout-add: 1-3x the fused count"),
}


class Passes(NamedTuple):
    """HBM passes of a layer's forward memory-bound work, in units of one 16-bit tensor of each width per token:
    ``hidden`` over the hidden state (norms, residual adds: TP-sharded only under sequence parallelism), ``heads``
    over the hidden width of the local attention heads (rotary, head layout copies: always TP-sharded), ``ffn`` over
    the local FFN width beyond the activation function's own read-2-write-1 (``layer_memory_bound_s``)."""

    hidden: float
    heads: float
    ffn: float = 0.0


def torchtitan_passes(model: ModelSpec, compiled: bool) -> Passes:
    """HBM passes of torchtitan's Llama layer forward, counted kernel by kernel from its source
    (``torchtitan/models/llama/model.py`` and ``models/norms.py`` at 9dec370, 2024-12; bf16 activations, widths
    relative to the hidden size ``h``: query ``q = a d / h``, key/value ``g = kv d / h``).

    Eager PyTorch, one kernel per op: ``RMSNorm`` = ``x.float()`` (read 1, write 2), ``pow(2)`` (2 + 2), ``mean``
    (2), ``x * rsqrt`` (2 + 2), ``type_as`` (2 + 1), ``* weight`` (1 + 1) = 18 per norm, two norms; two residual adds
    (2 reads + 1 write) = 6; rotary on q and k (``float()`` 3, complex multiply 4, ``type_as`` 3) = 10 (q + g);
    ``repeat_kv`` materialises k and v at the query width (read g, write q, each) when ``kv < a``; the attention
    output's ``transpose(1, 2).contiguous()`` (read + write q); SwiGLU as ``silu`` (read + write f) and ``*`` (read 2,
    write 1): 2 FFN passes beyond the fused 3.

    ``torch.compile`` (torchtitan compiles each transformer block, Inductor fuses pointwise chains and reductions):
    the attention norm (read 1, write 1), the first residual add fused with the FFN norm (read 2, write 2), the second
    residual add (read 2, write 1) = 9; rotary on q and k in one kernel (read + write, q + g); ``repeat_kv`` writes k
    and v at the query width (2 q); the attention output copy (2 q).

    ``ROTARY_PASSES`` is not added on top: rotary is counted here."""
    q = model.num_attention_heads * model.head_dim / model.hidden_size
    g = model.num_kv_heads * model.head_dim / model.hidden_size
    rope = model.position_embedding == "rope"
    repeat = model.num_kv_heads < model.num_attention_heads
    if compiled:
        heads = (2 * (q + g) if rope else 0.0) + (2 * q if repeat else 0.0) + 2 * q
        return Passes(hidden=9.0, heads=heads)
    heads = (10 * (q + g) if rope else 0.0) + (2 * (q + g) if repeat else 0.0) + 2 * q
    return Passes(hidden=2 * 18.0 + 6.0, heads=heads, ffn=2.0 if model.gated_mlp else 0.0)


def layer_passes(model: ModelSpec, framework: str) -> Passes:
    """The forward memory-bound passes of one decoder layer under ``framework`` (``ELEMENTWISE_PASSES`` +
    ``ROTARY_PASSES`` for Megatron-LM, NeMo and DeepSpeed; ``torchtitan_passes`` for torchtitan, eager or
    ``torchtitan_compile``)."""
    if framework.split("_")[0] == "torchtitan":
        return torchtitan_passes(model, compiled=framework == "torchtitan_compile")
    base = ELEMENTWISE_PASSES.get(framework, ELEMENTWISE_PASSES["megatron"])
    return Passes(hidden=base, heads=ROTARY_PASSES if model.position_embedding == "rope" else 0.0)


#: Passes over the top_k token copies in MoE permute/unpermute (write + read at dispatch and at combine).
MOE_PERMUTE_PASSES = 4.0
#: HBM bytes per element of one FP8 cast (read 16-bit, write 8-bit).
FP8_CAST_BYTES = 3.0
#: Bytes per element of the fp32 cross-entropy logits, and passes over them (softmax read/write, grad write).
CE_PASSES = 3 * BYTES_FP32


def layer_memory_bound_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                         framework: str) -> tuple[float, float]:
    """(all memory-bound work, the MLP / MoE block's share) of decoder layer ``layer``, forward seconds for one
    micro-batch on one GPU."""
    hbm = hbm_rate(cluster)
    tok = par.micro_batch_size * job.seq_length / par.cp
    h = model.hidden_size
    passes = layer_passes(model, framework)
    hid = tok * h / (par.tp if par.sequence_parallel else 1)
    extra = 0.0
    if model.moe is not None and model.is_moe_layer(layer):
        ffn_act = model.moe.top_k * model.moe.expert_ffn_hidden_size / par.tp
        ffn_act += model.moe.shared_expert_ffn_hidden_size / par.tp
        # permute + unpermute: top_k copies of each hidden state written and read, each way
        extra += MOE_PERMUTE_PASSES * model.moe.top_k * tok * h / par.tp
    else:
        ffn_act = model.ffn_hidden_size / par.tp
    act = (3 + passes.ffn if model.gated_mlp else 2 + passes.ffn) * tok * ffn_act
    ab = compute_bytes(job.precision)  # 4 bytes per activation element in fp32 training
    mem = ab * (passes.hidden * hid + passes.heads * tok * h / par.tp + act + extra) / hbm
    mlp = ab * (act + extra) / hbm
    if job.precision == "fp8":
        mem += fp8_cast_s(model, cluster, job, par, layer)
    return mem, mlp


def fp8_cast_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int) -> float:
    """FP8 quantisation of each GEMM's activation input (read 16-bit, write 8-bit) and of its weight (Transformer
    Engine casts per micro-batch): ``FP8_CAST_BYTES`` per element, forward seconds of one layer.

    The input a GPU casts is its local one: the full width ``k`` for a column-parallel GEMM (QKV, MLP up; the
    sequence-parallel all-gather comes first), ``k / tp`` for a row-parallel one (attention output, MLP down: their
    input is the TP-sharded output of the previous GEMM; Megatron-LM ``RowParallelLinear``), recognised as the TP
    GEMMs whose output width is the hidden size."""
    tok = par.micro_batch_size * job.seq_length / par.cp
    h = model.hidden_size
    cast = 0.0
    for k, n, share, shard, count in layer_gemm_shapes(model, layer):
        if shard == "none":
            continue
        if shard == "tp":
            k_local = k / par.tp if n == h else k
            cast += FP8_CAST_BYTES * (tok * count * k_local + count * k * n / par.tp)
        else:  # routed experts: tokens of the ep ranks, etp-sharded weights
            cast += FP8_CAST_BYTES * (tok * share * count * k / par.tp + count * k * n / (par.ep * par.expert_tp))
    return cast / hbm_rate(cluster)


def cross_entropy_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Fused cross-entropy over the ``V/tp`` fp32 logits of one micro-batch (``CE_PASSES`` bytes per logit),
    seconds; the same in forward and backward."""
    tok = par.micro_batch_size * job.seq_length / par.cp
    return CE_PASSES * tok * model.padded_vocab_size(par.tp) / par.tp / hbm_rate(cluster)


def embedding_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Embedding gather + write of one micro-batch's 16-bit hidden states, forward seconds (backward 2x)."""
    tok = par.micro_batch_size * job.seq_length / par.cp
    return 2 * compute_bytes(job.precision) * tok * model.hidden_size / hbm_rate(cluster)
