"""Cluster hardware specification (``ClusterSpec``).

INTERFACE SKELETON — field names are the contract used by ``cost_models`` and ``planner``.
All bandwidths are bytes/s per direction; memory in bytes; FLOP/s dense (no 2:4 sparsity).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GPUSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    memory_bytes: int = Field(gt=0, description="usable device memory as nvidia-smi reports it (bytes)")
    peak_flops: dict[str, float] = Field(description="dense peak FLOP/s by dtype: bf16, fp16, fp8, tf32, fp32")
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    source: str


class NodeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus_per_node: int = Field(gt=0)
    nvlink_bandwidth_bytes_per_s: float = Field(gt=0, description="NVLink/xGMI per GPU per direction")
    nvlink_domain_size: int = Field(gt=0, description="GPUs in one NVLink domain (8 on DGX, 72 on NVL72)")
    nvls: bool = Field(False, description="NVLink SHARP (in-switch all-reduce) available")
    source: str


class NetworkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nic_bandwidth_bytes_per_s: float = Field(gt=0, description="scale-out NIC bandwidth per GPU per direction")
    latency_s: float = Field(gt=0, description="per-hop latency (alpha) of the scale-out network")
    nvlink_latency_s: float = Field(gt=0, description="per-hop latency (alpha) inside the NVLink domain")
    source: str


class Calibration(BaseModel):
    """Achieved fractions of peak and framework reserves, each with the measurement it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_efficiency: dict[str, float] = Field(description="achieved fraction of dense peak in large GEMMs, by dtype")
    nvlink_bus_efficiency: float = Field(gt=0, le=1, description="NCCL busbw / NVLink per-direction rate")
    network_bus_efficiency: float = Field(gt=0, le=1, description="NCCL busbw / NIC rate across nodes")
    memory_reserve_bytes: int = Field(ge=0, description="CUDA context + allocator fragmentation reserve")
    sources: dict[str, str] = Field(description="field name -> measurement/source it came from")


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    gpu: GPUSpec
    node: NodeSpec
    network: NetworkSpec
    calibration: Calibration
    default_num_nodes: int = Field(1, gt=0)
