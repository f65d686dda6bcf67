"""Environment variables a plan's launch needs (the plan document's ``launch.env``; the generated scripts export
the same values).

Megatron-LM (``validate_args``, ``megatron/training/arguments.py``, NVIDIA/Megatron-LM commit 000c4ac24f61):

* ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor or context parallelism: "Using tensor model parallelism or context
  parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" (asserted before
  Blackwell; Megatron-LM's and Megatron-DeepSpeed's example scripts export it on every GPU).
* Megatron-FSDP (``zero_stage`` 2 and 3 here) forbids it: "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value
  large than one". The CUDA default (8; CUDA C++ Programming Guide, environment variables: 1 to 32, default 8) is
  set explicitly, so that a container exporting 1 does not stop the run.
* The combined 1F1B (``--overlap-moe-expert-parallel-comm``) "requires setting a larger CUDA_DEVICE_MAX_CONNECTIONS
  for better parallelization ... you can set CUDA_DEVICE_MAX_CONNECTIONS to 1 or 32": 32, the value that lets the
  all-to-all run beside the paired compute, which is what the plan's time assumes.

All frameworks: ``NCCL_NVLS_ENABLE=1`` when the plan's collective times assume NVLink SHARP
(``cost_models.comm``: an all-reduce of more than two ranks inside an NVLink domain of a cluster with
``node.nvls``; TP, and ZeRO-0 data parallelism inside a domain). NCCL's default, 2, uses NVLS only when the
device reports multicast support; 1 makes NCCL fail at start-up instead of silently running the slower ring the
plan did not time (NVIDIA/nccl ``src/transport/nvls.cc`` ``NCCL_PARAM(NvlsEnable, "NVLS_ENABLE", 2)``).

torchtitan: ``PYTORCH_ALLOC_CONF=expandable_segments:True``, what torchtitan's launcher sets
(``run_train.sh``, v0.2.2) and under which its published memory figures were measured. Colossal-AI: the NCCL
setting only.
"""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig
from cost_models.layout import GroupPlacement, group_placement

#: CUDA's default number of hardware work queues per device (CUDA C++ Programming Guide, env vars).
CUDA_DEFAULT_MAX_CONNECTIONS = "8"


def uses_nvls(par: ParallelConfig, cluster: ClusterSpec | None) -> bool:
    """Whether the plan's times assume NVLS all-reduces: an all-reduce group of more than two ranks inside one
    NVLink domain on a cluster with NVLink SHARP (``cost_models.comm.collective_time``)."""
    if cluster is None or not cluster.node.nvls:
        return False
    dom = cluster.node.nvlink_domain_size
    groups: list[GroupPlacement] = [group_placement("tp", par, dom)]  # TP: all-reduce (or RS + AG, same bytes)
    if par.zero_stage == 0:  # data-parallel gradient all-reduce
        dp, cp = group_placement("dp", par, dom), group_placement("cp", par, dom)
        if dp.intra_domain and cp.intra_domain:
            groups.append(GroupPlacement(par.dp * par.cp, par.dp * par.cp))
    return any(g.size > 2 and g.intra_domain for g in groups)


def megatron_env(par: ParallelConfig) -> dict[str, str]:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` for a Megatron-LM launch of ``par`` (module docstring), {} when unset."""
    if par.zero_stage >= 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": CUDA_DEFAULT_MAX_CONNECTIONS}
    if par.pipeline_schedule == "combined-1f1b":
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    if par.tp > 1 or par.cp > 1:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def launch_env(framework: str, par: ParallelConfig, cluster: ClusterSpec | None = None) -> dict[str, str]:
    """Environment variables of ``framework``'s launch of ``par`` (``megatron``, ``deepspeed`` (the
    Megatron-DeepSpeed launch), ``torchtitan`` or ``colossalai``), sorted by name."""
    env: dict[str, str] = {}
    if framework in ("megatron", "deepspeed"):
        # Megatron-DeepSpeed keeps Megatron-LM's rule (its examples export CUDA_DEVICE_MAX_CONNECTIONS=1); its
        # ZeRO-2/3 is DeepSpeed's, not Megatron-FSDP, so only the TP/CP value applies there
        env.update(megatron_env(par) if framework == "megatron" else
                   ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if par.tp > 1 or par.cp > 1 else {}))
    if framework == "torchtitan":
        env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    if uses_nvls(par, cluster):
        env["NCCL_NVLS_ENABLE"] = "1"
    return dict(sorted(env.items()))
