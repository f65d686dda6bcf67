"""Launch-config emitters: Megatron-LM arguments and scripts, DeepSpeed JSON + Megatron-DeepSpeed arguments,
torchtitan TOML (0.2.x) and overrides (0.3.x).

``launch_fields`` gives what the plan JSON carries (everything a launch script needs); ``emit_files`` turns it
into the files ``plan3d plan --emit FRAMEWORK --output DIR`` writes. Both are pure functions of the plan, so
the same input gives byte-identical files.
"""
from __future__ import annotations

import json

from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .deepspeed import check_deepspeed, deepspeed_config, megatron_deepspeed_args
from .megatron import (SCRIPT_DATA_ARGS, SCRIPT_TRAIN_ARGS, EmitError, EmitUnsupported, launch_script, megatron_args,
                       pair_args)
from .torchtitan import torchtitan_overrides, torchtitan_toml

__all__ = ["megatron_args", "deepspeed_config", "megatron_deepspeed_args", "torchtitan_toml",
           "torchtitan_overrides", "launch_fields", "emit_files", "EmitError", "EmitUnsupported", "FRAMEWORKS", "check_deepspeed"]

FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")


def launch_fields(model: ModelSpec, job: TrainingJob, par: ParallelConfig, gpus_per_node: int) -> dict:
    """The plan document's ``launch`` section: nodes, GPUs per node, and each framework's arguments. A
    framework that cannot run the plan gets ``None`` and its one-line reason under ``unsupported``."""
    world = par.world_size
    out: dict = {"nodes": max(1, world // gpus_per_node), "gpus_per_node": min(gpus_per_node, world),
                 "world_size": world}
    unsupported: dict[str, str] = {}

    def attempt(key: str, framework: str, fn):
        try:
            out[key] = fn()
        except EmitError as e:
            out[key] = None
            unsupported[framework] = str(e)

    attempt("megatron", "megatron", lambda: megatron_args(model, job, par))
    attempt("deepspeed", "deepspeed", lambda: deepspeed_config(job, par, model))
    attempt("megatron_deepspeed", "megatron_deepspeed", lambda: megatron_deepspeed_args(model, job, par))
    attempt("torchtitan_toml", "torchtitan", lambda: torchtitan_toml(model, job, par))
    attempt("torchtitan_overrides", "torchtitan", lambda: torchtitan_overrides(model, job, par))
    out["unsupported"] = unsupported
    return out


def _header(framework: str, model_name: str, rank: int, launch) -> str:
    return (f"plan3d: {framework} launch for {model_name}, plan #{rank}, {launch.nodes} node(s) x "
            f"{launch.gpus_per_node} GPUs")


def emit_files(doc, framework: str, rank: int = 1) -> dict[str, str]:
    """File name -> content for plan ``rank`` (1 = best) of ``doc`` (a ``PlanDocument``).

    Raises:
        EmitError: no such rank, or the framework cannot run that plan (the reason names the knob).
    """
    if framework not in FRAMEWORKS:
        raise EmitError(f"--emit {framework}: choose one of {', '.join(FRAMEWORKS)}")
    ranks = [p.rank for p in doc.plans]
    plan = next((p for p in doc.plans if p.rank == rank), None)
    if plan is None:
        raise EmitError(f"--rank {rank}: the document has plans {ranks[0]}..{ranks[-1]}" if ranks
                        else f"--rank {rank}: the document has no plans")
    launch = plan.launch
    if framework in launch.unsupported:
        raise EmitUnsupported(f"plan #{rank} cannot run on {framework}: {launch.unsupported[framework]}")
    name = doc.input.model.name
    header = _header(framework, name, rank, launch)

    def scripts(entry: str, args: list[str], env: dict[str, str], data: list[str], train: list[str]) -> dict:
        return {f"launch_{kind}.{ext}": launch_script(kind, entry, args, launch.nodes, launch.gpus_per_node,
                                                      header, env, data, train)
                for kind, ext in (("torchrun", "sh"), ("slurm", "sbatch"))}

    if framework == "megatron":
        args = launch.megatron
        # Megatron-LM's example scripts export CUDA_DEVICE_MAX_CONNECTIONS=1 (examples/gpt3/
        # train_gpt3_175b_distributed.sh); Megatron-FSDP forbids it ("FSDP always requires
        # CUDA_DEVICE_MAX_CONNECTIONS value large than one", validate_args).
        env = {} if "--use-megatron-fsdp" in args else {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        return {"megatron_args.txt": "\n".join(pair_args(args)) + "\n",
                **scripts("pretrain_gpt.py", args, env, SCRIPT_DATA_ARGS, SCRIPT_TRAIN_ARGS)}
    if framework == "deepspeed" and "megatron_deepspeed" in launch.unsupported:
        # ds_config.json is valid for any DeepSpeed training script that builds the model itself (HF Trainer,
        # accelerate, custom loops); only the Megatron-DeepSpeed launch cannot express this plan.
        return {"ds_config.json": json.dumps(launch.deepspeed, indent=2, allow_nan=False) + "\n",
                "megatron_deepspeed_unsupported.txt": f"# {header}\n# Megatron-DeepSpeed launch not emitted: "
                                                      f"{launch.unsupported['megatron_deepspeed']}\n"}
    if framework == "deepspeed":
        args = launch.megatron_deepspeed
        in_script = ["$CONFIG_DIR/ds_config.json" if a == "ds_config.json" else a for a in args]
        # Megatron-DeepSpeed reads real data only: set DATA_ARGS (--data-path, --vocab-file, --merge-file).
        return {"ds_config.json": json.dumps(launch.deepspeed, indent=2, allow_nan=False) + "\n",
                "megatron_deepspeed_args.txt": "\n".join(pair_args(args)) + "\n",
                **scripts("pretrain_gpt.py", in_script, {}, [], SCRIPT_TRAIN_ARGS)}
    return {"torchtitan.toml": launch.torchtitan_toml,
            "torchtitan_overrides.txt": "\n".join(pair_args(launch.torchtitan_overrides)) + "\n",
            **scripts("-m torchtitan.train", ["--job.config_file", "$CONFIG_DIR/torchtitan.toml"], {}, [], [])}
