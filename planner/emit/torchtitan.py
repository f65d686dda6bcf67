"""torchtitan launch configs for a plan: the TOML of the releases that read TOML (0.2.x JobConfig) and the
command-line overrides of the current release (0.3.x, Python config registry + ``--section.field`` flags).

Key names: torchtitan 0.2.2 ``torchtitan/config/job_config.py`` (``[parallelism]``, ``[training]``,
``[activation_checkpoint]``) and 0.3.0 ``ParallelismConfig`` / ``TrainingConfig`` (formulas.md Sec. 7.3,
validators.md Sec. 4).

Mapping (each choice documented by torchtitan):

* Data parallelism is FSDP2 (``data_parallel_shard_degree = dp``, replicate 1), except ZeRO-0 with data
  parallelism alone, which is torchtitan's DDP (``data_parallel_replicate_degree = dp``): the DDP path refuses
  to combine with any other parallel dimension ("DDP has not supported > 1D parallelism",
  ``models/llama3/infra/parallelize.py``), so torchtitan-ranked plans use ZeRO-0 only there. ZeRO-3 plans
  reshard after forward (``fsdp_reshard_after_forward = "always"``); ZeRO 0-2 plans of other frameworks emitted
  for torchtitan keep parameters gathered between forward and backward (``"never"``, which torchtitan's help
  text describes as ZeRO-2-like), so memory is at most the plan's.
* Batch: torchtitan counts micro-batches per DP rank: with pp > 1 ``local_batch_size = GBS / dp`` split into
  micro-batches of ``pipeline_parallel_microbatch_size = micro_batch_size``; with pp == 1 ``local_batch_size =
  micro_batch_size`` and torchtitan accumulates ``GBS / (local_batch_size * dp)`` gradients.
* Pipeline split: torchtitan's ``generate_llm_fqn_per_model_part`` spreads ``num_layers + first_less +
  last_less`` over ``ceil(that / layers_per_stage)`` virtual stages, the first (last) stage carrying
  ``first_less`` (``last_less``) fewer layers. The plan's split is reproduced exactly: layers per virtual stage =
  the plan's middle-stage layers / vpp, and ``first_less = last_less =`` (middle - end stage layers) / vpp.
* Schedule (PyTorch ``get_schedule_class`` names, torch 2.13 ``distributed/pipelining/schedules.py``): ``1F1B``
  (one stage per rank), ``Interleaved1F1B`` (vpp > 1), ``GPipe``, ``ZBVZeroBubble`` (ZB-V) and ``DualPipeV`` (two
  stages per rank in a V: torchtitan ``pipeline_module_split`` style "v", ``pipeline_parallel_layers_per_stage`` =
  L / 2pp). torch refuses those two with compiled stage modules ("not supported with stage modules that have used
  torch.compile", ``_check_torch_compile_compatibility``; torchtitan 0.2.2 ``apply_compile`` wraps each block in
  ``torch.compile``), so their plans compile the loss only; DualPipeV turns on torchtitan's expert-parallel
  overlap of the paired forward/backward (``pipeline_parallel_expert_parallel_overlap``, which needs
  ``activation_checkpoint.mode = "none"`` with EP). ZB-H1 (torch's ``InterleavedZeroBubble`` is ZB1P over two or
  more stages per rank), DualPipe and Megatron's combined 1F1B have no torchtitan schedule: refused.
* Refused, with the knob named (``check_torchtitan``), because torchtitan would run another configuration than
  the one evaluated: ZeRO-1/2 (FSDP2 shards weights, gradients and optimizer states together), ZeRO-0 with any
  dimension besides data parallelism (DDP is 1-D only), a partial full recompute (``recompute_num_layers``; full
  activation checkpointing wraps every block), Megatron's ``recompute_modules``, bf16 gradient reduction (0.2.2
  ``mixed_precision_reduce`` is float32 only), FP8 weights / low-precision Adam moments / optimizer offload, FP8
  GEMMs (torchao converters, not the per-tensor Transformer Engine recipe plan3d times), fp16 training
  (``mixed_precision_param`` takes bfloat16 or float32; no loss scaling), unfused attention, dropout, and Transformer
  Engine's cross entropy.
"""
from __future__ import annotations

from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .megatron import EmitError, recipe_knobs_set, unexpressed_features

