"""Colossal-AI ``HybridParallelPlugin`` / ``MoeHybridParallelPlugin`` arguments and a booster snippet for a plan.

Source: hpcaitech/ColossalAI ``colossalai/booster/plugin/hybrid_parallel_plugin.py`` and
``moe_hybrid_parallel_plugin.py`` at commit 4f9953be335ef371b3848719ddafe596c01ecd37 (2026-04-09; the
``__init__`` signature is the same in the PyPI release 0.5.0). tests/data/colossalai/ holds the plugins' parameter
lists, copied from that commit; the tests check every emitted keyword against them and the rules below.

Mapping (plan -> plugin keyword):

* ``tp`` -> ``tp_size``, ``pp`` -> ``pp_size``; the plugin derives dp = world / (tp x pp x sp) itself.
* ``sequence_parallel`` (Megatron-style, activations split over the tp group) -> ``enable_sequence_parallelism``
  with ``sequence_parallelism_mode="split_gather"`` (its Megatron-SP mode; it asserts tp_size > 1).
* ``cp`` > 1 (ring attention over a context-parallel group) -> ``sp_size=cp`` with mode ``"ring_attn"`` (which
  needs flash attention: with unfused attention refused). The plugin takes ONE ``sequence_parallelism_mode``, so
  cp > 1 together with Megatron-style sequence parallelism cannot be expressed and is refused, as is cp > 1 on the
  MoE plugin (its modes are split_gather, ring and all_to_all).
* ``zero_stage`` 0/1/2 -> ``zero_stage`` (the plugin asserts ``zero_stage in (0, 1, 2)``, and <= 1 with pp > 1);
  ZeRO-3 is Colossal-AI's ``GeminiPlugin``, another plugin: refused.
* ``micro_batch_size`` -> ``microbatch_size`` and ``num_microbatches`` = GBS / (mbs x dp) with pp > 1 (the
  plugin needs one of them); with pp = 1 the micro-batch is the dataloader's ``batch_size`` and the rest of the
  global batch is gradient accumulation (``gradient_accumulation_steps`` in the snippet).
* ``vpp`` > 1 -> ``pp_style="interleaved"``, ``num_model_chunks=vpp`` (the plugin asserts num_model_chunks > 1
  for interleaved and == 1 for 1f1b); an uneven split -> ``num_layers_per_stage`` (one entry per model chunk).
* ``ep`` > 1 -> ``MoeHybridParallelPlugin(ep_size=ep)``: experts split over the data-parallel group (it asserts
  dp % ep == 0), and it runs ZeRO-2 as ZeRO-1 (it resets ``zero_stage`` to 1 with a warning), so an MoE plan with
  ZeRO-2 is refused. Expert tensor parallelism other than tp (``etp``) has no keyword: refused.
* ``precision`` bf16/fp16 -> ``precision``; fp8 -> ``precision="bf16"`` + ``use_fp8=True`` (its own scaling: a
  job that names an ``fp8_recipe`` is refused).
* ``flash_attention`` -> ``enable_flash_attention``. ``recompute="full"`` -> the model's gradient checkpointing
  (``model.gradient_checkpointing_enable()``), with pp > 1 and ``recompute_num_layers`` N ->
  ``gradient_checkpoint_config=PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage=[N, ...])`` (the first
  N layers of each chunk, as Megatron's block method). ``recompute="selective"`` (core attention only) is what
  flash attention stores anyway; without flash attention it has no keyword: refused.

Refused with the knob named (``EmitUnsupported``): the above, schedules other than 1F1B / interleaved 1F1B,
Megatron pipeline layouts, embedding/loss-accounted splits, HSDP, per-module or uniform-method recompute,
low-precision optimizer states or master weights, optimizer / parameter CPU offload, and dropout (no plugin
keyword: the model's own config holds it).
"""
from __future__ import annotations

from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .megatron import EmitUnsupported

