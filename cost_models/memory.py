"""Per-GPU memory of every pipeline stage (bytes), per phase of a training step.

Every stage's peak is the maximum over three phases (forward, backward, optimizer step); each phase is the sum
of the persistent model states, what that phase keeps alive, and the transient buffers it allocates.

Model states (bytes per parameter, 16-bit training with Adam), by ``framework``:

* ``megatron``: 16-bit weights 2 + fp32 main gradients 4 (2 with ``--grad-reduce-in-bf16``) + fp32 master weights
  and Adam moments 12 = 18 (Megatron-LM ``theoretical_memory_usage.py``; formulas.md Sec. 1.3). The distributed
  optimizer (``zero_stage`` 1) shards the 12 bytes over the DP x CP group, ``6 + 12/d`` (formulas.md Sec. 1.5,
  4.3); Megatron-FSDP's ``optim_grads`` / ``optim_grads_params`` (``zero_stage`` 2 / 3) also shard the gradients /
  the weights (formulas.md Sec. 4.3).
* ``deepspeed``: DeepSpeed's own estimator (``deepspeed/runtime/zero/stage_1_and_2.py``
  ``estimate_zero2_model_states_mem_needs``: "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit +
  4_params_32bit + 8_optimizer_states_32bit"; ``stage3.py`` ``estimate_zero3_model_states_mem_needs``:
  ``4*largest_layer + 18*P/N``; deepspeed 0.19.8, formulas.md Sec. 4.2). ZeRO-0: 2 + 2 + 16 = 20 (Megatron docs
  ``dist_optimizer.md``, fp16-param row); ZeRO-1: 2 + 2 + 16/N; ZeRO-2: 2 + 18/N; ZeRO-3: 18/N plus the
  ``4 * largest_layer`` gather buffer (16-bit parameters and gradients of the largest module).
* ``torchtitan`` (FSDP2, ``zero_stage`` 3; 0 = DDP/replicate): fp32 sharded parameters 4 + fp32 gradients 4 + Adam
  8 = 16 per parameter (formulas.md Sec. 4.4: ``mixed_precision_param`` bf16 is the *compute* copy, the sharded
  parameter stays fp32), sharded over ``dp x cp`` or over the HSDP shard group ``hsdp_shard_size``.

Recipe knobs (``ParallelConfig``, Megatron only; defaults are Megatron-LM's): ``fp8_param_gather`` stores 1-byte
weights (``FP8_PARAM_BYTES``); ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` set the Adam moment bytes of the 12 (4 fp32
master + 4 + 4; ``--use-precision-aware-optimizer``); ``optimizer_cpu_offload_fraction`` moves that share of the
master weights and moments to the host (``--optimizer-cpu-offload``); ``TrainingJob.cross_entropy_fusion_impl`` 'te'
keeps 2 bytes per logit (``TE_CROSS_ENTROPY_BYTES_PER_ELEMENT``).

Expert parameters are sharded by ``ep x etp`` and their optimizer states over the expert data-parallel group
``world / (etp x ep x pp)`` (Megatron ``parallel_state``; formulas.md Sec. 1.3).

Activations per layer and micro-batch, and the micro-batches in flight on each pipeline stage:
``cost_models/activations.py``.

Logits on the last stage, bytes per element of ``s*b*V/tp``: Megatron's fused vocab-parallel cross entropy keeps
the bf16 output-layer result and its fp32 copy (2 + 4 = 6; ``megatron/core/tensor_parallel/cross_entropy.py``
computes the gradient in place). Eager ``F.cross_entropy(logits.float())`` (torchtitan, HF/DeepSpeed) holds in
backward the saved fp32 log-softmax, its fp32 gradient and the fp32 input gradient (4 + 4 + 4 = 12; derived
from PyTorch's ``log_softmax_backward``); compiled (torchtitan's launch compiles its loss) only the bf16 logits and
their bf16 gradient (2 + 2 = 4, measured: ``COMPILED_CROSS_ENTROPY_BYTES_PER_ELEMENT``); Transformer Engine's loss
2 (``logits_bytes_per_element``).

Transients (derived; each named in the phase breakdown):

* backward working set: the gradients of one layer's activations, as large as that layer's stored activations
  (twice that under full recompute: the recomputed activations plus their gradients). Calibrated by F06
  (field_cases.md; Llama-2-7B, four configurations, measured within 2%).
* unfused attention (flash off): the fp32 ``QK^T`` score tensor ``4*a*s^2*b/t`` of the running layer
  (field_cases.md F07: "+2048 MiB at the QK^T matmul").
* optimizer step: an fp32 temporary the size of the local optimizer partition, ``4*P/N`` (``exp_avg_sq.sqrt()``
  in DeepSpeed/torch Adam; field_cases.md F02 reproduces the failing 3.14 GiB allocation exactly; torch
  ``_multi_tensor_adam`` ``torch._foreach_sqrt``). Megatron uses apex/TE ``FusedAdam`` (in place): 0.
* data-parallel and pipeline buffers of each backend, per phase and named (``cost_models/memory_buffers.py``, read
  from each backend's source): Megatron-FSDP's unsharded gradient reduce-scatter queue and parameter all-gather
  prefetch, DeepSpeed's ZeRO buckets and ZeRO-3 gather/prefetch, torch FSDP2's gathered blocks (or, with PP, the
  whole stage's parameters and accumulated fp32 gradients), and the pipeline receive buffers.
* Reserve: CUDA context, NCCL buffers and allocator fragmentation: the cluster's calibration
  (``calibration.memory_reserve_bytes`` and its source).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .activation_offload import OFFLOAD_RESIDENT_LAYERS, offloaded_bytes
from .activations import activation_terms_per_layer, expert_buffer_factor, in_flight_microbatches, layer_input_bytes
from .config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob, compute_bytes
from .elementwise import cross_entropy_impl
from .layout import chunk_layer_counts, holds_embedding, holds_output, rank_layers
from .memory_buffers import BufferInputs, backend_buffers, merge, moe_dispatch_buffers, pipeline_p2p_buffers

Framework = Literal["megatron", "deepspeed", "torchtitan"]
FRAMEWORKS: tuple[str, ...] = ("megatron", "deepspeed", "torchtitan")

#: Adam: fp32 master weights + first and second moments (ZeRO paper K = 12, Sec. 3.1).
OPTIMIZER_BYTES_PER_PARAM = 12
#: Megatron keeps fp32 main gradients (formulas.md Sec. 1.3: the 4 of 18 bytes).
GRAD_BYTES_PER_PARAM = BYTES_FP32
#: 16-bit parameters.
WEIGHT_BYTES_PER_PARAM = BYTES_16BIT
#: FP8 primary weights (``--fp8-param-gather`` with a per-tensor recipe): Transformer Engine ``Float8Tensor`` holds
#: 1-byte data (+ one fp32 scale per tensor, negligible). Not used for MXFP8, whose ``MXFP8Tensor`` keeps rowwise and
#: columnwise 1-byte copies (2 bytes + 1/32-byte scales each), no less than bf16.
FP8_PARAM_BYTES = 1
#: fp32 master weights kept by Megatron's (distributed) optimizer (``main_params_dtype`` fp32).
MASTER_WEIGHT_BYTES_PER_PARAM = BYTES_FP32
#: Adam first + second moments in fp32 (Megatron default ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` fp32).
ADAM_MOMENT_BYTES_PER_PARAM = 2 * BYTES_FP32
#: Bytes per element of the optimizer-state dtypes (``OptimizerStateDtype``).
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
#: Token ids + position ids held for the first stage's embedding, 8 bytes/token (Megatron estimator, Sec. 1.4).
TOKEN_ID_BYTES = 8
#: DeepSpeed ZeRO-3 ``sub_group_size`` default, elements: the optimizer steps one sub-group at a time.
DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000
#: Logits bytes per element of ``s*b*V/tp`` at the loss, by framework (module docstring), for the framework's
#: default loss; ``logits_bytes_per_element`` refines it by the loss the job runs.
LOGITS_BYTES_PER_ELEMENT = {"megatron": 6, "deepspeed": 12, "torchtitan": 12}

#: torch.compile'd ``F.cross_entropy(logits.float())`` (torchtitan ``components/loss.py`` under ``training.compile``):
#: the compiled forward saves only the bf16 logits and per-row fp32 statistics, and the generated backward allocates
#: one buffer of the logits' size, the bf16 input gradient; the fp32 copy, log-softmax and their gradients are fused
#: away. Measured with torch 2.13 (inductor, CPU; saved-tensor hooks and the generated code,
#: ``benchmarks/compiled_loss_memory.py``): 2 bytes saved per logit + 2 for the gradient = 4.
COMPILED_CROSS_ENTROPY_BYTES_PER_ELEMENT = 2 * BYTES_16BIT

#: Transformer Engine ``parallel_cross_entropy`` (Megatron ``--cross-entropy-fusion-impl te``): saves only its bf16
#: input and per-row statistics, and its backward writes the gradient into that input in place
#: (``transformer_engine/pytorch/cross_entropy.py`` ``CrossEntropyFunction``: ``save_for_backward(_input, ...)``,
#: ``backward`` returns the ``_input`` that ``cross_entropy_backward`` overwrote): 2 bytes per logit.
TE_CROSS_ENTROPY_BYTES_PER_ELEMENT = BYTES_16BIT

#: Phases of a step, in order; ``init`` is the moment before the first step (model built, states allocated).
PHASES = ("init", "forward", "backward", "optimizer")


def logits_bytes_per_element(job: TrainingJob, framework: str) -> float:
    """Bytes per element of the ``s*b*V/tp`` logits that the loss holds at its peak, by the loss the framework runs
    for ``job`` (``elementwise.cross_entropy_impl``): Megatron-LM's vocab-parallel losses 6 (``fp32`` training 4:
    the output layer already yields fp32 logits and both losses write the gradient in place), Transformer Engine's
    2 (``TE_CROSS_ENTROPY_BYTES_PER_ELEMENT``); torchtitan eager 12, compiled 4
    (``COMPILED_CROSS_ENTROPY_BYTES_PER_ELEMENT``); DeepSpeed 12 (``LOGITS_BYTES_PER_ELEMENT``: an eager
    ``F.cross_entropy(logits.float())``)."""
    fw = framework.split("_")[0]
    impl = cross_entropy_impl(job, fw)
    if fw == "megatron":
        if job.precision == "fp32":
            return BYTES_FP32
        return TE_CROSS_ENTROPY_BYTES_PER_ELEMENT if impl == "te" else LOGITS_BYTES_PER_ELEMENT[fw]
    if fw == "torchtitan" and impl == "compiled":
        return COMPILED_CROSS_ENTROPY_BYTES_PER_ELEMENT
    return LOGITS_BYTES_PER_ELEMENT.get(fw, LOGITS_BYTES_PER_ELEMENT["deepspeed"])


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage, split by the group that shards their optimizer state."""

    dense: float  # after TP sharding; states sharded over dp x cp
    expert: float  # after EP x ETP sharding; states sharded over the expert data-parallel group
    largest_layer: float  # params of the largest decoder layer on this GPU (FSDP/ZeRO-3 gather unit)
    largest_module: float = 0.0  # params of the largest single module (DeepSpeed's ``largest_layer_params``)
    output_layer: float = 0.0  # params of the final norm + output layer on this GPU (last stage; an FSDP unit)

    @property
    def total(self) -> float:
        return self.dense + self.expert


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer states, and which of them ZeRO shards."""

    weights: float
    gradients: float
    optimizer: float
    #: part of ``gradients`` that stays replicated below ZeRO-2 even when ``zero_stage`` >= 1 shards the rest
    gradients_replicated: float = 0.0


@dataclass
class StageMemory:
    """Peak bytes on one GPU of pipeline stage ``stage`` by term (the terms of the peak phase ``phase``)."""

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
    transient: float = 0.0
    phase: str = "backward"
    phases: dict[str, float] = field(default_factory=dict)  # phase -> total bytes (incl. states and reserve)
    phase_terms: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> non-state term -> bytes
    buffer_terms: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> named backend buffer -> bytes

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer_states + self.activations + self.logits
                + self.buffers + self.transient + self.reserve)

    @property
    def allocated(self) -> float:
        """Peak bytes of live tensors (what ``torch.cuda.max_memory_allocated`` reports): total minus reserve."""
        return self.total - self.reserve

    @property
    def model_states(self) -> float:
        return self.weights + self.gradients + self.optimizer_states

    def terms(self) -> dict[str, float]:
        """Term name -> bytes, largest first."""
        t = {"weights": self.weights, "gradients": self.gradients, "optimizer_states": self.optimizer_states,
             "activations": self.activations, "logits": self.logits, "buffers": self.buffers,
             "transient": self.transient, "reserve": self.reserve}
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
    def peak_allocated_bytes(self) -> float:
        return max(s.allocated for s in self.stages)

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


def state_bytes(framework: str, grad_reduce_in_bf16: bool = False, *, fp8_params: bool = False,
                moment_bytes: float = ADAM_MOMENT_BYTES_PER_PARAM, optimizer_offload_fraction: float = 0.0,
                param_offload: bool = False, master_bytes: float = MASTER_WEIGHT_BYTES_PER_PARAM,
                fp32: bool = False, fp16: bool = False) -> StateBytes:
    """Bytes per parameter of the model states on the GPU before sharding (module docstring gives the sources).

    Megatron only: ``fp8_params`` (``--fp8-param-gather``, per-tensor recipe) stores 1-byte weights;
    ``moment_bytes`` is the Adam first + second moment bytes (8 in fp32, 4 with ``--use-precision-aware-optimizer
    --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``); ``master_bytes`` the master-weight bytes (4 in fp32, 2 with
    ``--main-params-dtype fp16`` or Megatron-FSDP's ``--megatron-fsdp-main-params-dtype bf16``: Megatron
    ``megatron/training/arguments.py``; the precision-aware optimizer keeps them in that dtype,
    ``megatron/core/optimizer/distrib_optimizer.py``). ``optimizer_offload_fraction`` of the fp32 master weights and
    moments lives in host memory (Megatron ``--optimizer-cpu-offload --optimizer-offload-fraction``; DeepSpeed
    ``offload_optimizer: {device: cpu}`` = 1.0, which also moves the fp32 gradient partition to the host:
    ``estimate_zero2_model_states_mem_needs(cpu_offload=True)`` keeps only the 16-bit parameters, ``2P``, on the
    GPU). ``param_offload`` (DeepSpeed ZeRO-3 ``offload_param``) keeps no 16-bit parameter partition on the GPU
    (``estimate_zero3_model_states_mem_needs(cpu_offload_params=True)``: only the ``4 * largest_layer`` buffer).

    ``fp32`` (single-precision training, ``TrainingJob.precision`` fp32): Megatron keeps fp32 weights and gradients
    and no master copy, 4 + 4 + 8 = 16 (Megatron ``docs/user-guide/features/dist_optimizer.md``, row "fp32 param,
    fp32 grad": 16, distributed 8 + 8/d); DeepSpeed's ZeRO optimizer still clones its partition into an fp32 master
    (``stage_1_and_2.py``: ``single_partition_of_fp32_groups`` ``.clone().float()``), so its 2-byte terms become 4:
    4 + (4 + 4) + 12; torchtitan's FSDP2 states are fp32 already (16).

    ``fp16`` (``TrainingJob.precision`` fp16): Megatron keeps 16-bit main gradients (it forces fp32 gradient
    accumulation and reduction for bf16 only, ``accumulate_allreduce_grads_in_fp32``, ``megatron/training/
    arguments.py``) and its optimizer an fp32 copy of them beside the master weights and moments: 2 + 2 + 16 = 20,
    distributed 4 + 16/d (``dist_optimizer.md``, row "fp16 param, fp16 grads"). DeepSpeed's and torchtitan's bytes
    do not depend on the 16-bit format.
    """
    keep = 1.0 - optimizer_offload_fraction
    if framework == "megatron":
        if fp32:
            return StateBytes(BYTES_FP32, BYTES_FP32, moment_bytes * keep)
        if fp16:
            return StateBytes(FP8_PARAM_BYTES if fp8_params else WEIGHT_BYTES_PER_PARAM, BYTES_16BIT,
                              (BYTES_FP32 + master_bytes + moment_bytes) * keep)
        opt = (master_bytes + moment_bytes) * keep
        return StateBytes(FP8_PARAM_BYTES if fp8_params else WEIGHT_BYTES_PER_PARAM,
                          BYTES_16BIT if grad_reduce_in_bf16 else GRAD_BYTES_PER_PARAM, opt)
    if framework == "deepspeed":
        # 16-bit grads (2) + fp32 grads (4); the 16-bit grads stay replicated under ZeRO-1. CPU offload moves the
        # fp32 gradient partition, the master weights and Adam to the host (and the 16-bit gradient partition of
        # ZeRO-2: the estimator keeps 2P alone on the GPU).
        w = BYTES_FP32 if fp32 else BYTES_16BIT
        return StateBytes(0.0 if param_offload else w, w + BYTES_FP32 * keep,
                          OPTIMIZER_BYTES_PER_PARAM * keep, gradients_replicated=w)
    if framework == "torchtitan":
        return StateBytes(BYTES_FP32, BYTES_FP32, 2 * BYTES_FP32)
    raise ValueError(f"framework {framework!r}: allowed values are {', '.join(FRAMEWORKS)}")


def model_state_terms(framework: str, zero_stage: int, params: float, shard: int,
                      grad_reduce_in_bf16: bool = False, **state_options: float) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes on one GPU for ``params`` parameters whose states may be sharded
    over ``shard`` ranks at ZeRO stage ``zero_stage``. DeepSpeed ZeRO-3's 16-bit gradients live in the gather
    buffer (its estimator's ``18*P/N`` has no 16-bit gradient term). ``state_options`` are ``state_bytes``'s
    keyword options (``state_options_of(par)``)."""
    b = state_bytes(framework, grad_reduce_in_bf16, **state_options)
    keep16 = 1.0 - state_options.get("optimizer_offload_fraction", 0.0)  # DeepSpeed ZeRO-2 offload (the estimator)
    z = zero_stage
    w = b.weights / (shard if z >= 3 else 1)
    o = b.optimizer / (shard if z >= 1 else 1)
    if framework == "deepspeed":
        fp32_g = b.gradients - b.gradients_replicated
        if z == 0:
            g = b.gradients
        elif z == 1:
            g = b.gradients_replicated + fp32_g / shard
        elif z == 2:
            g = (b.gradients_replicated * keep16 + fp32_g) / shard
        else:
            g = fp32_g / shard
    else:
        g = b.gradients / (shard if z >= 2 else 1)
    return w * params, g * params, o * params


def state_options_of(par: ParallelConfig) -> dict[str, float]:
    """``state_bytes`` keyword options set by ``par``'s recipe knobs (all default to Megatron-LM's defaults)."""
    return {"fp8_params": bool(getattr(par, "fp8_param_gather", False)),
            "moment_bytes": float(DTYPE_BYTES[getattr(par, "exp_avg_dtype", "fp32")]
                                  + DTYPE_BYTES[getattr(par, "exp_avg_sq_dtype", "fp32")]),
            "optimizer_offload_fraction": float(getattr(par, "optimizer_cpu_offload_fraction", 0.0)),
            "param_offload": bool(getattr(par, "param_cpu_offload", False)) and par.zero_stage >= 3,
            "master_bytes": float(DTYPE_BYTES[getattr(par, "main_params_dtype", "fp32")])}


def precision_state_options(precision: str) -> dict[str, bool]:
    """``state_bytes``'s keyword options set by the job's number format (``TrainingJob.precision``)."""
    return {"fp32": precision == "fp32", "fp16": precision == "fp16"}


def layer_shard_params(model: ModelSpec, layer: int, tp: int, expert_shards: int) -> tuple[float, float]:
    """(dense, expert) parameters of decoder ``layer`` on one GPU: the TP-sharded weights / ``tp`` plus the
    replicated ones (norms, router), and the routed experts / ``expert_shards`` (EP x expert TP)."""
    lp = model.layer_params(layer)
    return lp.tp_sharded / tp + lp.replicated, lp.expert / expert_shards


def stage_params(model: ModelSpec, par: ParallelConfig, stage: int, layers, tp_vocab: int) -> StageParams:
    """Parameters on one GPU of pipeline rank ``stage`` holding decoder ``layers``: plus the embedding (first model
    stage) and the output layer, final norm and MTP layers (last model stage; Megatron builds MTP after the
    decoder), where ``layout.holds_embedding`` / ``holds_output`` place them (a V schedule puts both on rank 0,
    DualPipe on both end ranks). With tied embeddings and pp > 1 the output layer's rank keeps its own copy of the
    word embeddings, as Megatron does (``share_embeddings_and_output_weights``)."""
    tp, ets = par.tp, par.expert_tp * par.ep
    dense = 0.0
    expert = 0.0
    largest = 0.0
    h = model.hidden_size
    emb_table = tp_vocab * h / tp
    # Largest single module: a word-embedding table or the largest linear (fc1 of a gated MLP is one module in
    # Megatron, two in HF; we take the HF split, as DeepSpeed's estimator runs on HF models).
    f_max = model.ffn_hidden_size
    if model.moe is not None:
        f_max = max(model.moe.dense_ffn_hidden_size or model.ffn_hidden_size, model.moe.expert_ffn_hidden_size)
    largest_module = float(h * f_max / tp)
    for i, n in model.layer_kinds(layers):  # layer params depend on i only through is_moe_layer(i)
        d, e = layer_shard_params(model, i, tp, ets)
        dense += n * d
        expert += n * e
        largest = max(largest, d + e)
    if holds_embedding(par, stage):
        extra = model.embedding_params() - model.vocab_size * h  # learned positions / embedding norm
        dense += emb_table + extra
        largest_module = max(largest_module, model.vocab_size * h / tp)
    output_layer = 0.0
    if holds_output(par, stage):
        out = model.output_params()
        final_norm = out - (0 if model.tie_word_embeddings else model.vocab_size * h)
        dense += final_norm
        output_layer = final_norm + emb_table
        if not model.tie_word_embeddings or par.pp > 1:
            dense += emb_table
            largest_module = max(largest_module, model.vocab_size * h / tp)
        if model.num_mtp_layers:
            mp = model.mtp_layer_params()
            dense += model.num_mtp_layers * (mp.tp_sharded / tp + mp.replicated)
            expert += model.num_mtp_layers * mp.expert / ets
    return StageParams(dense=dense, expert=expert, largest_layer=largest, largest_module=largest_module,
                       output_layer=output_layer)


def _kind_representatives(model: ModelSpec) -> list[int]:
    """One layer index of each kind (dense, MoE) present in the model."""
    return [i for i, _ in model.layer_kinds()]


def estimate_memory(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, *,
                    framework: str | None = None, reserve_bytes: float | None = None) -> MemoryEstimate:
    """Per-stage, per-phase memory of ``par`` (bytes). ``capacity_bytes`` is the GPU's memory (nvidia-smi).

    ``framework`` (megatron | deepspeed | torchtitan; default ``job.framework``) selects the model-state bytes,
    the logits/loss implementation and the transient buffers (a MoE job's ``moe_expert_capacity_factor`` pads the
    expert buffers); ``reserve_bytes`` overrides the cluster's calibrated reserve.

    Raises:
        LayoutError: the layer split is impossible for this ``pp``.
        ValueError: unknown framework.
    """
    fw = framework or getattr(job, "framework", None) or "megatron"
    if fw not in FRAMEWORKS:
        raise ValueError(f"framework {fw!r}: allowed values are {', '.join(FRAMEWORKS)}")
    m = par.num_microbatches(job.global_batch_size)
    vocab = model.padded_vocab_size(par.tp)
    hsdp = getattr(par, "hsdp_shard_size", None)
    if hsdp and (par.dp * par.cp) % hsdp:
        raise ValueError(f"hsdp_shard_size {hsdp} must divide dp x cp = {par.dp * par.cp}")
    dense_shard = hsdp if hsdp else par.dp * par.cp
    expert_shard = par.expert_dp
    z = par.zero_stage
    bf16_grads = bool(getattr(par, "grad_reduce_in_bf16", False))
    state_opts = {**state_options_of(par), **precision_state_options(job.precision)}
    ranges = rank_layers(model.num_layers, par)
    layer_in = layer_input_bytes(model, job, par)
    reserve = float(cluster.calibration.memory_reserve_bytes if reserve_bytes is None else reserve_bytes)
    tokens = job.seq_length / par.cp * par.micro_batch_size
    # activations depend on the layer only through is_moe_layer (dense or MoE MLP)
    terms_by_kind = {model.is_moe_layer(i): activation_terms_per_layer(model, job, par, i, fw)
                     for i in _kind_representatives(model)}
    act_by_kind = {k: sum(v.values()) for k, v in terms_by_kind.items()}
    # bytes activation offloading moves to the host per layer (cost_models/activation_offload.py)
    off_mods = getattr(par, "offload_modules", None)
    off_by_kind = {k: offloaded_bytes(v, off_mods) for k, v in terms_by_kind.items()}
    # token copies one rank routes through the expert-parallel all-to-all (as ``_moe_terms``)
    moe_copies = 0.0
    if model.moe is not None:
        local = tokens / (par.tp if par.sequence_parallel else 1)
        moe_copies = local * model.moe.top_k * expert_buffer_factor(model, job, par)
    out: list[StageMemory] = []
    for stage, layers in enumerate(ranges):
        sp = stage_params(model, par, stage, layers, vocab)
        wd, gd, od = model_state_terms(fw, z, sp.dense, dense_shard, bf16_grads, **state_opts)
        we, ge, oe = model_state_terms(fw, z, sp.expert, expert_shard, bf16_grads, **state_opts)
        weights, grads, opt = wd + we, gd + ge, od + oe
        local_opt_params = sp.dense / (dense_shard if z >= 1 else 1) + sp.expert / (expert_shard if z >= 1 else 1)

        # Activations of one micro-batch through this stage's layers (+ MTP layers on the last stage).
        idx = list(layers)
        if holds_output(par, stage) and model.num_mtp_layers:
            idx += [model.num_layers - 1] * model.num_mtp_layers
        mask = model.moe_layer_mask
        per_layer = [act_by_kind[mask[i]] for i in idx]
        biggest = max(per_layer, default=0.0)
        # what a layer that is not recomputed keeps on the GPU (its offloaded tensors are on the host)
        kept = sorted((act_by_kind[model.is_moe_layer(i)] - off_by_kind[model.is_moe_layer(i)],
                       off_by_kind[model.is_moe_layer(i)]) for i in idx)
        offloaded = 0.0
        def chunks_of_stage() -> list[int]:
            return chunk_layer_counts(model.num_layers, par)[stage] if par.vpp > 1 else [len(layers)]
        if par.recompute == "full" and par.recompute_num_layers and getattr(par, "recompute_method", "") == "uniform":
            # megatron-core recompute.py, method uniform: each chunk's layers checkpointed in groups of N (the
            # group's input kept); in backward a whole group is recomputed (its N layers' activations live) and the
            # gradients of one layer's activations with them
            g, chunks = par.recompute_num_layers, chunks_of_stage()
            stored = layer_in * sum(-(-c // g) for c in chunks)
            working = (min(g, max(chunks, default=1)) + 1) * biggest
        elif par.recompute == "full":
            if par.recompute_num_layers is None:
                n_rc = len(per_layer)
            else:  # Megatron's block method: the first N layers of each model chunk (per virtual stage)
                n_rc = min(len(per_layer), sum(min(par.recompute_num_layers, c) for c in chunks_of_stage()))
            rest = kept[: len(per_layer) - n_rc]
            stored = layer_in * n_rc + sum(k for k, _ in rest)
            offloaded = max((o for _, o in rest), default=0.0)
            working = 2 * biggest if n_rc else biggest  # recomputed layer + the gradients of its activations
        else:
            stored = sum(k for k, _ in kept)
            offloaded = max((o for _, o in kept), default=0.0)
            working = biggest
        if holds_embedding(par, stage):
            stored += TOKEN_ID_BYTES * tokens + (tokens * model.hidden_size if job.dropout else 0) / (
                par.tp if par.sequence_parallel else 1)
        n_inflight = in_flight_microbatches(par, stage, m)
        # offloaded layers: the last group of each name kept and one layer in flight stay on the GPU
        acts = stored * n_inflight + OFFLOAD_RESIDENT_LAYERS * offloaded
        logits = 0.0
        if holds_output(par, stage):
            logits = tokens * vocab / par.tp * logits_bytes_per_element(job, fw)
        fwd_transient = 0.0
        if not job.flash_attention and par.recompute != "full":
            # fp32 QK^T scores of the running layer (F07)
            fwd_transient = BYTES_FP32 * model.num_attention_heads * tokens * job.seq_length / par.tp

        # Data-parallel and pipeline buffers of the backend (cost_models/memory_buffers.py, each from its source).
        bufs = merge(
            backend_buffers(fw, BufferInputs(zero_stage=z, stage_params=sp.total, largest_layer=sp.largest_layer,
                                             largest_module=sp.largest_module, dp_shard=dense_shard,
                                             output_layer=sp.output_layer,
                                             elem_bytes=compute_bytes(job.precision)), par.pp),
            pipeline_p2p_buffers(fw, stage, par.pp, par.vpp, m, n_inflight * par.vpp, layer_in),
            moe_dispatch_buffers(moe_copies if any(model.is_moe_layer(i) for i in layers) else 0.0,
                                 model.hidden_size, par.ep,
                                 compute_bytes(job.precision)))

        # Optimizer step temporaries.
        if fw == "megatron":
            opt_tmp = 0.0  # FusedAdam updates in place
        elif fw == "deepspeed" and z >= 3:
            opt_tmp = BYTES_FP32 * min(DEEPSPEED_SUB_GROUP_ELEMENTS, local_opt_params)
        else:
            opt_tmp = BYTES_FP32 * local_opt_params
        if fw == "deepspeed":  # the offloaded share steps on the host (DeepSpeedCPUAdam)
            opt_tmp *= 1.0 - state_opts["optimizer_offload_fraction"]
        states = weights + grads + opt
        # Initialization: the states exist; a full-model init first holds the stage's whole 16-bit model
        # (DeepSpeed 0.19.8 ``DeepSpeedEngine._configure_distributed_model``: ``self.module.to(self.device)`` unless
        # the model was built under ``zero.Init``, before the ZeRO optimizer partitions it).
        full_model = compute_bytes(job.precision) * sp.total if getattr(job, "full_model_init", False) else 0.0
        init_extra = max(0.0, full_model - states)
        if full_model:
            bufs["init"] = {"full_model_materialized": full_model}
        phase_terms = {
            "init": {"activations": 0.0, "logits": 0.0, "buffers": 0.0, "transient": init_extra},
            "forward": {"activations": acts, "logits": logits, "buffers": sum(bufs["forward"].values()),
                        "transient": fwd_transient},
            "backward": {"activations": acts, "logits": logits, "buffers": sum(bufs["backward"].values()),
                         "transient": working},
            "optimizer": {"activations": 0.0, "logits": 0.0, "buffers": sum(bufs["optimizer"].values()),
                          "transient": opt_tmp},
        }
        phases = {ph: states + sum(v.values()) + reserve for ph, v in phase_terms.items()}
        peak_phase = max(PHASES, key=lambda ph: (phases[ph], -PHASES.index(ph)))
        pt = phase_terms[peak_phase]
        out.append(StageMemory(
            stage=stage, num_layers=len(layers), num_parameters=sp.total, weights=weights, gradients=grads,
            optimizer_states=opt, activations=pt["activations"], logits=pt["logits"], buffers=pt["buffers"],
            reserve=reserve, in_flight_microbatches=n_inflight, transient=pt["transient"], phase=peak_phase,
            phases=phases, phase_terms=phase_terms, buffer_terms=bufs))
    return MemoryEstimate(stages=out, capacity_bytes=cluster.gpu.memory_bytes)
