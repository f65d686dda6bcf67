"""Memory-bound work of a layer and of the model's ends, on one GPU (seconds): HBM traffic at the HBM bandwidth.

Norms, residual adds, activation functions, rotary, dropout, MoE permutation: ``ELEMENTWISE_PASSES`` x 2 bytes x
the hidden state (divided by TP only under sequence parallelism, else replicated on every TP rank), plus the MLP
activation over the TP-sharded FFN width, plus FP8 casts of GEMM inputs and weights; backward = 2 x forward (the
caller applies it). Output layer: the fused cross-entropy's passes over the ``V/tp`` logits; input: the
embedding gather.
"""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob
from .flops import layer_gemm_shapes
from .gemm import hbm_rate

#: HBM passes over the 16-bit hidden state per layer forward, by framework, without rotary embeddings
#: (``ROTARY_PASSES``). Megatron-LM / NeMo with Transformer Engine's fused kernels, counted (not fitted): 2 norms
#: (read + write: 2 x 2) and 2 residual adds (2 reads + 1 write: 2 x 3) = 10 (the MLP activation, MoE permutation and
#: FP8 casts are charged apart; biases and dropout are fused into the residual adds). DeepSpeed (Megatron-DeepSpeed, BLOOM era), torchtitan eager PyTorch (RMSNorm and rotary as several
#: kernels each), and with torch.compile fusing elementwise chains: fitted on the dev rows (``FIT_RANGES``);
#: DeepSpeed (40) sits on the top of its range: memory-bound work the count does not name, or time the other terms
#: do not charge for Megatron-DeepSpeed.
ELEMENTWISE_PASSES = {"megatron": 10.0, "nemo": 10.0, "deepspeed": 40.0, "torchtitan": 74.7,
                      "torchtitan_compile": 13.7}
#: Extra passes of rotary position embeddings (read + write of q and k, about the hidden width) in models that use
#: them (``ModelSpec.position_embedding == "rope"``; GPT-3-style learned positions are added once at the input).
ROTARY_PASSES = 2.0

#: Plausible ranges of the fitted constants above (``planner/calibration.py`` fits inside them), against the fused
#: count of 10 passes (Megatron-LM / NeMo above).
FIT_RANGES = {
    "ELEMENTWISE_PASSES.deepspeed": FitRange(8.0, 40.0, "HBM passes over the hidden state per layer forward",
                                             "Megatron-DeepSpeed (2022): fused softmax and bias-gelu, unfused norms "
                                             "and dropout-add: 1-3x the fused count"),
    "ELEMENTWISE_PASSES.torchtitan": FitRange(16.0, 80.0, "HBM passes over the hidden state per layer forward",
                                              "eager PyTorch: RMSNorm (~6 kernels), rotary (~8), SwiGLU and adds each "
                                              "a read/write pass: 2-6x the fused count"),
    "ELEMENTWISE_PASSES.torchtitan_compile": FitRange(2.0, 16.0, "HBM passes over the hidden state per layer forward",
                                                      "torch.compile fuses the elementwise chains into the norms "
                                                      "and GEMM epilogues: at most the fused count"),
}
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
    passes = ELEMENTWISE_PASSES.get(framework, ELEMENTWISE_PASSES["megatron"])
    if model.position_embedding == "rope":
        passes += ROTARY_PASSES
    hid = tok * h / (par.tp if par.sequence_parallel else 1)
    extra = 0.0
    if model.moe is not None and model.is_moe_layer(layer):
        ffn_act = model.moe.top_k * model.moe.expert_ffn_hidden_size / par.tp
        ffn_act += model.moe.shared_expert_ffn_hidden_size / par.tp
        # permute + unpermute: top_k copies of each hidden state written and read, each way
        extra += MOE_PERMUTE_PASSES * model.moe.top_k * tok * h / par.tp
    else:
        ffn_act = model.ffn_hidden_size / par.tp
    act = (3 if model.gated_mlp else 2) * tok * ffn_act
    mem = BYTES_16BIT * (passes * hid + act + extra) / hbm
    mlp = BYTES_16BIT * (act + extra) / hbm
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
    return 2 * BYTES_16BIT * tok * model.hidden_size / hbm_rate(cluster)
