"""DeepSpeed ``ds_config.json`` and Megatron-DeepSpeed arguments for a plan.

Keys: DeepSpeed ``deepspeed/runtime/constants.py``, ``runtime/zero/config.py``, ``runtime/config.py``
``get_pipeline_config`` (formulas.md Sec. 7.2). The tests feed the dict to DeepSpeed's own ``DeepSpeedConfig``
with the planned data-parallel size.

Rules enforced here (raising ``EmitError`` with a one-line reason):

* ``train_batch_size == train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp`` (DeepSpeed's
  ``_batch_assertion``; with Megatron's mpu the "world" is the data-parallel size).
* DeepSpeed's pipeline engine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
  parallelism", ``runtime/pipe/engine.py``), so pp > 1 with ZeRO >= 2 is refused.
* Context parallelism is mapped to DeepSpeed-Ulysses (``--ds-sequence-parallel-size``), which splits the
  heads of each tensor-parallel rank over the sequence-parallel group: heads / tp must divide by cp; and
  Megatron-DeepSpeed refuses it together with Megatron's ``--sequence-parallel`` (megatron/initialize.py).
* Flash attention (``--use-flash-attn-v2``; Megatron-DeepSpeed defaults to its own core attention), no dropout
  (``--attention-dropout 0 --hidden-dropout 0``; defaults 0.1) and FP8 (``--transformer-impl transformer_engine
  --fp8-hybrid``) are set so the run is the evaluated one.
* The model must be the plan's model: Megatron-DeepSpeed takes the norm epsilon (``--layernorm-epsilon``,
  default 1e-5) and the RoPE base (``--rope-theta``, deepspeedai/Megatron-DeepSpeed PR #351, default 10000), but
  has no RoPE scaling, partial rotary, LayerNorm1P, squared ReLU, multi-latent attention or router options
  (sigmoid scores, expert bias, group-limited routing, top-k scaling, softmax without renormalisation): a model
  needing one of them is refused with the setting named, rather than launched as a different model.
"""
from __future__ import annotations

from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import deepspeed_pipeline_layout
from model_zoo.spec import ModelSpec

from .megatron import EmitError, recipe_knobs_set, unexpressed_features

#: DeepSpeed's documented defaults for ZeRO bucket sizes (elements), ``runtime/zero/config.py``
#: (``reduce_bucket_size`` and ``allgather_bucket_size`` default 5e8).
REDUCE_BUCKET_SIZE = 500_000_000
ALLGATHER_BUCKET_SIZE = 500_000_000
#: ZeRO-3 prefetch bucket and persistence threshold (elements): DeepSpeed defaults 5e7 and 1e5
#: (``runtime/zero/config.py`` ``stage3_prefetch_bucket_size``, ``stage3_param_persistence_threshold``).
STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000


