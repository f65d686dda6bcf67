"""Kubernetes launch: a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``) for a plan, with its config files in a
``ConfigMap``.

Resource: Kubeflow Training Operator v1 (github.com/kubeflow/training-operator, tag v1.9.0, commit
6f74c7f6b2ed6c27aabd82d0a316b23f0646059c), CRD ``manifests/base/crds/kubeflow.org_pytorchjobs.yaml``;
tests/data/k8s/ ships its OpenAPI v3 schema and the tests validate every manifest against it.

* One pod per node: ``Master`` (1 replica) and ``Worker`` (nodes - 1 replicas); ``nprocPerNode`` = GPUs per node
  and each pod asks for that many ``nvidia.com/gpu`` (NVIDIA device plugin resource name).
* The container is named ``pytorch``: the operator finds the training container by that name and sets
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``, which
  ``torchrun`` reads for its options (torch.distributed.argparse_util ``env`` action). The command is
  ``torchrun`` on the same entry point and arguments as the generated ``launch_torchrun.sh``.
* The environment is the one the launch scripts export (e.g. ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for
  Megatron-LM) plus ``CONFIG_DIR``, the mount point of the ``ConfigMap`` that holds the plan's config files.
* ``/dev/shm`` is a memory-backed ``emptyDir``: NCCL and data loaders need more than a container's default 64 MiB.
"""
from __future__ import annotations

import re

import yaml

#: Where the ConfigMap with the config files (ds_config.json, torchtitan.toml, ...) is mounted.
CONFIG_DIR = "/etc/plan3d"
#: Default container image: NVIDIA's NGC PyTorch container, which Megatron-LM's README recommends; replace it
#: with one holding the framework (``--image`` is not an option: edit the manifest).
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"


def job_name(model_name: str, rank: int) -> str:
    """An RFC 1123 name (lower case, digits, '-', at most 63 characters) for the job of plan ``rank``."""
    base = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-") or "model"
    return f"plan3d-{base}"[:54].rstrip("-") + f"-rank{rank}"


class _Quoted(str):
    """A string the manifest always quotes: Kubernetes' YAML 1.2 parser (go-yaml, which kubectl uses) reads an
    unquoted ``1e-05`` as a float, which YAML 1.1's PyYAML writes bare, and the container's ``command`` and ``env``
    values must be strings."""


def pytorchjob_manifest(name: str, nodes: int, gpus_per_node: int, command: list[str], env: dict[str, str],
                        config_files: dict[str, str], header: str, image: str = DEFAULT_IMAGE) -> str:
    """The YAML of a ``ConfigMap`` (``config_files``, mounted at ``CONFIG_DIR``; omitted when empty) and a
    ``PyTorchJob`` running ``command`` on ``nodes`` pods of ``gpus_per_node`` GPUs each."""
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    docs: list[dict] = []
    if config_files:
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"},
                     "data": dict(config_files)})
        mounts.append({"name": "plan3d-config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "plan3d-config", "configMap": {"name": f"{name}-config"}})
    container = {"name": "pytorch", "image": image, "imagePullPolicy": "IfNotPresent",
                 "command": [_Quoted(a) for a in command],
                 "env": [{"name": k, "value": _Quoted(v)} for k, v in {**env, "CONFIG_DIR": CONFIG_DIR}.items()],
                 "resources": {"limits": {"nvidia.com/gpu": gpus_per_node}},
                 "volumeMounts": mounts}
    template = {"spec": {"containers": [container], "volumes": volumes}}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "restartPolicy": "OnFailure", "template": template}
    docs.append({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
                 "spec": {"nprocPerNode": str(gpus_per_node), "runPolicy": {"cleanPodPolicy": "Running"},
                          "pytorchReplicaSpecs": replicas}})
    dumper = type("_NoAliases", (yaml.SafeDumper,), {"ignore_aliases": lambda self, data: True})
    dumper.add_representer(_Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style="'"))
    body = "---\n".join(yaml.dump(d, Dumper=dumper, sort_keys=False, width=120) for d in docs)
    return f"# {header}\n# kubectl apply -f pytorchjob.yaml (Kubeflow Training Operator v1)\n---\n{body}"
