"""Megatron-LM ``pretrain_gpt.py`` arguments and launch scripts for a plan.

Argument names are today's (NVIDIA/Megatron-LM ``megatron/training/arguments.py``; the full list of names the
parser accepts, with the commit it was read from, is ``tests/data/megatron_arg_names.txt``; formulas.md
Sec. 7.1). The rules the arguments must satisfy are Megatron-LM's ``validate_args`` (commit 000c4ac24f61,
``megatron/training/arguments.py``) and megatron-core's ``TransformerConfig.__post_init__``; the tests build
megatron-core's own config objects from these arguments.

Choices (each the framework's documented behaviour):

* Virtual pipeline: ``--num-layers-per-virtual-pipeline-stage`` for an even split; with an uneven split
  (``--decoder-first/last-pipeline-num-layers``) Megatron refuses that flag ("please use
  --num-virtual-stages-per-pipeline-rank ... when enable uneven pipeline parallelism", ``validate_args``), so
  ``--num-virtual-stages-per-pipeline-rank`` is used there.
* ZeRO stage 1 is Megatron's distributed optimizer (``--use-distributed-optimizer``); stages 2 and 3 are
  Megatron-FSDP with the flags its user guide requires (docs/discussions/megatron-fsdp-user-guide:
  ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads|optim_grads_params
  --no-gradient-accumulation-fusion --use-distributed-optimizer --ckpt-format fsdp_dtensor``; ``validate_args``
  asserts the checkpoint format). With pp > 1: ``validate_args`` forbids pp > 1 for ``--use-torch-fsdp2`` but
  has no such rule for Megatron-FSDP, and megatron-core's configs accept it; not yet run on GPUs here.
* ``--overlap-param-gather`` needs the distributed optimizer (or Megatron-FSDP) and ``--overlap-grad-reduce``
  (``validate_args``), so it is only emitted with both.
* Full recompute: ``--recompute-method uniform --recompute-num-layers 1`` (every layer) unless the plan
  recomputes only some layers per stage, then ``block`` with that count (``TransformerConfig`` requires a
  method and a layer count with granularity ``full``).
* Settings that define the model without holding parameters are always emitted, so the run trains the model
  of the plan and not Megatron's defaults: ``--rotary-base`` (an ``int`` option; Megatron default 10000),
  ``--rotary-percent``, ``--norm-epsilon`` (default 1e-5), ``--apply-layernorm-1p``, ``--squared-relu``; Llama 3.1
  RoPE scaling as ``--use-rope-scaling --rope-scaling-factor`` (megatron-core ``RotaryEmbedding._apply_scaling``
  hard-codes low/high frequency factors 1/4 and 8192 original positions, so other values are refused); YaRN
  only for multi-latent attention (``--rope-type yarn --rotary-scaling-factor --mscale --mscale-all-dim``; the
  other YaRN values must equal ``MLATransformerConfig``'s defaults 4096/32/1, else refused; MLA without scaling
  gets ``--rope-type rope``, since MLA defaults to YaRN); the router: ``--moe-router-score-function``,
  ``--moe-router-enable-expert-bias``, ``--moe-router-num-groups/--moe-router-group-topk`` (node-limited
  routing), ``--moe-router-topk-scaling-factor`` and ``--moe-router-pre-softmax`` for a softmax router whose
  top-k weights are not renormalised (HF ``norm_topk_prob`` false; megatron-core ``topk_routing_with_score_
  function`` renormalises sigmoid top-k scores, so sigmoid without renormalisation is refused); drop-and-pad routing
  (``--capacity-factor``) as ``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity``.
* MoE routing kernels: ``--moe-router-fusion --moe-permute-fusion`` (Transformer Engine's fused top-k router, TE >=
  2.7, and its Triton permutation kernels, TE >= 2.1; Megatron-LM ``TransformerConfig``), the kernels the step-time
  model charges (``moe_overhead.moe_routing_s``) and the MoE recipes run (``examples/moe_recipes/*.yaml``: both
  true). Measured on an H200 (``benchmarks/moe_routing_device.py``), the unfused PyTorch path takes 3-7x the fused
  permutation's GPU time, and Megatron-LM's unfused router 1.3-3x that of two top-k kernels.
* Pipeline schedule: 1F1B, interleaved 1F1B (``vpp`` > 1) or, for ``combined-1f1b``,
  ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute`` (``combined_1f1b.py``); other schedules (GPipe,
  ZB-H1, ZB-V, DualPipe, DualPipeV) are refused: Megatron-LM does not run them (``check_megatron``).
* FP8: the recipe the cost model assumed (``fp8_args``): ``--fp8-recipe mxfp8`` on Blackwell and ``blockwise``
  for MoE models on Hopper with ``--fp8-format e4m3`` (Megatron-LM ``examples/moe_recipes``), else
  ``--fp8-format hybrid`` (E4M3 forward, E5M2 backward) with ``--fp8-recipe delayed``, ``--fp8-amax-history-len
  1024 --fp8-amax-compute-algo max`` (NVIDIA's Megatron-LM ``examples/llama/train_llama3_8b_h100_fp8.sh``).
"""
from __future__ import annotations