def check_deepspeed(model: ModelSpec | None, job: TrainingJob, par: ParallelConfig) -> None:
    """Raise ``EmitError`` if DeepSpeed cannot run ``par`` as plan3d evaluated it (the knob named).

    Besides the rules of the module docstring: DeepSpeed's ``PipelineEngine`` runs one stage per rank in its 1F1B
    ``TrainSchedule`` (``runtime/pipe/schedule.py``): no virtual stages (``vpp``), no other schedule; Megatron-
    DeepSpeed partitions the transformer layers itself (``GPTModelPipe``: ``partition_method='type:transformer'``,
    DeepSpeed ``partition_balanced``: 126 layers over 16 stages as 14 x 8 + 2 x 7), so only an even split or that
    split (``layout.deepspeed_pipeline_layout``, which the search and ``evaluate`` give DeepSpeed) is the evaluated
    one; DeepSpeed MoE has no expert tensor parallelism; Megatron's recompute modules / partial recompute
    and recipe knobs (bf16 gradient reduction, FP8 weights, low-precision Adam moments, optimizer offload share)
    have no DeepSpeed setting.
    """
    if par.pp > 1 and par.zero_stage >= 2:
        raise EmitError(f"zero_stage {par.zero_stage} with pp {par.pp}: DeepSpeed's pipeline engine supports ZeRO "
                        f"stage 0 or 1 only (runtime/pipe/engine.py); plan with --framework deepspeed")
    if model is not None and model.moe is not None and par.zero_stage >= 3:
        raise EmitError("zero_stage 3 with a mixture-of-experts model: DeepSpeed MoE supports ZeRO stage 0-2 only "
                        "(runtime/engine.py: \"Native DeepSpeed MoE is not supported with ZeRO Stage 3\"); "
                        "plan with --framework deepspeed")
    if job.global_batch_size % (par.micro_batch_size * par.dp):
        raise EmitError(f"global_batch_size {job.global_batch_size} is not divisible by micro_batch_size*dp = "
                        f"{par.micro_batch_size}*{par.dp}")
    own = deepspeed_pipeline_layout(model.num_layers, par.pp) if model is not None else None
    layout = getattr(par, "pipeline_layout", None)
    if par.pp > 1 and ((layout is not None and layout != own)
                       or getattr(par, "account_for_embedding_in_pipeline_split", False)
                       or getattr(par, "account_for_loss_in_pipeline_split", False)):
        raise EmitError("pipeline_layout / account-for-embedding/loss split: DeepSpeed's PipelineModule partitions "
                        "by its own method (parameters, uniform, type:), not by a Megatron layout"
                        + (f"; its own split of these layers is {own}" if own else ""))
    offload = getattr(par, "optimizer_cpu_offload_fraction", 0.0)
    if offload > 0 and (par.zero_stage == 0 or (offload < 1 and par.zero_stage < 3)):
        raise EmitError(f"optimizer_cpu_offload_fraction {offload:g} at zero_stage {par.zero_stage}: DeepSpeed offloads "
                        f"the optimizer at ZeRO stage 1-3, a partial ratio at stage 3 only (offload_config.py)")
    if getattr(par, "param_cpu_offload", False) and par.zero_stage != 3:
        raise EmitError("param_cpu_offload: DeepSpeed offloads parameters at ZeRO stage 3 only (offload_param)")
    hsdp = getattr(par, "hsdp_shard_size", None)
    if hsdp is not None and hsdp < par.dp * par.cp:
        # DeepSpeed's hybrid sharding (MiCS, zero_optimization.mics_shard_size) was removed; DeepSpeedConfig 0.19.8
        # rejects the key ("MiCS ZeRO-3 sharding has been removed", deepspeedai/DeepSpeed issue 8489)
        raise EmitError(f"hsdp_shard_size {hsdp}: DeepSpeed has no hybrid sharding since MiCS was removed; "
                        f"use full ZeRO-3 sharding or Megatron/torchtitan")
    if model is not None and par.cp > 1 and (model.num_attention_heads // par.tp) % par.cp:
        raise EmitError(f"cp {par.cp}: DeepSpeed-Ulysses needs heads per tensor-parallel rank "
                        f"({model.num_attention_heads}/{par.tp}) divisible by the sequence-parallel size")
    if par.pp > 1 and par.vpp > 1:
        raise EmitError(f"vpp {par.vpp}: DeepSpeed's pipeline engine runs one stage per rank (no virtual stages)")
    if par.pp > 1 and par.pipeline_schedule not in ("1f1b", "interleaved"):
        raise EmitError(f"pipeline schedule {par.pipeline_schedule}: DeepSpeed's pipeline engine runs its 1F1B "
                        f"TrainSchedule only")
    if par.pp > 1 and (par.first_stage_layers is not None or par.last_stage_layers is not None):
        raise EmitError(f"first/last stage layers {par.first_stage_layers}/{par.last_stage_layers}: Megatron-"
                        f"DeepSpeed balances transformer layers over the stages itself (partition_method "
                        f"'type:transformer')")
    if par.ep > 1 and par.expert_tp != 1:
        raise EmitError(f"etp {par.expert_tp}: DeepSpeed MoE has no expert tensor parallelism (etp 1)")
    if model is not None and model.moe is None and par.etp is not None and par.etp != par.tp:
        raise EmitError(f"etp {par.etp}: expert tensor parallelism needs a mixture-of-experts model")
    if par.recompute_num_layers is not None:
        raise EmitError(f"recompute_num_layers {par.recompute_num_layers}: DeepSpeed checkpoints at a layer interval, "
                        f"not the first N layers of each stage")
    if par.recompute == "selective" and par.recompute_modules and tuple(par.recompute_modules) != ("core_attn",):
        raise EmitError(f"recompute_modules {','.join(par.recompute_modules)}: Megatron-DeepSpeed's selective "
                        f"recompute is the attention core only")
    for knob in recipe_knobs_set(job, par, expressed=("optimizer_cpu_offload_fraction",))[:1]:
        raise EmitError(f"{knob}: DeepSpeed has no setting that runs it as plan3d evaluated it")


def deepspeed_config(job: TrainingJob, par: ParallelConfig, model: ModelSpec | None = None) -> dict:
    """``ds_config.json`` content. ``train_batch_size = micro x grad_accum x dp`` (DeepSpeed's own check)."""
    check_deepspeed(model, job, par)
    gas = job.global_batch_size // (par.micro_batch_size * par.dp)
    zero: dict = {
        "stage": par.zero_stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": REDUCE_BUCKET_SIZE,
        "allgather_bucket_size": ALLGATHER_BUCKET_SIZE,
    }
    if par.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = STAGE3_PREFETCH_BUCKET_SIZE
        zero["stage3_param_persistence_threshold"] = STAGE3_PARAM_PERSISTENCE_THRESHOLD
    # ZeRO-Offload / ZeRO-Infinity CPU tier (deepspeed/runtime/zero/offload_config.py): the optimizer (stage 1-3;
    # ``ratio`` < 1 is stage 3 only) and the 16-bit parameters (stage 3)
    offload = getattr(par, "optimizer_cpu_offload_fraction", 0.0)
    if offload > 0:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if offload < 1:
            zero["offload_optimizer"]["ratio"] = offload
    if getattr(par, "param_cpu_offload", False):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict = {
        "train_batch_size": par.micro_batch_size * gas * par.dp,
        "train_micro_batch_size_per_gpu": par.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "steps_per_print": 1,
        "zero_optimization": zero,
    }
    if job.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    elif job.precision == "fp32":
        pass  # no fp16/bf16 section: DeepSpeed trains the fp32 model as it is
    else:
        # fp8 GEMMs run under Transformer Engine inside the model; DeepSpeed keeps bf16 weights.
        cfg["bf16"] = {"enabled": True}
    if par.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": par.tp > 1,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False,
                                           "synchronize_checkpoint_boundary": False,
                                           "profile": False}
    if par.pp > 1:
        cfg["pipeline"] = {"stages": par.pp, "partition": "parameters", "seed_layers": False,
                           "activation_checkpoint_interval": 1 if par.recompute == "full" else 0,
                           "pipe_partitioned": True, "grad_partitioned": True}
    return cfg