#: plan3d model name -> (torchtitan model name, flavor) for models with a torchtitan definition (torchtitan
#: ``models/llama3/__init__.py`` llama3_configs "8B"/"70B"/"405B"; ``models/deepseek_v3`` "671B").
TORCHTITAN_MODELS: dict[str, tuple[str, str]] = {
    "llama3.1-8b": ("llama3", "8B"),
    "llama3.1-70b": ("llama3", "70B"),
    "llama3.1-405b": ("llama3", "405B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
    # models/qwen3/__init__.py qwen3_configs (SDPA attention, qk_norm, untied embeddings, rope_theta 1e6, the HF
    # dims); not "235B-A22B", whose rope_theta 5e6 is not Qwen3-235B-A22B's 1e6 (config.json)
    "qwen3-8b": ("qwen3", "8B"),
    "qwen3-32b": ("qwen3", "32B"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
}
#: 0.3.x config-registry functions of the same models (``--module M --config C``; ``deepseek_v3_671b``, not its
#: ``_float8`` variant: ``models/deepseek_v3/config_registry.py`` at 0.3.0).
TORCHTITAN_REGISTRY: dict[str, tuple[str, str]] = {
    "llama3.1-8b": ("llama3", "llama3_8b"),
    "llama3.1-70b": ("llama3", "llama3_70b"),
    "llama3.1-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
    "qwen3-32b": ("qwen3", "qwen3_32b"),          # 0.3.0 has no plain Qwen3-8B config
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
}

#: 0.3.x registry configs whose model spec carries converters a plan3d plan does not cost: ``llama3_405b`` builds
#: every linear but ``lm_head`` as a torchao ``Float8Linear`` (``models/llama3/config_registry.py`` at 0.3.0; parsing
#: it without torchao fails "torchao is not installed"). The model spec is not a command-line field, so the 0.3.x
#: overrides cannot launch those models as planned (the 0.2.2 TOML can).
TORCHTITAN_REGISTRY_CONVERTERS: dict[str, str] = {"llama3.1-405b": "Float8 linears (torchao)"}

_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe", "zb-v": "ZBVZeroBubble",
              "dualpipev": "DualPipeV"}
#: Schedules torch refuses with compiled stage modules (``_check_torch_compile_compatibility``).
_NO_COMPILE_SCHEDULES = ("zb-v", "dualpipev")


def check_torchtitan(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> None:
    """Raise ``EmitError`` naming the first knob of ``par`` torchtitan cannot run as evaluated (module docstring)."""
    s = par.pipeline_schedule
    if par.pp > 1 and s not in _SCHEDULES:
        raise EmitError(f"pipeline schedule {s}: torchtitan runs {', '.join(_SCHEDULES)} (torch get_schedule_class; "
                        f"InterleavedZeroBubble is ZB1P over >= 2 stages per rank)")
    if par.pp > 1 and par.vpp > 1 and s in ("1f1b", "gpipe"):
        raise EmitError(f"pipeline schedule {s} with vpp {par.vpp}: torch's {_SCHEDULES[s]} runs one stage per rank")
    if s in _NO_COMPILE_SCHEDULES and par.vpp != 2:
        raise EmitError(f"pipeline schedule {s} with vpp {par.vpp}: torch's {_SCHEDULES[s]} runs exactly two stages "
                        f"per rank")
    if s == "dualpipev" and par.ep > 1 and par.recompute != "none":
        raise EmitError(f"recompute {par.recompute} with DualPipeV and ep {par.ep}: torchtitan's expert-parallel "
                        f"overlap does not support activation checkpointing (job_config.py)")
    if par.zero_stage in (1, 2):
        raise EmitError(f"zero_stage {par.zero_stage}: torchtitan's FSDP2 shards weights, gradients and optimizer "
                        f"states together (zero 0 or 3); plan with --framework torchtitan")
    if par.zero_stage == 0 and (par.tp, par.pp, par.cp, par.ep) != (1, 1, 1, 1) and par.dp * par.cp > 1:
        raise EmitError("zero_stage 0 with tp/pp/cp/ep: torchtitan's DDP does not combine with other dimensions "
                        "(\"DDP has not supported > 1D parallelism\"); plan with --framework torchtitan")
    if par.tp > 1 and not par.sequence_parallel:
        raise EmitError(f"sequence_parallel off with tp {par.tp}: torchtitan's tensor parallelism shards the norms "
                        f"over the sequence (apply_tp: SequenceParallel)")
    if par.recompute_num_layers is not None:
        raise EmitError(f"recompute_num_layers {par.recompute_num_layers}: torchtitan's full activation "
                        f"checkpointing wraps every block")
    if par.recompute == "selective" and par.recompute_modules:
        raise EmitError(f"recompute_modules {','.join(par.recompute_modules)}: Megatron's selective recompute modules; "
                        f"torchtitan's selective mode is its per-op policy")
    job_knobs = [k for k, on in (("param_cpu_offload", par.param_cpu_offload),
                                 ("precision fp8", job.precision == "fp8"),
                                 # mixed_precision_param: Literal["bfloat16", "float32"] (0.2.2 and 0.3.0), no
                                 # loss scaling
                                 ("precision fp16", job.precision == "fp16"),
                                 ("unfused attention", not job.flash_attention), ("dropout", job.dropout),
                                 # the launch compiles the loss (compile.components below)
                                 ("cross_entropy_loss_fusion false", job.cross_entropy_loss_fusion is False)) if on]
    for knob in (recipe_knobs_set(job, par, expressed=("cross_entropy_loss_fusion",)) + job_knobs)[:1]:
        raise EmitError(f"{knob}: torchtitan has no setting that runs it as plan3d evaluated it "
                        f"(planner/emit/torchtitan.py)")
_DTYPE = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32"}


def _stage_layers(model: ModelSpec, par: ParallelConfig) -> tuple[int, int, int]:
    """(layers per middle stage, first stage layers, last stage layers) of the plan."""
    L, pp = model.num_layers, par.pp
    if par.first_stage_layers is None and par.last_stage_layers is None:
        return L // pp, L // pp, L // pp
    f = par.first_stage_layers or 0
    la = par.last_stage_layers or 0
    n_mid = pp - (par.first_stage_layers is not None) - (par.last_stage_layers is not None)
    mid = (L - f - la) // n_mid if n_mid else max(f, la)
    return mid, (f if par.first_stage_layers is not None else mid), (la if par.last_stage_layers is not None else mid)


def torchtitan_settings(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> dict[str, dict]:
    """Section -> {key: value} of the 0.2.x JobConfig (insertion order is the output order).

    Raises:
        EmitError: a knob torchtitan cannot express (``check_torchtitan``), or a layer split it cannot build.
    """
    check_torchtitan(model, job, par)
    feature = unexpressed_features(model)
    if feature is not None:
        raise EmitError(f"{feature}: no torchtitan 0.2 flavor of plan3d's carries it")
    if par.ep > 1 and par.expert_tp not in (1, par.tp):
        raise EmitError(f"etp {par.expert_tp}: torchtitan allows expert tensor parallel 1 or = tp ({par.tp})")
    # a model torchtitan has no built-in flavor for keeps its own name: the launch fails until the user registers it
    # (``torchtitan_toml``'s header says so), rather than training another architecture
    name, flavor = TORCHTITAN_MODELS.get(model.name, (model.name, model.name))
    shard, replicate = par.dp, 1
    if par.zero_stage == 0 and (par.tp, par.pp, par.cp, par.ep) == (1, 1, 1, 1):
        # pure data parallelism without sharding: torchtitan's DDP (data_parallel_replicate_degree = dp), the
        # zero 0 the plan's memory and time assume; with other dimensions torchtitan needs FSDP (below)
        shard, replicate = 1, par.dp
    hsdp = getattr(par, "hsdp_shard_size", None)
    if hsdp is not None and hsdp < par.dp * par.cp:
        # HSDP: torchtitan shards over data_parallel_shard_degree x cp and replicates across
        # data_parallel_replicate_degree (ParallelDims: dp_replicate * dp_shard * cp * tp * pp = world)
        if hsdp % par.cp or (par.dp * par.cp) % hsdp:
            raise EmitError(f"hsdp_shard_size {hsdp}: must be a multiple of cp {par.cp} dividing dp*cp")
        shard, replicate = hsdp // par.cp, par.dp * par.cp // hsdp
    pl: dict = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                "fsdp_reshard_after_forward": "always" if par.zero_stage == 3 else "never",
                "tensor_parallel_degree": par.tp, "context_parallel_degree": par.cp,
                "pipeline_parallel_degree": par.pp}
    if getattr(par, "pipeline_layout", None) is not None:
        raise EmitError("pipeline_layout: torchtitan has no Megatron layout string (it splits by layers per stage)")
    if par.recompute == "full" and par.recompute_num_layers is not None:
        raise EmitError(f"recompute_num_layers {par.recompute_num_layers}: torchtitan's full activation checkpointing "
                        "wraps every transformer block (activation_checkpoint.mode full), no subset or group of N")
    emb = int(getattr(par, "account_for_embedding_in_pipeline_split", False))
    loss = int(getattr(par, "account_for_loss_in_pipeline_split", False))
    if par.pp > 1 and (emb or loss):
        # Megatron counts the embedding (loss) as one layer of the first (last) chunk; torchtitan's
        # first/last_stage_less_layers are the same weights: (L + emb + loss) / (pp * vpp) slots per virtual stage
        total = model.num_layers + emb + loss
        if total % (par.pp * par.vpp):
            raise EmitError(f"{total} layer slots do not split over pp {par.pp} x vpp {par.vpp} virtual stages")
        per, fl, ll = total // (par.pp * par.vpp), emb, loss
    if par.pp > 1 and not (emb or loss):
        mid, first, last = _stage_layers(model, par)
        v = par.vpp
        if v > 1 and (first != mid or last != mid):
            # torchtitan lightens only the first/last virtual stage, Megatron every chunk of the end ranks
            raise EmitError(f"vpp {v} with first/last stage layers {first}/{last}: torchtitan has no Megatron-style "
                            f"uneven split with interleaving")
        if mid % v or (mid - first) % v or (mid - last) % v:
            raise EmitError(f"vpp {v}: stage layers (first {first}, middle {mid}, last {last}) do not split into "
                            f"{v} torchtitan virtual stages")
        per = mid // v
        fl, ll = (mid - first) // v, (mid - last) // v
    if par.pp > 1:
        if per - fl < 1 or per - ll < 1:
            raise EmitError(f"vpp {par.vpp}: the first/last torchtitan virtual stage would hold no layer")
        sched = par.pipeline_schedule if par.vpp > 1 or par.pipeline_schedule != "interleaved" else "1f1b"
        pl.update({"pipeline_parallel_schedule": _SCHEDULES[sched],
                   "pipeline_parallel_microbatch_size": par.micro_batch_size,
                   "pipeline_parallel_layers_per_stage": per,
                   "pipeline_parallel_first_stage_less_layers": fl,
                   "pipeline_parallel_last_stage_less_layers": ll})
        if sched == "dualpipev":
            pl["pipeline_parallel_expert_parallel_overlap"] = True
    if model.moe is not None:
        pl["expert_parallel_degree"] = par.ep
        pl["expert_tensor_parallel_degree"] = par.expert_tp if par.ep > 1 else par.tp
    local = job.global_batch_size // par.dp if par.pp > 1 else par.micro_batch_size
    training = {"local_batch_size": local, "global_batch_size": job.global_batch_size, "seq_len": job.seq_length,
                "mixed_precision_param": _DTYPE[job.precision], "mixed_precision_reduce": "float32"}
    ac: dict = {"mode": par.recompute}
    if par.recompute == "selective":
        ac["selective_ac_option"] = "op"
    # torch.compile of the blocks and the loss: the memory and time of the torchtitan plans are calibrated on
    # compiled runs (torchtitan benchmarks/llama3_h100_202412_torchtitan.md; eager needs ~9% more memory)
    compile_ = {"enable": True, "components": ["loss"] if par.pipeline_schedule in _NO_COMPILE_SCHEDULES
                else ["model", "loss"]}
    return {"model": {"name": name, "flavor": flavor}, "training": training, "parallelism": pl,
            "activation_checkpoint": ac, "compile": compile_}


def model_settings_note(model: ModelSpec) -> str:
    """The parameter-free settings a registered torchtitan flavor must carry (torchtitan model args
    ``rope_theta``, ``norm_eps``, RoPE scaling and router settings live in the flavor, not in the job config)."""
    parts = [f"rope_theta {model.rope_theta:g}" if model.position_embedding == "rope" else
             f"position embedding {model.position_embedding}", f"norm_eps {model.norm_eps:g}"]
    if model.rotary_percent != 1.0:
        parts.append(f"rotary fraction {model.rotary_percent:g}")
    if model.rope_scaling is not None:
        rs = model.rope_scaling
        parts.append("rope_scaling " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in rs.model_dump().items() if v is not None))
    if model.moe is not None:
        m = model.moe
        parts.append(f"router {m.score_function}" + (" + expert bias" if m.router_bias else "")
                     + (f", {m.topk_group} of {m.n_group} groups" if m.n_group and m.topk_group else "")
                     + (f", scale {m.routed_scaling_factor:g}" if m.routed_scaling_factor != 1.0 else "")
                     + ("" if m.norm_topk_prob else ", top-k weights not renormalised"))
    return "; ".join(parts)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"unsupported TOML value {v!r}")


