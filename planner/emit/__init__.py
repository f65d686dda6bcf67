"""Launch-config emitters: Megatron-LM arguments and scripts, DeepSpeed JSON + Megatron-DeepSpeed arguments,
torchtitan TOML (0.2.x) and overrides (0.3.x), Colossal-AI plugin arguments and booster snippet.

``launch_fields`` gives what the plan JSON carries (everything a launch script needs); ``emit_files`` turns it
into the files ``plan3d plan --emit FRAMEWORK --output DIR`` writes. Both are pure functions of the plan, so
the same input gives byte-identical files.
"""
from __future__ import annotations

import json

from cluster_specs import nodes_holding
from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .colossalai import colossalai_config, colossalai_script
from .deepspeed import check_deepspeed, check_ds_config_alone, deepspeed_config, megatron_deepspeed_args
from .env import launch_env
from .megatron import (SCRIPT_DATA_ARGS, SCRIPT_TRAIN_ARGS, EmitError, EmitUnsupported, launch_script, megatron_args,
                       pair_args)
from .torchtitan import torchtitan_overrides, torchtitan_toml

__all__ = ["megatron_args", "deepspeed_config", "megatron_deepspeed_args", "megatron_deepspeed_refusal",
           "torchtitan_toml", "torchtitan_overrides", "colossalai_config", "launch_fields", "emit_files", "LAUNCHERS",
           "EmitError", "EmitUnsupported", "FRAMEWORKS", "check_deepspeed", "job_refusal", "RECOMPUTE_IN_SCRIPT"]

#: The note that goes with a ``ds_config.json`` emitted alone for a plan with full recompute: the JSON's
#: ``activation_checkpointing`` section configures DeepSpeed's checkpointing, the training script turns it on.
RECOMPUTE_IN_SCRIPT = ("recompute full: checkpoint every transformer layer in the training script "
                       "(deepspeed.checkpointing.checkpoint, configured by ds_config.json's activation_checkpointing; "
                       "Hugging Face: model.gradient_checkpointing_enable())")

#: ``--emit`` targets: the frameworks whose rules plan3d models, and Colossal-AI (emitted only; planned under
#: Megatron-LM's rules)
FRAMEWORKS = ("megatron", "deepspeed", "torchtitan", "colossalai")


def launch_fields(model: ModelSpec, job: TrainingJob, par: ParallelConfig, gpus_per_node: int,
                  cluster: ClusterSpec | None = None) -> dict:
    """The plan document's ``launch`` section: nodes, GPUs per node, each framework's arguments and the
    environment variables of its launch (``env.launch_env``; NVLS needs ``cluster``). A framework that cannot run
    the plan gets ``None`` and its one-line reason under ``unsupported``."""
    world = par.world_size
    out: dict = {"nodes": nodes_holding(world, gpus_per_node), "gpus_per_node": min(gpus_per_node, world),
                 "world_size": world}
    unsupported: dict[str, str] = {}

    def attempt(key: str, framework: str, fn):
        try:
            out[key] = fn()
        except EmitError as e:
            out[key] = None
            unsupported[framework] = str(e)

    attempt("megatron", "megatron", lambda: megatron_args(model, job, par, cluster))
    attempt("deepspeed", "deepspeed", lambda: deepspeed_config(job, par, model))
    attempt("megatron_deepspeed", "megatron_deepspeed", lambda: megatron_deepspeed_args(model, job, par))
    attempt("torchtitan_toml", "torchtitan", lambda: torchtitan_toml(model, job, par))
    # the 0.3.x overrides apart: the 0.2.2 TOML may launch a plan they cannot (a registry config's converters)
    attempt("torchtitan_overrides", "torchtitan_overrides", lambda: torchtitan_overrides(model, job, par))
    attempt("colossalai", "colossalai", lambda: colossalai_config(model, job, par))
    if out["deepspeed"] is not None and out["megatron_deepspeed"] is None:
        try:  # without a Megatron-DeepSpeed launch the JSON alone must carry every knob
            check_ds_config_alone(job, par)
        except EmitError as e:
            out["deepspeed"] = None
            unsupported["deepspeed"] = f"{e}; and no Megatron-DeepSpeed launch: {unsupported['megatron_deepspeed']}"
    out["unsupported"] = unsupported
    out["env"] = {fw: launch_env(fw, par, cluster, job) for fw in FRAMEWORKS if fw not in unsupported}
    return out