def _model_unsupported(model: ModelSpec) -> str | None:
    """The first model setting Megatron-DeepSpeed cannot express (None when it can express them all)."""
    feature = unexpressed_features(model)
    if feature is not None:
        return feature
    if model.mla is not None:
        return "multi-latent attention"
    if model.position_embedding == "rope" and model.rope_scaling is not None:
        return f"rope_scaling {model.rope_scaling.type} (factor {model.rope_scaling.factor:g})"
    if model.position_embedding == "rope" and model.rotary_percent != 1.0:
        return f"rotary_percent {model.rotary_percent:g}"
    if model.layernorm_1p:
        return "layernorm_1p"
    if not model.gated_mlp and not model.activation.lower().startswith("gelu"):
        return f"activation {model.activation}"
    if model.gated_mlp and model.activation.lower() not in ("swiglu", "silu"):  # its gated MLP is --swiglu only
        return f"activation {model.activation} (gated)"
    moe = model.moe
    if moe is not None:
        if moe.score_function != "softmax" or moe.router_bias:
            return f"moe router score function {moe.score_function}" + (" with expert bias" if moe.router_bias else "")
        if moe.n_group is not None and moe.topk_group is not None and moe.topk_group < moe.n_group:
            return f"moe group-limited routing ({moe.topk_group} of {moe.n_group} groups)"
        if moe.routed_scaling_factor != 1.0:
            return f"moe routed_scaling_factor {moe.routed_scaling_factor:g}"
        if not moe.norm_topk_prob and moe.top_k > 1:
            return "moe norm_topk_prob false"
    return None