import shlex

from cluster_specs.spec import ClusterSpec
from cost_models.collectives import moe_token_dispatcher
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.elementwise import cross_entropy_impl
from cost_models.layout import group_placement
from cost_models.fp8_recipe import default_fp8_recipe, per_tensor_fp8_recipe
from model_zoo.spec import ModelSpec

from ..launch_options import megatron_overlaps_dp

#: Defaults of the runnable script's data and training arguments (mock data, no dataset needed). Users replace
#: them with DATA_ARGS / TRAIN_ARGS in the environment. Values are placeholders, not tuned hyper-parameters.
SCRIPT_DATA_ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer"]
SCRIPT_TRAIN_ARGS = ["--train-iters", "100", "--lr", "3.0e-4", "--min-lr", "3.0e-5", "--lr-decay-style", "cosine",
                     "--lr-warmup-iters", "10", "--weight-decay", "0.1", "--clip-grad", "1.0",
                     "--log-interval", "1", "--eval-iters", "0"]


class EmitError(ValueError):
    """The plan cannot be expressed for this framework (one line naming the knob and the framework's rule)."""


class EmitUnsupported(EmitError):
    """A valid plan that the target framework cannot run (the CLI exits 1, as for an infeasible plan)."""


def _layer_pattern(model: ModelSpec) -> str | None:
    """``--moe-layer-freq`` pattern ("([0]*3+[1]*58)": 1 = MoE layer), or None when every layer is MoE."""
    flags = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    if all(flags):
        return None
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def _num(x: float) -> str:
    """A float option value as the shortest text that parses back to it (1e-05, 2.5, 40)."""
    return repr(float(x)) if float(x) != int(x) or abs(x) >= 1e16 else str(int(x))


def _activation_flag(model: ModelSpec) -> str | None:
    """Megatron's activation flag: gated SiLU -> ``--swiglu``; squared ReLU -> ``--squared-relu``; GeLU is the
    default (None)."""
    act = model.activation.lower()
    if model.gated_mlp and act in ("swiglu", "silu"):
        return "--swiglu"
    if not model.gated_mlp and act in ("relu2", "squared-relu", "squared_relu"):
        return "--squared-relu"
    if not model.gated_mlp and act.startswith("gelu"):
        return None
    raise EmitError(f"activation {model.activation!r} (gated_mlp {model.gated_mlp}): Megatron-LM has gated SiLU "
                    f"(--swiglu), squared ReLU (--squared-relu) or GeLU (default)")


