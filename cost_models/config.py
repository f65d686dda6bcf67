"""Typed inputs shared by every cost model: the training job and one parallel configuration.

Names follow Megatron-LM's vocabulary (``tp``, ``pp``, ``dp``, ``cp``, ``ep``, ``vpp``,
``micro_batch_size``, ``global_batch_size``, ``num_microbatches``, ``zero_stage``,
``sequence_parallel``, ``recompute_granularity``).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster_specs.efficiency import SOFTWARE_DATE_PATTERN
from model_zoo.input_guard import Plausible
from model_zoo.spec import POSITIONS

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved", "gpipe", "zb-h1", "zb-v", "dualpipe", "dualpipev", "combined-1f1b"]
FlopsConvention = Literal["megatron", "palm"]
#: Megatron-LM ``--moe-flex-dispatcher-backend`` values plan3d times
#: (``cluster_specs.efficiency.FLEX_DISPATCHER_BACKENDS``, whose measured tables they read)
FlexDispatcherBackend = Literal["deepep", "hybridep"]
#: Megatron-LM ``--fp8-recipe`` choices (``megatron/training/arguments.py``; ``cost_models/fp8_recipe.py``).
Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
#: Megatron-LM ``--recompute-modules`` choices (megatron/training/arguments.py; megatron-core
#: ``TransformerConfig.recompute_modules``).
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
#: Megatron-LM ``--offload-modules`` choices (fine-grained activation offloading; cost_models/activation_offload.py).
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                        "fused_group_mlp"]
#: Megatron-LM ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` choices (precision-aware optimizer).
OptimizerStateDtype = Literal["fp32", "fp16", "bf16", "fp8"]

#: Bytes per element of the 16-bit activation/parameter dtype (bf16/fp16).
BYTES_16BIT = 2
#: Bytes per fp32 element.
BYTES_FP32 = 4


def compute_bytes(precision: str) -> int:
    """Bytes per element of the parameters' compute copy and of the activations: 4 for ``fp32`` training (fp32
    parameters, gradients and activations; GEMMs on TF32 tensor cores), 2 otherwise (bf16 / fp16, and FP8 runs,
    whose activations outside the GEMMs stay 16-bit)."""
    return BYTES_FP32 if precision == "fp32" else BYTES_16BIT


#: Global batch (sequences): one to 100x a 16,384-sequence batch, above the largest published ones (DeepSeek-V3
#: 15,360 x 4K, arXiv:2412.19437 Sec. 4.2; Llama 3.1 405B 2,048 x 8K).
GLOBAL_BATCH = Plausible(1, 100 * 16384, "one to 100x a 16,384-sequence batch; DeepSeek-V3 used 15,360")

#: Busiest expert's routed tokens over the mean: 1 (balanced) up to num_experts / top_k (it takes every token of the
#: micro-batch; per model: ``planner.api``), bounded by 100x the 256 routed experts of DeepSeek-V3
#: (arXiv:2412.19437 Sec. 4.2) over top-1.
EXPERT_LOAD_IMBALANCE = Plausible(1.0, 100 * 256, "1 = balanced, at most num_experts / top_k; 100x the 256 experts "
                                                  "of DeepSeek-V3 over top-1")
#: Megatron-LM ``--moe-expert-capacity-factor``: >= 1 keeps every token of balanced routing; at most num_experts /
#: top_k, when every expert holds every token (per model: ``planner.api``), here 256 experts over top-1.
CAPACITY_FACTOR = Plausible(1.0, 256.0, ">= 1 keeps every token of balanced routing; at most num_experts / top_k")


class TrainingJob(BaseModel):
    """What is trained: global batch (sequences), sequence length (tokens), precision, optimizer.

    ``precision`` selects the GEMM rate: ``fp8`` runs GEMMs at the FP8 rate with bf16 parameters and
    activations elsewhere (Transformer Engine's recipe); weights/optimizer bytes are unchanged. ``fp32`` trains
    in single precision: 4-byte parameters, gradients and activations, no separate master copy (Megatron
    ``dist_optimizer.md`` "fp32 param, fp32 grad": 16 bytes, 8 + 8/d distributed), GEMMs on the TF32 tensor cores
    (Transformer Engine's cuBLASLt GEMMs default to ``CUBLAS_COMPUTE_32F_FAST_TF32``; PyTorch's own matmuls need
    ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``, which the emitters set) at the TF32 dense peak, the peak MFU is
    reported against.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    global_batch_size: Annotated[int, GLOBAL_BATCH] = Field(1024, description="sequences per optimizer step")
    seq_length: Annotated[int, POSITIONS] = Field(4096, description="tokens per sequence")
    precision: Precision = "bf16"
    optimizer: Literal["adam"] = "adam"
    flash_attention: bool = Field(True, description="fused attention: no s x s score tensor is stored")
    dropout: bool = Field(False, description="dropout layers present: masks stored (K22 Sec. 4.1), written and "
                                             "read (attention.DROPOUT_SCORE_PASSES, elementwise.DROPOUT_MASK_BYTES)")
    framework: Literal["megatron", "deepspeed", "torchtitan"] = Field(
        "megatron", description="training framework whose model-state bytes, loss and buffers the memory model uses "
                                "(cost_models/memory.py)")
    full_model_init: bool = Field(
        False, description="every rank materializes the whole 16-bit model (its pipeline stage, TP/EP-sharded) on the "
                           "GPU before the data-parallel sharding: DeepSpeed without deepspeed.zero.Init, or a loader "
                           "that builds the full model on each rank; False = built sharded (Megatron, torchtitan's "
                           "meta-device init, zero.Init)")
    expert_load_imbalance: Annotated[float | None, EXPERT_LOAD_IMBALANCE] = Field(
        None, description="dropless MoE routing: the busiest expert's routed tokens over the mean in one "
                                  "micro-batch (1.0 = balanced, as with Megatron --moe-router-force-load-balancing); "
                                  "None = cost_models/moe_imbalance.py's sourced default (2.21 for 256 experts, 1.61 "
                                  "for 8). Sets how far the busiest expert-parallel rank exceeds the balanced share")
    moe_expert_capacity_factor: Annotated[float | None, CAPACITY_FACTOR] = Field(
        None, description="MoE drop-and-pad routing (Megatron-LM --moe-expert-capacity-factor with "
                          "--moe-pad-expert-input-to-capacity): every expert's input is cut or padded to this "
                          "multiple of the balanced share, so the expert GEMMs and the EP all-to-all carry that many "
                          "token copies and no host synchronisation waits for the token counts; None = dropless")
    moe_flex_dispatcher_backend: FlexDispatcherBackend | None = Field(
        None, description="Megatron-LM --moe-token-dispatcher-type flex with --moe-flex-dispatcher-backend: DeepEP or "
                          "NVIDIA's HybridEP (dropless routing only). Inside one NVLink domain the EP term then reads "
                          "the backend's measured throughput (cluster_specs/data/efficiency/ep_dispatch.yaml); None = "
                          "plan3d's choice (collectives.moe_token_dispatcher: DeepEP across NVLink domains, the NCCL "
                          "all-to-all inside one)")
    moe_flex_dispatcher_num_sms: int | None = Field(
        None, gt=0, le=1024, description="SMs the flex dispatcher's dispatch/combine kernels run on (Megatron-LM "
                                         "--moe-flex-dispatcher-num-sms); None = the backend's default (HybridEP 32 "
                                         "inside one NVLink domain, DeepEP 20)")
    fp8_recipe: Fp8Recipe | None = Field(
        None, description="FP8 scaling recipe (Megatron-LM --fp8-recipe): 'delayed' (amax history; the cast kernel "
                          "records the amax), 'tensorwise' (per-tensor current scaling: an amax pass over each tensor "
                          "before its cast; torchao's dynamic tensorwise float8 alike), 'mxfp8', 'blockwise'; None = "
                          "the framework's default (cost_models/fp8_recipe.py)")
    cross_entropy_fusion_impl: Literal["native", "te"] = Field(
        "native", description="Megatron --cross-entropy-fusion-impl: 'native' (Megatron's fused vocab-parallel "
                              "cross entropy, bf16 logits + fp32 copy kept) or 'te' (Transformer Engine "
                              "parallel_cross_entropy: gradient written in place into the bf16 logits)")
    software_date: str | None = Field(
        None, pattern=SOFTWARE_DATE_PATTERN,
        description="YYYY-MM of the software the run uses (its container or framework release): selects the kernel "
                    "library's generation in the efficiency tables (cluster_specs/data/efficiency/attention.yaml: "
                    "cuDNN attention on H100 got 22-25% faster forward from 2024 to 2026); None = the newest, as for "
                    "a run planned today")
    cross_entropy_loss_fusion: bool | None = Field(
        None, description="fused cross-entropy loss: Megatron --cross-entropy-loss-fusion (jit-fused vocab-parallel "
                          "loss), torchtitan's torch.compile'd loss; None = the framework's default (Megatron-LM, "
                          "Megatron-DeepSpeed: unfused; NeMo 2.0: fused; torchtitan: compiled, as plan3d's launch "
                          "compiles it). HBM bytes per logit: cost_models/elementwise.py CE_BYTES_PER_LOGIT")

    @property
    def routed_token_factor(self) -> float:
        """Routed token copies each expert computes and exchanges over the balanced share: the capacity factor
        under drop-and-pad routing (padded slots are computed and sent: Megatron-LM ``MoEAlltoAllTokenDispatcher``
        with ``drop_and_pad``), 1 when dropless (balanced routing)."""
        return self.moe_expert_capacity_factor or 1.0

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed by one optimizer step (global_batch_size x seq_length)."""
        return self.global_batch_size * self.seq_length


class ParallelConfig(BaseModel):
    """One point of the search space.

    ``world_size = tp * pp * dp * cp`` (Megatron: EP is carved out of ``dp * cp * tp``, not multiplied in;
    Megatron-LM ``parallel_state.initialize_model_parallel``). ``vpp`` is the number of model chunks per
    pipeline rank (Megatron's virtual pipeline size; 1 = no interleaving). ``zero_stage`` 1 is Megatron's
    distributed optimizer. ``first_stage_layers`` / ``last_stage_layers`` are Megatron's
    ``--decoder-first/last-pipeline-num-layers`` (None = even split).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    dp: int = Field(1, gt=0)
    cp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    etp: int | None = Field(None, description="expert tensor parallel size (Megatron default: = tp)")
    vpp: int = Field(1, gt=0)
    micro_batch_size: int = Field(1, gt=0)
    zero_stage: int = Field(0, ge=0, le=3)
    sequence_parallel: bool = False
    recompute: Recompute = "none"
    recompute_num_layers: int | None = Field(None, description="layers per stage recomputed under full recompute (None = all)")
    recompute_method: Literal["block", "uniform"] = Field(
        "block", description="Megatron --recompute-method with recompute_num_layers N: block = the first N layers of "
                             "each model chunk are checkpointed, the others keep their activations; uniform = the "
                             "chunk's layers are checkpointed in groups of N (one input kept per group, every layer "
                             "recomputed, a whole group's activations live while it is recomputed)")
    schedule: Schedule | None = Field(None, description="None = 1f1b, or interleaved when vpp > 1")
    first_stage_layers: int | None = Field(None, gt=0)
    last_stage_layers: int | None = Field(None, gt=0)
    pipeline_layout: str | None = Field(
        None, description="Megatron --pipeline-model-parallel-layout, e.g. 'Et|(tt|)*30mL': model chunks separated by "
                          "'|' holding E (embedding), t (decoder layer), m (MTP layer), L (loss); chunk i runs on "
                          "pipeline rank i % pp as virtual stage i // pp")
    account_for_embedding_in_pipeline_split: bool = Field(
        False, description="Megatron --account-for-embedding-in-pipeline-split: the embedding counts as one layer of "
                           "the first stage's first model chunk")
    account_for_loss_in_pipeline_split: bool = Field(
        False, description="Megatron --account-for-loss-in-pipeline-split: the output layer + loss count as one layer "
                           "of the last stage's last model chunk")
    hsdp_shard_size: int | None = Field(
        None, gt=0, description="HSDP: ZeRO-3/FSDP shards within groups of this many DP x CP ranks and replicates "
                                "across them (torchtitan data_parallel_shard_degree; None = shard over all)")
    grad_reduce_in_bf16: bool = Field(False, description="Megatron --grad-reduce-in-bf16: 2-byte main gradients")
    # --- memory knobs of published recipes (cost_models/memory.py; defaults = Megatron-LM's defaults) ---
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        None, description="Megatron --recompute-modules, used when recompute == 'selective' (None = Megatron's "
                          "default ('core_attn',)); see cost_models/memory.py for what each module drops")
    fp8_param_gather: bool = Field(
        False, description="Megatron --fp8-param-gather with a per-tensor FP8 recipe (delayed / current scaling): the "
                           "model weights are Transformer Engine Float8Tensors, 1 byte per parameter instead of 2")
    exp_avg_dtype: OptimizerStateDtype = Field(
        "fp32", description="Megatron --exp-avg-dtype (with --use-precision-aware-optimizer): Adam first moment")
    exp_avg_sq_dtype: OptimizerStateDtype = Field(
        "fp32", description="Megatron --exp-avg-sq-dtype (with --use-precision-aware-optimizer): Adam second moment")
    main_params_dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="master weights kept by the optimizer: Megatron --main-params-dtype (fp32 | fp16, with "
                            "--use-precision-aware-optimizer) or Megatron-FSDP --megatron-fsdp-main-params-dtype "
                            "(bf16 too)")
    optimizer_cpu_offload_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Megatron --optimizer-cpu-offload --optimizer-offload-fraction: share of the "
                                         "fp32 master weights and Adam moments kept in host memory (0 = none)")

    offload_modules: tuple[OffloadModule, ...] | None = Field(
        None, description="Megatron --fine-grained-activation-offloading --offload-modules: submodules whose saved "
                          "activations go to host memory in forward and come back before backward "
                          "(cost_models/activation_offload.py); None = no activation offloading")
    param_cpu_offload: bool = Field(
        False, description="DeepSpeed ZeRO-3 offload_param {device: cpu}: the 16-bit parameter partitions live in "
                           "host memory (with optimizer_cpu_offload_fraction 1.0: ZeRO-Infinity's CPU tier)")

    @field_validator("offload_modules")
    @classmethod
    def _offload_rules(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v:
            from .activation_offload import check_offload_modules
            check_offload_modules(v)
        return v

    @model_validator(mode="after")
    def _sp_needs_tp(self) -> "ParallelConfig":
        # Megatron silently turns SP off when tp == 1 (arguments.py); we normalise the same way.
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of expert parameters: world / (etp * ep * pp) (Megatron parallel_state)."""
        return max(1, self.world_size // (self.expert_tp * self.ep * self.pp))

    @property
    def pipeline_schedule(self) -> Schedule:
        if self.schedule is not None:
            return self.schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    def num_microbatches(self, global_batch_size: int) -> int:
        """Micro-batches per step per data-parallel replica: GBS / (micro_batch_size * dp) (floor)."""
        return global_batch_size // (self.micro_batch_size * self.dp)

    def processed_share(self, global_batch_size: int) -> float:
        """Samples the step model times, over the global batch: ``max(1, num_microbatches) x micro_batch_size x dp /
        GBS``; 1 when the layout divides the batch. A layout that does not breaks the batch rule (reported
        infeasible); its throughput and MFU count the samples it runs, not the batch it was asked for."""
        m = max(1, self.num_microbatches(global_batch_size))
        return m * self.micro_batch_size * self.dp / global_batch_size