def job_refusal(framework: str, model: ModelSpec, job: TrainingJob) -> str | None:
    """Why ``framework``'s launch cannot run ``job`` on ``model`` whatever the layout (None when some layout may):
    its refusal of the one-GPU layout, which sets no parallel, sharding or recompute knob and so passes every rule
    about a layout; what is left is the model's features and the job's own knobs (precision, attention, dropout,
    cross entropy, MoE routing).

    Raises:
        EmitError: ``framework`` is not an ``--emit`` target.
    """
    if framework not in FRAMEWORKS:
        raise EmitError(f"--emit {framework}: choose one of {', '.join(FRAMEWORKS)}")
    return _bare_unsupported(model, job).get(framework)


def megatron_deepspeed_refusal(model: ModelSpec, job: TrainingJob) -> str | None:
    """Why no Megatron-DeepSpeed launch (``pretrain_gpt.py`` arguments) can build ``model`` for ``job`` whatever the
    layout (e.g. Llama 3's RoPE scaling, which it has no option for); None when some layout may. Without it
    ``--emit deepspeed`` writes ``ds_config.json`` alone (``check_ds_config_alone``)."""
    return _bare_unsupported(model, job).get("megatron_deepspeed")


def _bare_unsupported(model: ModelSpec, job: TrainingJob) -> dict[str, str]:
    """``launch_fields``' refusals for the one-GPU layout of ``job``."""
    bare = ParallelConfig(dp=1, micro_batch_size=1)
    return launch_fields(model, job.model_copy(update={"global_batch_size": 1}), bare, 1)["unsupported"]


def _header(framework: str, model_name: str, rank: int, launch) -> str:
    """One comment line (the scripts write it after ``#``): the name's control characters escaped."""
    name = model_name if model_name.isprintable() else model_name.encode("unicode_escape").decode("ascii")
    return (f"plan3d: {framework} launch for {name}, plan #{rank}, {launch.nodes} node(s) x "
            f"{launch.gpus_per_node} GPUs")


#: ``--launcher`` choices: ``scripts`` (launch_torchrun.sh + launch_slurm.sbatch) or ``k8s`` (a Kubeflow
#: PyTorchJob manifest, pytorchjob.yaml)
LAUNCHERS = ("scripts", "k8s")


def _parts(framework: str, launch, header: str) -> tuple[dict[str, str], str, list[str], dict[str, str], list[str],
                                                        list[str]]:
    """(config files, torchrun entry, model-parallel args, env, data args, train args) of one framework's launch;
    config files are found through ``$CONFIG_DIR``; the env is exactly the document's ``launch.env`` (env.py)."""
    env = launch.env.get(framework, {})
    if framework == "megatron":
        args = launch.megatron
        return ({"megatron_args.txt": "\n".join(pair_args(args)) + "\n"}, "pretrain_gpt.py", args, env,
                SCRIPT_DATA_ARGS, SCRIPT_TRAIN_ARGS)
    if framework == "deepspeed":
        args = launch.megatron_deepspeed
        in_script = ["$CONFIG_DIR/ds_config.json" if a == "ds_config.json" else a for a in args]
        # Megatron-DeepSpeed reads real data only: set DATA_ARGS (--data-path, --vocab-file, --merge-file).
        return ({"ds_config.json": json.dumps(launch.deepspeed, indent=2, allow_nan=False) + "\n",
                 "megatron_deepspeed_args.txt": "\n".join(pair_args(args)) + "\n"}, "pretrain_gpt.py", in_script,
                env, [], SCRIPT_TRAIN_ARGS)
    if framework == "colossalai":
        return ({"colossalai_plugin.json": json.dumps(launch.colossalai, indent=2, allow_nan=False) + "\n",
                 "colossalai_plugin.py": colossalai_script(launch.colossalai, header)}, "train.py", [], env, [], [])
    overrides = ({"torchtitan_overrides.txt": "\n".join(pair_args(launch.torchtitan_overrides)) + "\n"}
                 if launch.torchtitan_overrides is not None else
                 {"torchtitan_overrides_unsupported.txt": f"# {header}\n# torchtitan 0.3.x overrides not emitted: "
                                                          f"{launch.unsupported['torchtitan_overrides']}\n"})
    return ({"torchtitan.toml": launch.torchtitan_toml, **overrides},
            "-m torchtitan.train", ["--job.config_file", "$CONFIG_DIR/torchtitan.toml"], env, [], [])