def rope_args(model: ModelSpec) -> list[str]:
    """RoPE base, rotated fraction and scaling (see the module docstring for the rules)."""
    if model.position_embedding != "rope":
        return []
    if float(model.rope_theta) != int(model.rope_theta):
        raise EmitError(f"rope_theta {model.rope_theta}: Megatron-LM's --rotary-base is an integer option")
    a = ["--rotary-base", str(int(model.rope_theta))]
    if model.rotary_percent != 1.0:
        a += ["--rotary-percent", _num(model.rotary_percent)]
    rs = model.rope_scaling
    if rs is None:
        if model.mla is not None:
            a += ["--rope-type", "rope"]  # MLA defaults to YaRN in Megatron-LM
        return a
    if rs.type == "llama3":
        # megatron-core RotaryEmbedding._apply_scaling(low_freq_factor=1, high_freq_factor=4,
        # original_max_position_embeddings=8192): only the factor is an option
        got = (rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position_embeddings)
        if model.mla is not None or got != (1.0, 4.0, 8192):
            raise EmitError(f"rope_scaling llama3 (low/high freq factor, original positions) {got}: Megatron-LM "
                            f"applies Llama 3.1 scaling with (1, 4, 8192) only, to standard attention")
        return a + ["--use-rope-scaling", "--rope-scaling-factor", _num(rs.factor)]
    if rs.type == "yarn":
        # MLATransformerConfig defaults (megatron-core): original_max_position_embeddings 4096, beta_fast 32,
        # beta_slow 1; factor, mscale, mscale_all_dim are options (--rotary-scaling-factor, --mscale, ...)
        got = (rs.original_max_position_embeddings, rs.beta_fast or 32.0, rs.beta_slow or 1.0)
        if model.mla is None or got != (4096, 32.0, 1.0):
            raise EmitError(f"rope_scaling yarn (original positions, beta_fast, beta_slow) {got}: Megatron-LM "
                            f"applies YaRN to multi-latent attention with (4096, 32, 1) only")
        return a + ["--rope-type", "yarn", "--rotary-scaling-factor", _num(rs.factor),
                    "--mscale", _num(1.0 if rs.mscale is None else rs.mscale),
                    "--mscale-all-dim", _num(0.0 if rs.mscale_all_dim is None else rs.mscale_all_dim)]
    # linear position interpolation: --rotary-seq-len-interpolation-factor (an integer option)
    if model.mla is not None or float(rs.factor) != int(rs.factor):
        raise EmitError(f"rope_scaling linear factor {rs.factor}: Megatron-LM's --rotary-seq-len-interpolation-factor "
                        f"is an integer option for standard attention")
    return a + ["--rotary-seq-len-interpolation-factor", str(int(rs.factor))]


def router_args(model: ModelSpec) -> list[str]:
    """Router settings of a MoE model (see the module docstring)."""
    moe = model.moe
    if moe is None:
        return []
    a: list[str] = []
    if moe.score_function != "softmax":
        a += ["--moe-router-score-function", moe.score_function]
    if moe.router_bias:
        a.append("--moe-router-enable-expert-bias")
    if moe.n_group is not None and moe.topk_group is not None and moe.topk_group < moe.n_group:
        a += ["--moe-router-num-groups", str(moe.n_group), "--moe-router-group-topk", str(moe.topk_group)]
    if not moe.norm_topk_prob and moe.top_k > 1:
        if moe.score_function == "sigmoid":
            raise EmitError("moe.norm_topk_prob false with a sigmoid router: megatron-core renormalises the top-k "
                            "sigmoid scores (topk_routing_with_score_function)")
        a.append("--moe-router-pre-softmax")
    if moe.routed_scaling_factor != 1.0:
        a += ["--moe-router-topk-scaling-factor", _num(moe.routed_scaling_factor)]
    if moe.aux_loss_coeff > 0:
        # the model's load-balancing loss; Megatron-LM's default coefficient is 0 (no balancing loss)
        a += ["--moe-aux-loss-coeff", _num(moe.aux_loss_coeff)]
    return a


def unexpressed_features(model: ModelSpec) -> str | None:
    """The first parameter-bearing or attention-shaping feature of ``model`` that the Megatron-LM, Megatron-DeepSpeed
    and torchtitan launches here do not express (None when there is none): attention sinks, biased experts or
    router (gpt-oss), ALiBi and the embedding LayerNorm (BLOOM), sliding-window or chunked attention layers
    (gpt-oss, Llama 4). Emitting without them would
    train a different model, so the emitters refuse with the feature named."""
    if model.attention_sinks:
        return "attention_sinks (one learned logit per head, gpt-oss)"
    if model.position_embedding == "alibi":
        # megatron-core has no ALiBi (its embeddings: learned_absolute, rope, none; ``LanguageModelEmbedding`` at
        # d98e8a64dd); "none" would train without any position signal
        return "position_embedding alibi (ALiBi attention biases, BLOOM)"
    if model.embedding_layernorm:
        return "embedding_layernorm (a LayerNorm after the word embeddings, BLOOM)"
    if model.moe is not None and (model.moe.expert_bias or model.moe.router_linear_bias):
        return "moe expert_bias / router_linear_bias (biased experts and router, gpt-oss)"
    kinds = sorted(set(model.layer_types or ()) - {"full_attention"})
    if kinds:
        window = f" (window {model.sliding_window} tokens)" if "sliding_attention" in kinds else ""
        return f"layer_types {', '.join(kinds)}{window}"
    return None