def torchtitan_toml(model: ModelSpec, job: TrainingJob, par: ParallelConfig, header: str = "") -> str:
    """TOML text for torchtitan 0.2.x (``--job.config_file FILE``)."""
    out = [f"# {line}" for line in header.splitlines()] if header else []
    if model.name not in TORCHTITAN_MODELS:
        out.append(f"# torchtitan has no built-in flavor for {model.name}: register one with its dims first")
        out.append(f"# and the settings that define it: {model_settings_note(model)}")
    for section, kv in torchtitan_settings(model, job, par).items():
        if out:
            out.append("")
        out.append(f"[{section}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
    return "\n".join(out) + "\n"


def torchtitan_overrides(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> list[str]:
    """Command-line overrides for torchtitan 0.3.x (``--module M --config C`` then ``--section.field value``).
    0.3.0 has no ``expert_tensor_parallel_degree`` or ``selective_ac_option``, so parallelism degrees,
    schedule, batch and sequence length are set as flags and the activation-checkpoint mode as the subcommand
    ``activation-checkpoint:none|selective|full`` (last); CUDA graphs off (``--training.disable_cuda_graphs``,
    which PP and the all-to-all EP dispatcher need anyway). The registry configs leave compile off (``llama3_8b``,
    ``llama3_70b``) or turn async TP on (``llama3_405b``), so the compile settings of the TOML are given too
    (``--compile.components`` takes a comma-separated list), and the mixed-precision dtypes. Checked with torchtitan
    0.3.0's ``ConfigManager``.

    Raises:
        EmitError: as ``torchtitan_settings``, or a registry config whose model carries converters the plan did not
            cost (``TORCHTITAN_REGISTRY_CONVERTERS``).
    """
    s = torchtitan_settings(model, job, par)
    # no registered config: name the model itself, so that torchtitan refuses to start until one is registered
    # (never a stand-in such as llama3_debugmodel, which would train another model)
    module, config = TORCHTITAN_REGISTRY.get(model.name, (model.name, model.name))
    converters = TORCHTITAN_REGISTRY_CONVERTERS.get(model.name)
    if converters is not None:
        raise EmitError(f"--config {config}: torchtitan 0.3's config trains {converters}, which the {job.precision} "
                        f"plan did not cost, and its model is no command-line field; launch torchtitan 0.2.2 with "
                        f"torchtitan.toml")
    a = ["--module", module, "--config", config]
    pl = dict(s["parallelism"])
    pl.pop("expert_tensor_parallel_degree", None)  # 0.3.x: expert TP follows tp
    pl.pop("pipeline_parallel_expert_parallel_overlap", None)  # 0.3.x ParallelismConfig has no such switch
    for k, v in pl.items():
        a += [f"--parallelism.{k}", str(v)]
    t = s["training"]
    for k in ("local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param", "mixed_precision_reduce"):
        a += [f"--training.{k}", str(t[k])]
    c = s["compile"]
    a += ["--compile.enable", "--compile.components", ",".join(c["components"]),
          "--compile.no-enable-async-tensor-parallel"]
    # CUDA graphs off, as costed (cost_models: torchtitan runs eager launches); 0.3.0 refuses them with PP ("CUDA
    # graphs do not support pipeline parallelism yet") and with the all-to-all EP dispatcher ("CUDA graphs support
    # only expert parallel token dispatcher configurations without CPU synchronization")
    a.append("--training.disable_cuda_graphs")
    # activation checkpointing is a tyro subcommand (tagged union) given after the options
    a.append(f"activation-checkpoint:{par.recompute}")
    return a
