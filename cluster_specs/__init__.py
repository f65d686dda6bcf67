"""Cluster hardware specs for plan3d: GPU, node/NVLink domain, network, calibration.

Built-ins (``list_clusters()``): dgx-a100-40g, dgx-a100-80g, dgx-h100, dgx-h200, dgx-h800, dgx-b200,
gb200-nvl72, mi300x, a800-roce (slow RoCE network), grand-teton-h100 (500 W H100s), jean-zay-a100 (Omni-Path).
Data and per-value sources live in ``cluster_specs/data/*.yaml``, copied from
/work/shared/data/hardware.yaml (vendor datasheets, nvidia-smi reports, stas00/ml-engineering MAMF
GEMM measurements, NVIDIA nccl-tests maintainer figures).
"""
from .errors import ClusterSpecError
from .loaders import (
    DEFAULT_CLUSTER,
    dump_cluster,
    get_cluster,
    list_clusters,
    load_cluster,
    load_cluster_file,
    nodes_holding,
    resolve_num_gpus,
)
from .spec import (
    TRAINING_PRECISIONS,
    Calibration,
    ClusterSpec,
    GPUSpec,
    NetworkSpec,
    NodeSpec,
    normalize_dtype,
)

__all__ = [
    "DEFAULT_CLUSTER",
    "TRAINING_PRECISIONS",
    "Calibration",
    "ClusterSpec",
    "ClusterSpecError",
    "GPUSpec",
    "NetworkSpec",
    "NodeSpec",
    "dump_cluster",
    "get_cluster",
    "list_clusters",
    "load_cluster",
    "load_cluster_file",
    "normalize_dtype",
    "nodes_holding",
    "resolve_num_gpus",
]