def model_args(model: ModelSpec, job: TrainingJob) -> list[str]:
    """Architecture arguments (dims, attention, MLP, norm, positions, MoE, MLA)."""
    feature = unexpressed_features(model)
    if feature is not None:
        raise EmitError(f"{feature}: not expressed by this launch, so it would train a different model")
    a: list[str] = []
    add = a.extend
    ffn = model.ffn_hidden_size
    if model.moe is not None and model.moe.dense_ffn_hidden_size:
        ffn = model.moe.dense_ffn_hidden_size
    add(["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
         "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(ffn),
         "--seq-length", str(job.seq_length),
         "--max-position-embeddings", str(max(job.seq_length, model.max_position_embeddings)),
         "--vocab-size", str(model.vocab_size)])
    if model.mla is not None:
        m = model.mla
        a.append("--multi-latent-attention")
        if m.q_lora_rank:
            add(["--q-lora-rank", str(m.q_lora_rank)])
        add(["--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_nope_head_dim),
             "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim", str(m.v_head_dim)])
    else:
        if model.num_kv_heads != model.num_attention_heads:
            add(["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)])
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            add(["--kv-channels", str(model.head_dim)])
    act = _activation_flag(model)
    if act is not None:
        a.append(act)
    if model.normalization == "rmsnorm":
        add(["--normalization", "RMSNorm"])
    elif model.layernorm_1p:
        a.append("--apply-layernorm-1p")
    add(["--norm-epsilon", _num(model.norm_eps)])
    if model.qk_norm or model.mla is not None:
        # MLA's latent RMSNorms (DeepSeek-V3 q_a_layernorm / kv_a_layernorm) exist in megatron-core only with
        # --qk-layernorm (gpt_layer_specs.py: q_layernorm / kv_layernorm = TENorm if qk_layernorm else IdentityOp)
        a.append("--qk-layernorm")
    if model.position_embedding == "rope":
        add(["--position-embedding-type", "rope", *rope_args(model)])
    elif model.position_embedding == "none":
        add(["--position-embedding-type", "none"])
    if not model.linear_bias:
        a.append("--disable-bias-linear")
        if model.qkv_bias:
            a.append("--add-qkv-bias")
    if not model.tie_word_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not job.dropout:
        # Megatron-LM defaults both to 0.1 (arguments.py; TransformerConfig.attention_dropout / hidden_dropout);
        # the memory model stores no dropout masks unless the job has dropout (TrainingJob.dropout)
        add(["--attention-dropout", "0.0", "--hidden-dropout", "0.0"])
    if model.moe is not None:
        moe = model.moe
        add(["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
             "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size), "--moe-grouped-gemm"])
        if job.moe_expert_capacity_factor is not None:
            # drop-and-pad routing, as costed (TrainingJob.moe_expert_capacity_factor)
            add(["--moe-expert-capacity-factor", _num(job.moe_expert_capacity_factor),
                 "--moe-pad-expert-input-to-capacity"])
        if moe.shared_expert_ffn_hidden_size:
            add(["--moe-shared-expert-intermediate-size", str(moe.shared_expert_ffn_hidden_size)])
        if moe.shared_expert_gate:
            a.append("--moe-shared-expert-gate")
        add(router_args(model))
        pattern = _layer_pattern(model)
        if pattern is not None:
            add(["--moe-layer-freq", pattern])
    if model.num_mtp_layers:
        add(["--mtp-num-layers", str(model.num_mtp_layers)])
    return a


def recipe_knobs_set(job: TrainingJob, par: ParallelConfig, expressed: tuple[str, ...] = ()) -> list[str]:
    """The Megatron-LM recipe knobs ``par`` / ``job`` set away from their defaults (bf16 gradient reduction, FP8
    weights, low-precision Adam moments or master weights, optimizer offload, a fused or Transformer Engine cross
    entropy,
    fine-grained activation offloading, drop-and-pad MoE routing),
    each as the knob with its value, less those in ``expressed`` (the caller's framework has a setting for them):
    the other frameworks have no setting that runs them as plan3d evaluates them."""
    return [knob for name, knob, on in (
        ("grad_reduce_in_bf16", "grad_reduce_in_bf16", par.grad_reduce_in_bf16),
        ("fp8_param_gather", "fp8_param_gather", par.fp8_param_gather),
        ("exp_avg_dtype", f"exp_avg_dtype {par.exp_avg_dtype}", par.exp_avg_dtype != "fp32"),
        ("exp_avg_sq_dtype", f"exp_avg_sq_dtype {par.exp_avg_sq_dtype}", par.exp_avg_sq_dtype != "fp32"),
        ("main_params_dtype", f"main_params_dtype {par.main_params_dtype}", par.main_params_dtype != "fp32"),
        ("optimizer_cpu_offload_fraction", f"optimizer_cpu_offload_fraction {par.optimizer_cpu_offload_fraction:g}",
         par.optimizer_cpu_offload_fraction > 0),
        ("cross_entropy_fusion_impl", "cross_entropy_fusion_impl te", cross_entropy_impl(job, "megatron") == "te"),
        ("cross_entropy_loss_fusion", "cross_entropy_loss_fusion", cross_entropy_impl(job, "megatron") == "native"),
        ("offload_modules", f"offload_modules {','.join(par.offload_modules or ())}", bool(par.offload_modules)),
        ("moe_expert_capacity_factor", f"moe_expert_capacity_factor {job.moe_expert_capacity_factor or 0:g} with "
         "moe_pad_expert_input_to_capacity", job.moe_expert_capacity_factor is not None),
    ) if on and name not in expressed]


#: Pipeline schedules Megatron-LM runs: 1F1B and interleaved 1F1B (``pipeline_parallel/schedules.py``) and the
#: combined 1F1B of ``--overlap-moe-expert-parallel-comm`` (``combined_1f1b.py``).
MEGATRON_SCHEDULES = ("1f1b", "interleaved", "combined-1f1b")


def check_megatron(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> None:
    """Raise ``EmitError`` naming the first knob of ``par`` that Megatron-LM's arguments cannot express (the plan
    would otherwise run as another configuration than the one evaluated)."""
    s = par.pipeline_schedule
    if s not in MEGATRON_SCHEDULES:
        raise EmitError(f"pipeline schedule {s}: Megatron-LM runs 1f1b, interleaved and combined-1f1b "
                        f"(pipeline_parallel/schedules.py, combined_1f1b.py)")
    if s == "1f1b" and par.vpp > 1:
        raise EmitError(f"pipeline schedule 1f1b with vpp {par.vpp}: Megatron-LM interleaves whenever a rank holds "
                        f"several model chunks")
    if model.moe is None and par.etp is not None and par.etp != par.tp:
        raise EmitError(f"etp {par.etp}: expert tensor parallelism needs a mixture-of-experts model")
    if par.recompute_num_layers is not None and par.recompute != "full":
        raise EmitError(f"recompute_num_layers {par.recompute_num_layers} with recompute {par.recompute}: "
                        f"--recompute-num-layers applies to full recompute")
    if getattr(par, "param_cpu_offload", False):
        raise EmitError("param_cpu_offload: Megatron-LM has no parameter CPU offload (DeepSpeed ZeRO-3 offload_param)")
    if getattr(par, "fp8_param_gather", False) and job.precision != "fp8":
        raise EmitError(f"fp8_param_gather with precision {job.precision}: --fp8-param-gather needs FP8 training")


def fp8_args(model: ModelSpec, par: ParallelConfig, cluster: ClusterSpec | None = None,
             recipe: str | None = None) -> list[str]:
    """``--fp8-format`` / ``--fp8-recipe`` of an FP8 run: ``recipe``, else the recipe the cost model assumed
    (``cost_models.fp8_recipe.default_fp8_recipe``; without a cluster, the per-tensor recipes).

    - ``mxfp8`` / ``blockwise``: ``--fp8-format e4m3`` (the Megatron-LM MoE recipes' values, ``examples/moe_recipes``).
    - ``tensorwise``: megatron-core ``TransformerConfig``: "Delayed scaling does not support moe_act and layernorm
      recompute for fp8" -> per-tensor current scaling (Transformer Engine >= 2.6), ``--fp8-format hybrid``.
    - ``delayed``: ``--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max``
      (``examples/llama/train_llama3_8b_h100_fp8.sh``).
    """
    if recipe is None:
        recipe = default_fp8_recipe(cluster, model, par) if cluster is not None else per_tensor_fp8_recipe(par)
    if recipe in ("mxfp8", "blockwise"):
        return ["--fp8-format", "e4m3", "--fp8-recipe", recipe]
    if recipe == "tensorwise":
        return ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
    return ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "1024",
            "--fp8-amax-compute-algo", "max"]


def dispatcher_args(job: TrainingJob, par: ParallelConfig, cluster: ClusterSpec | None) -> list[str]:
    """``--moe-token-dispatcher-type``: the dispatcher whose traffic the step-time model charged
    (``collectives.moe_token_dispatcher``): ``flex`` for dropless routing with the job's stated backend
    (``--moe-flex-dispatcher-backend``, and ``--moe-flex-dispatcher-num-sms`` when set), or with DeepEP over an EP
    group that spans NVLink domains (DeepEP / HybridEP must be installed, as in Megatron-LM's MoE recipes), else
    ``alltoall``. Without a cluster the EP group's placement is unknown: ``alltoall`` unless a backend is stated."""
    placement = None if cluster is None else group_placement("ep", par, cluster.node.nvlink_domain_size)
    if moe_token_dispatcher(job, placement) == "flex":
        out = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
               job.moe_flex_dispatcher_backend or "deepep"]
        if job.moe_flex_dispatcher_num_sms is not None:
            out += ["--moe-flex-dispatcher-num-sms", str(job.moe_flex_dispatcher_num_sms)]
        return out
    return ["--moe-token-dispatcher-type", "alltoall"]


def parallel_args(model: ModelSpec, job: TrainingJob, par: ParallelConfig,
                  cluster: ClusterSpec | None = None, fp8_recipe: str | None = None) -> list[str]:
    """Parallelism, batch, recompute, optimizer-sharding and precision arguments (``fp8_recipe``: as ``fp8_args``).

    Raises:
        EmitError: a knob Megatron-LM cannot express (``check_megatron``), or a split it refuses.
    """
    check_megatron(model, job, par)
    a: list[str] = []
    add = a.extend
    add(["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp)])
    layout = getattr(par, "pipeline_layout", None)
    if layout is not None:
        # the layout string fixes the layers of every model chunk and vpp (chunks / pp); validate_args allows no
        # other virtual-pipeline or uneven-split argument with it
        add(["--pipeline-model-parallel-layout", layout])
    if layout is None and par.first_stage_layers is not None:
        add(["--decoder-first-pipeline-num-layers", str(par.first_stage_layers)])
    if layout is None and par.last_stage_layers is not None:
        add(["--decoder-last-pipeline-num-layers", str(par.last_stage_layers)])
    if layout is None and getattr(par, "account_for_embedding_in_pipeline_split", False):
        a.append("--account-for-embedding-in-pipeline-split")
    if layout is None and getattr(par, "account_for_loss_in_pipeline_split", False):
        a.append("--account-for-loss-in-pipeline-split")
    if par.vpp > 1 and layout is None:
        if par.pp == 1:
            raise EmitError(f"vpp {par.vpp}: Megatron's interleaved schedule needs pipeline-model-parallel size > 1")
        if par.first_stage_layers is None and par.last_stage_layers is None:
            # validate_args counts the embedding/loss as layers when they are accounted in the split
            total = model.num_layers + int(getattr(par, "account_for_embedding_in_pipeline_split", False)) \
                + int(getattr(par, "account_for_loss_in_pipeline_split", False))
            per_rank = total // par.pp
            if total % par.pp or per_rank % par.vpp:
                raise EmitError(f"vpp {par.vpp}: {total} layers over pp {par.pp} do not split into "
                                f"{par.vpp} equal virtual stages")
            add(["--num-layers-per-virtual-pipeline-stage", str(per_rank // par.vpp)])
        else:
            add(["--num-virtual-stages-per-pipeline-rank", str(par.vpp)])
    if par.pipeline_schedule == "combined-1f1b":
        # combined 1F1B: EP all-to-all of one micro-batch under another's compute; expert weight gradients moved
        # behind the backward dispatch (megatron-core TransformerConfig: delay_wgrad_compute needs the overlap)
        add(["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"])
    if par.cp > 1:
        add(["--context-parallel-size", str(par.cp)])
    if model.moe is not None:
        add(["--expert-model-parallel-size", str(par.ep), "--expert-tensor-parallel-size", str(par.expert_tp)])
        add(dispatcher_args(job, par, cluster))
        # the fused router and permutation kernels whose time moe_overhead.moe_routing_s charges
        add(["--moe-router-fusion", "--moe-permute-fusion"])
    elif par.ep > 1:
        raise EmitError(f"ep {par.ep}: expert parallelism needs a mixture-of-experts model ({model.name} is dense)")
    if par.sequence_parallel:
        a.append("--sequence-parallel")
    add(["--micro-batch-size", str(par.micro_batch_size), "--global-batch-size", str(job.global_batch_size)])
    if par.recompute == "selective":
        add(["--recompute-granularity", "selective"])
        modules = getattr(par, "recompute_modules", None)
        if modules:
            add(["--recompute-modules", *modules])
    elif par.recompute == "full":
        if par.recompute_num_layers is None:
            add(["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"])
        else:
            add(["--recompute-granularity", "full", "--recompute-method", getattr(par, "recompute_method", "block"),
                 "--recompute-num-layers", str(par.recompute_num_layers)])
    sharded_dp = megatron_overlaps_dp(par.dp, par.cp)
    if par.zero_stage >= 1:
        a.append("--use-distributed-optimizer")
    if par.zero_stage >= 2:
        add(["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
             "optim_grads" if par.zero_stage == 2 else "optim_grads_params", "--no-gradient-accumulation-fusion",
             "--ckpt-format", "fsdp_dtensor"])
    hsdp = getattr(par, "hsdp_shard_size", None)
    if hsdp is not None and hsdp < par.dp * par.cp:
        if par.zero_stage == 0 or (par.dp * par.cp) % hsdp:
            raise EmitError(f"hsdp_shard_size {hsdp}: needs ZeRO >= 1 and must divide dp*cp = {par.dp * par.cp}")
        # shard within groups of hsdp ranks, replicate across (dp*cp)/hsdp instances (Megatron-LM
        # --num-distributed-optimizer-instances; Megatron-FSDP uses the same flag for HSDP)
        add(["--num-distributed-optimizer-instances", str(par.dp * par.cp // hsdp)])
    if getattr(par, "grad_reduce_in_bf16", False):
        a.append("--grad-reduce-in-bf16")
    m1, m2 = getattr(par, "exp_avg_dtype", "fp32"), getattr(par, "exp_avg_sq_dtype", "fp32")
    master = getattr(par, "main_params_dtype", "fp32")
    if master == "bf16" and par.zero_stage < 2:
        raise EmitError("main_params_dtype bf16: Megatron keeps bf16 master weights only under Megatron-FSDP "
                        "(--megatron-fsdp-main-params-dtype, zero_stage 2 or 3); --main-params-dtype allows fp32 or fp16")
    offload = getattr(par, "optimizer_cpu_offload_fraction", 0.0)
    if (m1, m2, master) != ("fp32", "fp32", "fp32") or offload > 0:
        # the optimizer CPU offload runs on the precision-aware optimizer's code path (arguments.py: "must be used
        # in conjunction with --use-precision-aware-optimizer")
        add(["--use-precision-aware-optimizer", "--exp-avg-dtype", m1, "--exp-avg-sq-dtype", m2])
        if master == "fp16":
            add(["--main-params-dtype", "fp16"])
        elif master == "bf16":
            add(["--megatron-fsdp-main-params-dtype", "bf16"])
    if offload > 0:
        # the copies and the CPU step pipelined per parameter, as cost_models/optimizer_offload.py times them
        add(["--optimizer-cpu-offload", "--optimizer-offload-fraction", f"{offload:g}",
             "--overlap-cpu-optimizer-d2h-h2d"])
    off_mods = getattr(par, "offload_modules", None)
    if off_mods:
        # fine-grained activation offloading (cost_models/activation_offload.py); with Transformer Engine >= 2.10
        # Megatron also needs NVTE_CPU_OFFLOAD_V1=1 in the environment (arguments.py validate_args)
        add(["--fine-grained-activation-offloading", "--offload-modules", *off_mods])
    if sharded_dp:
        a.append("--overlap-grad-reduce")
        if par.zero_stage >= 1:
            a.append("--overlap-param-gather")
    if job.precision == "fp16":
        a.append("--fp16")
    elif job.precision != "fp32":  # fp32 is Megatron's default (no --bf16/--fp16): fp32 params, FP32Optimizer
        a.append("--bf16")
    if job.precision == "fp8":
        add(fp8_args(model, par, cluster, fp8_recipe or job.fp8_recipe))
        if getattr(par, "fp8_param_gather", False):
            a.append("--fp8-param-gather")
    ce = cross_entropy_impl(job, "megatron")  # the loss the step time charged
    if ce == "te":
        add(["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"])
    elif ce == "native":
        add(["--cross-entropy-loss-fusion"])
    if not job.flash_attention:
        add(["--attention-backend", "unfused"])
    return a


def megatron_args(model: ModelSpec, job: TrainingJob, par: ParallelConfig,
                  cluster: ClusterSpec | None = None, fp8_recipe: str | None = None) -> list[str]:
    """The argument list (flags and values as separate strings) for ``pretrain_gpt.py``; ``cluster`` picks the FP8
    recipe of an FP8 run unless ``fp8_recipe`` names it (``fp8_args``)."""
    return model_args(model, job) + parallel_args(model, job, par, cluster, fp8_recipe)


def pair_args(args: list[str]) -> list[str]:
    """Group ``["--a", "1", "--b"]`` into ``["--a 1", "--b"]`` (shell-quoted), one flag per line in scripts.
    Tokens starting with ``$CONFIG_DIR/`` are double-quoted so the shell expands the variable."""
    out: list[str] = []
    for x in args:
        q = f'"{x}"' if x.startswith("$CONFIG_DIR/") else shlex.quote(x)
        if x.startswith("--") or not out or ":" in x and not x.startswith(("$", "(")):  # tyro subcommand
            out.append(q)
        else:
            out[-1] += " " + q
    return out


def _bash_array(name: str, args: list[str]) -> str:
    body = "".join(f"  {p}\n" for p in pair_args(args))
    return f"{name}=(\n{body})\n"


def launch_script(kind: str, entry: str, args: list[str], nodes: int, gpus_per_node: int, header: str,
                  env: dict[str, str], data_args: list[str], train_args: list[str]) -> str:
    """A bash launch script.

    ``kind="torchrun"``: run once on every node (NODE_RANK 0..NNODES-1, MASTER_ADDR = node 0; the defaults suit
    one node). ``kind="slurm"``: an ``sbatch`` script, one ``torchrun`` per node under ``srun`` with c10d
    rendezvous on the first node. ``entry`` is what torchrun runs (``pretrain_gpt.py`` or ``-m module``);
    ENTRY, DATA_ARGS and TRAIN_ARGS in the environment replace the defaults. Config files written next to the
    script are found through CONFIG_DIR (the script's folder; the submit folder under Slurm).
    """
    lines = ["#!/usr/bin/env bash", f"# {header}"]
    if kind == "slurm":
        lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={gpus_per_node}",
                  "#SBATCH --exclusive"]
    else:
        lines += [f"# {nodes} node(s) x {gpus_per_node} GPUs: run on every node with NODE_RANK (0..{nodes - 1}) and "
                  "MASTER_ADDR (node 0) set."]
    lines += ["set -euo pipefail", ""]
    for k, v in env.items():
        lines.append(f"export {k}={shlex.quote(v)}")
    lines += [f"NNODES={nodes}", f"GPUS_PER_NODE={gpus_per_node}"]
    if kind == "slurm":
        lines += ['CONFIG_DIR=${CONFIG_DIR:-${SLURM_SUBMIT_DIR:-.}}',
                  'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)']
    else:
        lines += ['CONFIG_DIR=${CONFIG_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}',
                  "NODE_RANK=${NODE_RANK:-0}", "MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}"]
    lines += ["MASTER_PORT=${MASTER_PORT:-29500}", f'read -r -a ENTRY <<< "${{ENTRY:-{entry}}}"', ""]
    text = "\n".join(lines) + "\n"
    text += _bash_array("MODEL_PARALLEL_ARGS", args)
    text += f'read -r -a DATA_ARGS <<< "${{DATA_ARGS:-{shlex.join(data_args)}}}"\n'
    text += f'read -r -a TRAIN_ARGS <<< "${{TRAIN_ARGS:-{shlex.join(train_args)}}}"\n\n'
    if kind == "slurm":
        text += ('srun torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" \\\n'
                 '  --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\\n')
    else:
        text += ('exec torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" \\\n'
                 '  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\\n')
    text += '  "${ENTRY[@]}" "${MODEL_PARALLEL_ARGS[@]}" ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} ' \
            '${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} "$@"\n'
    return text