def emit_files(doc, framework: str, rank: int = 1, launcher: str = "scripts") -> dict[str, str]:
    """File name -> content for plan ``rank`` (1 = best) of ``doc`` (a ``PlanDocument``): the framework's config
    files and, with ``launcher="scripts"``, ``launch_torchrun.sh`` + ``launch_slurm.sbatch``; with
    ``launcher="k8s"``, ``pytorchjob.yaml`` (planner/emit/k8s.py).

    Raises:
        EmitError: no such rank, unknown launcher, or the framework cannot run that plan (the reason names the
            knob; ``EmitUnsupported``).
    """
    if framework not in FRAMEWORKS:
        raise EmitError(f"--emit {framework}: choose one of {', '.join(FRAMEWORKS)}")
    if launcher not in LAUNCHERS:
        raise EmitError(f"--launcher {launcher}: choose one of {', '.join(LAUNCHERS)}")
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
    if framework == "deepspeed" and "megatron_deepspeed" in launch.unsupported:
        # ds_config.json is valid for any DeepSpeed training script that builds the model itself (HF Trainer,
        # accelerate, custom loops); only the Megatron-DeepSpeed launch cannot express this plan.
        if launcher == "k8s":
            raise EmitUnsupported(f"plan #{rank}: --launcher k8s needs a Megatron-DeepSpeed launch: "
                                  f"{launch.unsupported['megatron_deepspeed']}")
        ckpt = f"# {RECOMPUTE_IN_SCRIPT}\n" if "activation_checkpointing" in launch.deepspeed else ""
        return {"ds_config.json": json.dumps(launch.deepspeed, indent=2, allow_nan=False) + "\n",
                "megatron_deepspeed_unsupported.txt": f"# {header}\n# Megatron-DeepSpeed launch not emitted: "
                                                      f"{launch.unsupported['megatron_deepspeed']}\n{ckpt}"}
    configs, entry, args, env, data, train = _parts(framework, launch, header)
    if launcher == "k8s":
        from .k8s import CONFIG_DIR, job_name, pytorchjob_manifest
        cmd = ["torchrun", "--nnodes", str(launch.nodes), "--nproc-per-node", str(launch.gpus_per_node),
               *entry.split(), *[a.replace("$CONFIG_DIR", CONFIG_DIR) for a in args], *data, *train]
        mounted = {k: v for k, v in configs.items() if not k.endswith(".txt")}  # .txt: the args, already in cmd
        return {**configs, "pytorchjob.yaml": pytorchjob_manifest(job_name(name, rank), launch.nodes,
                                                                  launch.gpus_per_node, cmd, env, mounted, header)}
    return {**configs, **{f"launch_{kind}.{ext}": launch_script(kind, entry, args, launch.nodes, launch.gpus_per_node,
                                                                header, env, data, train)
                          for kind, ext in (("torchrun", "sh"), ("slurm", "sbatch"))}}
