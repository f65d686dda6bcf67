"""Memory-bound work of a layer and of the model's ends, on one GPU (seconds): HBM traffic at the HBM bandwidth.

Norms, residual adds, activation functions, rotary, dropout (the MoE token permutation is ``moe_overhead``'s):
``layer_passes`` x 2 bytes x the
hidden state (divided by TP only under sequence parallelism, else replicated on every TP rank) and x the local
attention heads' width (rotary, head layout copies), plus the MLP
activation over the TP-sharded FFN width, plus FP8 casts of GEMM inputs and weights; backward = 2 x forward (the
caller applies it). Output layer: the cross-entropy's HBM bytes over the ``V/tp`` logits, by implementation
(``CE_BYTES_PER_LOGIT``); input: the embedding gather.
"""
from __future__ import annotations

from typing import NamedTuple

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .fit_range import FitRange
from .config import ParallelConfig, TrainingJob, compute_bytes
from .flops import layer_gemm_shapes
from .fp8_recipe import CURRENT_SCALING_RECIPES, job_fp8_recipe
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
#: Extra forward passes over the local FFN width of activations Megatron-LM / NeMo / Megatron-DeepSpeed run unfused,
#: beyond the fused read-1-write-1: megatron-core's ``MLP.forward`` fuses only GeLU and SwiGLU
#: (``bias_activation_fusion``: "Only support fusion of gelu and swiglu", ``transformer/mlp.py`` at f2e5db40), so
#: squared ReLU (``relu2``, Nemotron; ``torch.pow(F.relu(x), 2)``: two kernels, each reading and writing the FFN
#: width) costs 2 more.
UNFUSED_ACTIVATION_PASSES = {"relu2": 2.0}
#: HBM bytes per hidden-state element of the hidden-dropout masks a layer forward writes (its backward reads them):
#: the two fused bias-dropout-adds (after attention and after the MLP, Megatron-LM ``bias_dropout_add_fused_train``)
#: each keep a 1-byte mask (PyTorch ``native_dropout``'s bool mask; Korthikanti et al. 2022 Sec. 4.1 count the same
#: ``sbh`` bytes per dropout). torchtitan's models have no dropout layers.
DROPOUT_MASK_BYTES = 2.0

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
    ``ROTARY_PASSES`` and ``UNFUSED_ACTIVATION_PASSES`` for Megatron-LM, NeMo and DeepSpeed; ``torchtitan_passes``
    for torchtitan, eager or ``torchtitan_compile``)."""
    if framework.split("_")[0] == "torchtitan":
        return torchtitan_passes(model, compiled=framework == "torchtitan_compile")
    base = ELEMENTWISE_PASSES.get(framework, ELEMENTWISE_PASSES["megatron"])
    return Passes(hidden=base, heads=ROTARY_PASSES if model.position_embedding == "rope" else 0.0,
                  ffn=UNFUSED_ACTIVATION_PASSES.get(model.activation, 0.0))


#: HBM bytes per element of one FP8 cast (read 16-bit, write 8-bit).
FP8_CAST_BYTES = 3.0
#: HBM bytes per element of the amax pass that per-tensor current scaling runs before each cast (reads the 16-bit
#: tensor once more: ``fp8_recipe.CURRENT_SCALING_RECIPES``).
FP8_AMAX_PASS_BYTES = 2.0
#: HBM bytes per logit of one micro-batch's cross-entropy (forward, backward) by implementation
#: (``cross_entropy_impl``), counted kernel by kernel from each source; the logits GEMM writes 16-bit logits.
#:
#: * ``unfused``: Megatron-LM ``tensor_parallel.vocab_parallel_cross_entropy`` (``megatron/core/tensor_parallel/
#:   cross_entropy.py`` at f2e5db40, 2024-07; the same ops in Megatron-DeepSpeed and the 2021 SC21 code):
#:   forward ``.float()`` (read 2, write 4), ``max`` (4), in-place ``-= max`` (4 + 4), in-place ``exp`` (4 + 4),
#:   ``sum`` (4), in-place ``div_`` (4 + 4) = 38; backward in-place ``mul_`` (4 + 4) and the ``.float()``'s
#:   backward cast to 16 bits (4 + 2) = 14.
#: * ``native``: the same functions under ``jit_fuser`` (``--cross-entropy-loss-fusion``,
#:   ``megatron/core/fusions/fused_cross_entropy.py``; ``torch.compile`` from PyTorch 2.2): the cast fused with the
#:   max (2 + 4), subtract / exp / sum in one kernel (4 + 4), ``div_`` (4 + 4) = 22; backward ``mul_`` written back
#:   into the saved softmax and cast (4 + 4 + 2) = 10.
#: * ``te``: Transformer Engine's Triton ``parallel_cross_entropy`` (``transformer_engine/pytorch/triton/
#:   cross_entropy.py``, v2.8): ``online_softmax_kernel`` reads the 16-bit logits (2), ``cross_entropy_kernel``
#:   reads them again and writes the gradient in place (2 + 2) = 6; backward ``element_mul_kernel`` scales it in
#:   place by the per-token loss gradient (2 + 2) = 4.
#: * ``eager``: PyTorch ``F.cross_entropy(pred.float(), labels)`` (torchtitan ``train.py`` at ba246978, 2024-12):
#:   ``.float()`` (2 + 4), ``log_softmax`` over rows too long for shared memory (``cunn_SoftMaxForward``: max,
#:   sum-exp and write passes, 4 + 4 + 4 + 4) = 22; backward ``nll_loss`` zero-filled gradient (4),
#:   ``log_softmax_backward`` (sum pass 4, then 4 + 4 + 4) and the cast (4 + 2) = 26.
#: * ``compiled``: the same under ``torch.compile`` (torchtitan ``components/loss.py`` ``build_cross_entropy_loss``,
#:   2025): Inductor reads the 16-bit logits for the max and the sum-exp (2 + 2) and saves only the row statistics;
#:   backward recomputes the softmax from the logits and writes the 16-bit gradient (2 + 2).
CE_BYTES_PER_LOGIT: dict[str, tuple[float, float]] = {
    "unfused": (38.0, 14.0), "native": (22.0, 10.0), "te": (6.0, 4.0), "eager": (22.0, 26.0), "compiled": (4.0, 4.0)}


def layer_memory_bound_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
                         framework: str) -> tuple[float, float]:
    """(all memory-bound work, the MLP / MoE block's share) of decoder layer ``layer``, forward seconds for one
    micro-batch on one GPU."""
    hbm = hbm_rate(cluster)
    tok = par.micro_batch_size * job.seq_length / par.cp
    h = model.hidden_size
    passes = layer_passes(model, framework)
    hid = tok * h / (par.tp if par.sequence_parallel else 1)
    if model.moe is not None and model.is_moe_layer(layer):  # the token permutation: moe_overhead.moe_routing_s
        ffn_act = model.moe.top_k * model.moe.expert_ffn_hidden_size / par.tp
        ffn_act += model.moe.shared_expert_ffn_hidden_size / par.tp
    else:
        ffn_act = model.ffn_hidden_size / par.tp
    act = (3 + passes.ffn if model.gated_mlp else 2 + passes.ffn) * tok * ffn_act
    ab = compute_bytes(job.precision)  # 4 bytes per activation element in fp32 training
    mem = ab * (passes.hidden * hid + passes.heads * tok * h / par.tp + act) / hbm
    if job.dropout and framework.split("_")[0] != "torchtitan":
        mem += DROPOUT_MASK_BYTES * hid / hbm
    mlp = ab * act / hbm
    if job.precision == "fp8":
        mem += fp8_cast_s(model, cluster, job, par, layer, framework)
    return mem, mlp


def fp8_cast_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
               framework: str = "megatron") -> float:
    """FP8 quantisation of each GEMM's activation input (read 16-bit, write 8-bit) and of its weight (Transformer
    Engine casts per micro-batch): ``FP8_CAST_BYTES`` per element, plus ``FP8_AMAX_PASS_BYTES`` under a per-tensor
    current-scaling recipe (``fp8_recipe.job_fp8_recipe`` in ``CURRENT_SCALING_RECIPES``), forward seconds of one
    layer.

    The input a GPU casts is its local one: the full width ``k`` for a column-parallel GEMM (QKV, MLP up; the
    sequence-parallel all-gather comes first), ``k / tp`` for a row-parallel one (attention output, MLP down: their
    input is the TP-sharded output of the previous GEMM; Megatron-LM ``RowParallelLinear``), recognised as the TP
    GEMMs whose output width is the hidden size."""
    tok = par.micro_batch_size * job.seq_length / par.cp
    h = model.hidden_size
    per_el = FP8_CAST_BYTES
    if job_fp8_recipe(job, cluster, model, par, framework) in CURRENT_SCALING_RECIPES:
        per_el += FP8_AMAX_PASS_BYTES
    elements = 0.0
    for k, n, share, shard, count in layer_gemm_shapes(model, layer):
        if shard == "none":
            continue
        if shard == "tp":
            k_local = k / par.tp if n == h else k
            elements += tok * count * k_local + count * k * n / par.tp
        else:  # routed experts: tokens of the ep ranks, etp-sharded weights
            elements += tok * share * count * k / par.tp + count * k * n / (par.ep * par.expert_tp)
    return per_el * elements / hbm_rate(cluster)


def cross_entropy_impl(job: TrainingJob, framework: str) -> str:
    """The cross-entropy implementation (a ``CE_BYTES_PER_LOGIT`` key) the framework runs for ``job``, by
    ``TrainingJob.cross_entropy_loss_fusion``, None meaning the framework's default:

    * Megatron-LM / NeMo: Transformer Engine's where the job asks for it (``cross_entropy_fusion_impl`` 'te', which
      Megatron-LM uses only with the fusion on, and the Megatron launch passes with ``--cross-entropy-loss-fusion``),
      else the jit-fused loss when fused, else the unfused vocab-parallel loss. Megatron-LM leaves the fusion off
      (``--cross-entropy-loss-fusion``, ``megatron/training/arguments.py``); NeMo 2.0 turns it on
      (``GPTConfig.cross_entropy_loss_fusion = True`` since NeMo PR 10209, 2024-09).
    * Megatron-DeepSpeed: unfused (its 2021-era vocab-parallel loss; no fusion option).
    * torchtitan: compiled (``components/loss.py`` ``build_cross_entropy_loss`` compiles it whenever
      ``training.compile`` is on, which plan3d's torchtitan launch always sets, ``planner/emit/torchtitan.py``); eager
      with the fusion off (runs without ``torch.compile``, or torchtitan before 2025)."""
    fused = job.cross_entropy_loss_fusion
    fw_base = framework.split("_")[0]
    if fw_base == "torchtitan":
        return "eager" if fused is False else "compiled"
    if fw_base == "deepspeed":
        return "native" if fused else "unfused"
    if fused is not False and job.cross_entropy_fusion_impl == "te":
        return "te"
    return "native" if (fw_base == "nemo" if fused is None else fused) else "unfused"


def cross_entropy_bytes(job: TrainingJob, framework: str) -> tuple[float, float]:
    """(forward, backward) HBM bytes per logit of the framework's cross-entropy for ``job`` (``CE_BYTES_PER_LOGIT``
    of ``cross_entropy_impl``)."""
    return CE_BYTES_PER_LOGIT[cross_entropy_impl(job, framework)]


def cross_entropy_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                    framework: str) -> tuple[float, float]:
    """(forward, backward) seconds of the cross-entropy over the ``V/tp`` logits of one micro-batch:
    ``cross_entropy_bytes`` at the HBM bandwidth."""
    logits = par.micro_batch_size * job.seq_length / par.cp * model.padded_vocab_size(par.tp) / par.tp
    fwd_b, bwd_b = cross_entropy_bytes(job, framework)
    hbm = hbm_rate(cluster)
    return fwd_b * logits / hbm, bwd_b * logits / hbm


def embedding_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig) -> float:
    """Embedding gather + write of one micro-batch's 16-bit hidden states, forward seconds (backward 2x)."""
    tok = par.micro_batch_size * job.seq_length / par.cp
    return 2 * compute_bytes(job.precision) * tok * model.hidden_size / hbm_rate(cluster)