def megatron_deepspeed_args(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> list[str]:
    """Arguments for Megatron-DeepSpeed's ``pretrain_gpt.py`` (microsoft/Megatron-DeepSpeed
    ``megatron/arguments.py``): Megatron-style TP/PP flags, ``--no-pipeline-parallel`` when pp == 1 (the
    non-pipeline engine, which ZeRO-2/3 need), and ``--deepspeed --deepspeed_config ds_config.json``."""
    check_deepspeed(model, job, par)
    why = _model_unsupported(model)
    if why is not None:
        raise EmitError(f"{why}: Megatron-DeepSpeed has no option for it, so it would train a different model; "
                        f"use Megatron-LM (--emit megatron)")
    a: list[str] = []
    add = a.extend
    add(["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
         "--ffn-hidden-size", str(model.ffn_hidden_size), "--num-attention-heads", str(model.num_attention_heads),
         "--seq-length", str(job.seq_length),
         "--max-position-embeddings", str(max(job.seq_length, model.max_position_embeddings))])
    if model.num_kv_heads != model.num_attention_heads:
        add(["--num-key-value-heads", str(model.num_kv_heads)])
    if model.gated_mlp:
        a.append("--swiglu")
    if model.normalization == "rmsnorm":
        add(["--normalization", "rmsnorm"])
    add(["--layernorm-epsilon", repr(float(model.norm_eps))])
    if model.position_embedding == "rope":
        a.append("--use-rotary-position-embeddings")
        if model.rope_theta != 10000.0:
            theta = model.rope_theta
            add(["--rope-theta", str(int(theta)) if float(theta) == int(theta) else repr(float(theta))])
    if not model.linear_bias:
        a.append("--disable-bias-linear")
    if not model.tie_word_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if model.moe is not None:
        add(["--num-experts", str(model.moe.num_experts), "--topk", str(model.moe.top_k),
             "--moe-expert-parallel-size", str(par.ep)])
    add(["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp)])
    if par.pp == 1:
        a.append("--no-pipeline-parallel")
    if par.sequence_parallel:
        a.append("--sequence-parallel")
    if par.cp > 1:
        if par.sequence_parallel:
            # megatron/initialize.py (Megatron-DeepSpeed): "sequence_parallel_size > 1 enables DeepSpeed's sequence
            # parallel, which is not compatible with Megatron-LM's sequence parallel" (RuntimeError)
            raise EmitError(f"cp {par.cp} with sequence_parallel: Megatron-DeepSpeed's sequence parallelism "
                            f"(DeepSpeed-Ulysses) cannot be combined with Megatron-LM's sequence parallel")
        add(["--ds-sequence-parallel-size", str(par.cp)])
    add(["--micro-batch-size", str(par.micro_batch_size), "--global-batch-size", str(job.global_batch_size)])
    if par.recompute == "selective":
        add(["--recompute-granularity", "selective"])
    elif par.recompute == "full":
        a.append("--deepspeed-activation-checkpointing")
        a.append("--checkpoint-activations")
        if par.tp > 1:
            a.append("--partition-activations")
    if job.precision != "fp32":  # Megatron-DeepSpeed trains fp32 without --fp16/--bf16
        a.append("--fp16" if job.precision == "fp16" else "--bf16")
    if job.precision == "fp8":
        # FP8 GEMMs through Transformer Engine layers, hybrid format (E4M3 forward, E5M2 backward), the scaling of
        # the Megatron-LM launch (megatron/arguments.py: fp8 needs --transformer-impl transformer_engine)
        if job.fp8_recipe not in (None, "delayed"):
            raise EmitError(f"fp8_recipe {job.fp8_recipe}: Megatron-DeepSpeed's --fp8-hybrid runs Transformer "
                            f"Engine's delayed scaling (it has no recipe argument)")
        add(["--transformer-impl", "transformer_engine", "--fp8-hybrid", "--fp8-amax-history-len", "1024",
             "--fp8-amax-compute-algo", "max"])
    if job.flash_attention:
        a.append("--use-flash-attn-v2")  # Megatron-DeepSpeed's default is its unfused core attention
    if not job.dropout:
        add(["--attention-dropout", "0.0", "--hidden-dropout", "0.0"])  # defaults 0.1 (megatron/arguments.py)
    add(["--zero-stage", str(par.zero_stage), "--deepspeed", "--deepspeed_config", "ds_config.json"])
    return a


def check_ds_config_alone(job: TrainingJob, par: ParallelConfig) -> None:
    """Raise ``EmitError`` when ``ds_config.json`` without a Megatron-DeepSpeed launch would drop a knob: the JSON
    sets data parallelism, ZeRO, batch, precision and pipeline stages, and full recompute's
    ``activation_checkpointing`` section (the training script checkpoints every layer, as any DeepSpeed script can:
    ``deepspeed.checkpointing.checkpoint``, Hugging Face ``gradient_checkpointing_enable()``); tensor, context and
    expert parallelism, sequence parallelism and Megatron's selective recompute belong to the training script that
    builds the model."""
    for knob, on in ((f"tp {par.tp}", par.tp > 1), (f"cp {par.cp}", par.cp > 1), (f"ep {par.ep}", par.ep > 1),
                     ("sequence_parallel", par.sequence_parallel),
                     (f"recompute {par.recompute}", par.recompute not in ("none", "full")),
                     ("precision fp8", job.precision == "fp8"), ("unfused attention", not job.flash_attention),
                     ("dropout", job.dropout)):
        if on:
            raise EmitError(f"{knob}: ds_config.json alone does not set it (the training script does)")