#: Commit of hpcaitech/ColossalAI the keywords and rules were read from.
COLOSSALAI_COMMIT = "4f9953be335ef371b3848719ddafe596c01ecd37"


def _refuse(knob: str, why: str) -> EmitUnsupported:
    return EmitUnsupported(f"{knob}: {why} (Colossal-AI HybridParallelPlugin)")


def _stage_layers(model: ModelSpec, par: ParallelConfig) -> list[int] | None:
    """Layers per model chunk in pipeline order (``num_layers_per_stage``), or None for an even split."""
    chunks = par.pp * par.vpp
    first, last = par.first_stage_layers, par.last_stage_layers
    if first is None and last is None:
        if model.num_layers % chunks:
            raise _refuse("pp", f"{model.num_layers} layers do not split evenly over pp x vpp = {chunks} chunks and "
                                "no uneven split is given")
        return None
    if par.vpp > 1:
        raise _refuse("first_stage_layers/last_stage_layers", "an uneven split with interleaving is not expressed")
    first = model.num_layers // par.pp if first is None else first
    last = model.num_layers // par.pp if last is None else last
    middle = model.num_layers - first - last
    if par.pp == 1:
        return None
    if par.pp == 2:
        return [first, last]
    if middle % (par.pp - 2):
        raise _refuse("first_stage_layers/last_stage_layers", f"the {middle} middle layers do not split evenly")
    return [first] + [middle // (par.pp - 2)] * (par.pp - 2) + [last]


def check_colossalai(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> None:
    """Raise ``EmitUnsupported`` naming the first knob the plugins cannot express (module docstring)."""
    moe = model.moe is not None and par.ep > 1
    if job.precision == "fp8" and job.fp8_recipe is not None:
        raise _refuse(f"fp8_recipe {job.fp8_recipe}", "use_fp8 computes its own scales from each tensor "
                                                      "(colossalai/quantization/fp8.py cast_to_fp8); it has no recipe "
                                                      "keyword")
    if par.zero_stage == 3:
        raise _refuse("zero_stage 3", "the plugin asserts zero_stage in (0, 1, 2); ZeRO-3 is GeminiPlugin")
    if par.pp > 1 and par.zero_stage > 1:
        raise _refuse(f"zero_stage {par.zero_stage} with pp {par.pp}", "the plugin asserts zero stage 0 or 1 with "
                                                                       "pipeline parallelism")
    if par.cp > 1 and par.sequence_parallel and par.tp > 1:
        raise _refuse(f"cp {par.cp} with sequence_parallel", "one sequence_parallelism_mode only: split_gather "
                                                             "(Megatron-style) or ring_attn (context parallel)")
    if par.cp > 1 and moe:
        raise _refuse(f"cp {par.cp} with ep {par.ep}", "MoeHybridParallelPlugin has no ring_attn mode")
    if moe and par.zero_stage == 2:
        raise _refuse("zero_stage 2 with ep", "MoeHybridParallelPlugin resets ZeRO-2 to ZeRO-1")
    if moe and par.dp % par.ep:
        raise _refuse(f"ep {par.ep}", f"MoeHybridParallelPlugin splits experts over the data-parallel group "
                                      f"(dp {par.dp} % ep {par.ep} != 0)")
    if moe and par.etp is not None and par.etp != par.tp:
        raise _refuse(f"etp {par.etp}", "no expert tensor-parallel size apart from tp_size")
    schedule = par.schedule or ("interleaved" if par.vpp > 1 else "1f1b")
    if schedule not in ("1f1b", "interleaved"):
        raise _refuse(f"schedule {schedule}", "pp_style is 1f1b, interleaved or zbv (ZeroBubble-V)")
    if par.pipeline_layout is not None:
        raise _refuse("pipeline_layout", "num_layers_per_stage places decoder layers only")
    if par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split:
        raise _refuse("account_for_embedding/loss_in_pipeline_split", "num_layers_per_stage counts decoder layers")
    if par.hsdp_shard_size is not None and par.hsdp_shard_size < par.dp * par.cp:
        raise _refuse(f"hsdp_shard_size {par.hsdp_shard_size}", "ZeRO shards over the whole data-parallel group")
    if par.recompute_modules is not None:
        raise _refuse("recompute_modules", "recomputation is per layer (gradient checkpointing)")
    if par.recompute == "selective" and not job.flash_attention:
        raise _refuse("recompute selective", "no core-attention recompute without flash attention")
    if par.recompute == "full" and par.recompute_num_layers is not None and par.pp == 1:
        raise _refuse(f"recompute_num_layers {par.recompute_num_layers} with pp 1", "partial checkpointing needs "
                                                                                   "the pipeline forward")
    if par.recompute == "full" and par.recompute_num_layers is not None and par.recompute_method != "block":
        raise _refuse(f"recompute_method {par.recompute_method}", "checkpointing takes the first layers of each "
                                                                  "stage (Megatron's block method)")
    if par.exp_avg_dtype != "fp32" or par.exp_avg_sq_dtype != "fp32" or par.main_params_dtype != "fp32":
        raise _refuse("exp_avg_dtype/exp_avg_sq_dtype/main_params_dtype", "optimizer states and master weights are "
                                                                          "fp32")
    if par.offload_modules:
        raise _refuse("offload_modules", "HybridParallelPlugin has no per-module activation offloading")
    if par.param_cpu_offload:
        raise _refuse("param_cpu_offload", "HybridParallelPlugin offloads optimizer states only (cpu_offload)")
    if par.optimizer_cpu_offload_fraction:
        raise _refuse("optimizer_cpu_offload_fraction", "cpu_offload moves the whole optimizer, not a fraction")
    if par.cp > 1 and not job.flash_attention:
        raise _refuse(f"cp {par.cp} with unfused attention", "ring_attn runs flash attention")
    if job.dropout:
        raise _refuse("dropout", "the plugins have no dropout setting (the model's config holds it), so the launch "
                                 "would not say the run has the dropout plan3d costed")
    if job.moe_expert_capacity_factor is not None:
        raise _refuse(f"moe_expert_capacity_factor {job.moe_expert_capacity_factor:g}",
                      "the plugins have no MoE routing setting; drop-and-pad is the model's router's")
    if job.global_batch_size % (par.micro_batch_size * par.dp):
        raise _refuse(f"global_batch_size {job.global_batch_size}",
                      f"not divisible by micro_batch_size x dp = {par.micro_batch_size} x {par.dp}")
    _stage_layers(model, par)


def colossalai_config(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> dict:
    """The plan document's ``launch.colossalai``: ``plugin`` (class name), ``kwargs`` (its keyword arguments,
    JSON values), ``gradient_checkpointing`` (bool), ``num_ckpt_layers_per_stage`` (list or None),
    ``dataloader_batch_size`` (sequences per data-parallel rank and step of the dataloader) and
    ``gradient_accumulation_steps``. Raises ``EmitUnsupported`` for a knob the plugin cannot express."""
    check_colossalai(model, job, par)
    moe = model.moe is not None and par.ep > 1
    n_micro = job.global_batch_size // (par.micro_batch_size * par.dp)
    kw: dict = {"tp_size": par.tp, "pp_size": par.pp}
    if moe:
        kw["ep_size"] = par.ep
    if par.cp > 1:
        kw.update(sp_size=par.cp, enable_sequence_parallelism=True, sequence_parallelism_mode="ring_attn")
    elif par.sequence_parallel and par.tp > 1:
        kw.update(enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather")
    kw["precision"] = "bf16" if job.precision == "fp8" else job.precision
    if job.precision == "fp8":
        kw["use_fp8"] = True
    kw["zero_stage"] = par.zero_stage
    kw["enable_flash_attention"] = bool(job.flash_attention)
    if moe:
        kw["overlap_communication"] = False  # the MoE plugin forces it off (ZeRO comm overlap hangs on idle experts)
    if par.pp > 1:
        kw.update(microbatch_size=par.micro_batch_size, num_microbatches=n_micro,
                  pp_style="interleaved" if par.vpp > 1 else "1f1b", num_model_chunks=par.vpp)
        layers = _stage_layers(model, par)
        if layers is not None:
            kw["num_layers_per_stage"] = layers
    ckpt = par.recompute == "full"
    per_stage = None
    if ckpt and par.pp > 1 and par.recompute_num_layers is not None:
        per_stage = [par.recompute_num_layers] * (par.pp * par.vpp)
    return {"plugin": "MoeHybridParallelPlugin" if moe else "HybridParallelPlugin", "kwargs": kw,
            "gradient_checkpointing": ckpt, "num_ckpt_layers_per_stage": per_stage,
            "dataloader_batch_size": par.micro_batch_size * (n_micro if par.pp > 1 else 1),
            "gradient_accumulation_steps": 1 if par.pp > 1 else n_micro}


def _py(v) -> str:
    return repr(v)


def colossalai_script(cfg: dict, header: str) -> str:
    """``colossalai_plugin.py``: the plugin built with the plan's arguments and a booster training step (a
    template: the model, optimizer, dataset and loss are the user's)."""
    kw = dict(cfg["kwargs"])
    lines = [f"# {header}", "# Colossal-AI booster setup for this plan (plan3d --emit colossalai); launch it with",
             "# launch_torchrun.sh / launch_slurm.sbatch (torchrun, one process per GPU).",
             "import colossalai", "from colossalai.booster import Booster",
             f"from colossalai.booster.plugin import {cfg['plugin']}"]
    if cfg["num_ckpt_layers_per_stage"] is not None:
        lines.append("from colossalai.shardformer.shard.grad_ckpt_config import PipelineGradientCheckpointConfig")
    lines += ["", "colossalai.launch_from_torch()", "", f"plugin = {cfg['plugin']}("]
    lines += [f"    {k}={_py(v)}," for k, v in kw.items()]
    if cfg["num_ckpt_layers_per_stage"] is not None:
        lines.append("    gradient_checkpoint_config=PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage="
                     f"{cfg['num_ckpt_layers_per_stage']!r}),")
    lines += [")", "booster = Booster(plugin=plugin)", "",
              f"DATALOADER_BATCH_SIZE = {cfg['dataloader_batch_size']}  # sequences per data-parallel rank and step",
              f"GRADIENT_ACCUMULATION_STEPS = {cfg['gradient_accumulation_steps']}", "", "",
              "def setup(model, optimizer, criterion, dataset, lr_scheduler=None):",
              '    """Boost the user\'s model, optimizer, loss and dataset with the planned plugin."""']
    if cfg["gradient_checkpointing"]:
        lines.append("    model.gradient_checkpointing_enable()  # recompute: full")
    lines += ["    dataloader = plugin.prepare_dataloader(dataset, batch_size=DATALOADER_BATCH_SIZE, shuffle=True,",
              "                                           drop_last=True)",
              "    model, optimizer, criterion, dataloader, lr_scheduler = booster.boost(",
              "        model, optimizer, criterion, dataloader, lr_scheduler)",
              "    return model, optimizer, criterion, dataloader, lr_scheduler", "", "",
              "def train_step(model, optimizer, criterion, batches):",
              '    """One optimizer step over GRADIENT_ACCUMULATION_STEPS dataloader batches."""']
    if kw["pp_size"] > 1:
        lines += ["    out = booster.execute_pipeline(iter(batches), model, criterion, optimizer, return_loss=True)",
                  "    optimizer.step()", "    optimizer.zero_grad()", "    return out[\"loss\"]"]
    else:
        lines += ["    for batch in batches:",
                  "        loss = criterion(model(**batch), batch) / GRADIENT_ACCUMULATION_STEPS",
                  "        booster.backward(loss, optimizer)",
                  "    optimizer.step()", "    optimizer.zero_grad()", "    return loss"]
    return "\n".join(lines) + "\n"
