"""Cluster hardware specification (``ClusterSpec``).

Field names are the contract used by ``cost_models`` and ``planner``.

Units (everywhere in this package):

* memory: bytes. ``GPUSpec.memory_bytes`` is the capacity ``nvidia-smi --query-gpu=memory.total``
  (or ``rocm-smi --showmeminfo vram``) reports, i.e. visible MiB x 2**20, not the marketing label
  (hardware.yaml conventions; /work/shared/data/formulas.md section 8).
* compute: FLOP/s, **dense** (without 2:4 structured sparsity). NVIDIA's headline tensor numbers
  are sparse ("Specifications 1/2 lower without sparsity", H100 datasheet footnote).
* bandwidth: bytes/s **per direction** (unidirectional). NVIDIA's "900 GB/s NVLink" is the
  bidirectional sum, i.e. 450e9 per direction. NIC bandwidth is per GPU per direction
  (400 Gb/s = 50e9 bytes/s).
* latency: seconds.
* efficiencies: dimensionless fractions in (0, 1].

Every built-in value carries its source next to it (``source`` strings and ``Calibration.sources``). Every
quantity also has a plausible range (``Plausible``, next to the field, with its reason): from a single consumer GPU
to 100x the largest part of ``/work/shared/data/hardware.yaml``; a value outside is an input error, never a plan.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import ClusterSpecError
from .input_guard import Plausible
from .operations import OperationsSpec

#: Training precisions the planner may choose, in display order. Other keys of
#: ``GPUSpec.peak_flops`` (tf32, fp32, fp6, fp4) are kept as data but are not offered as a
#: training precision; fp32 training (``FP32_TRAINING``) is offered on GPUs with a TF32 peak.
TRAINING_PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
#: Single-precision training: fp32 tensors, GEMMs on TF32 tensor cores (``cost_models.config.TrainingJob``), so it
#: needs the GPU's ``tf32`` peak; its GEMM efficiency is the 16-bit one (same tensor cores, no TF32 MAMF figure).
FP32_TRAINING = "fp32"

#: dtype spellings accepted by :meth:`ClusterSpec.peak_flops` and friends.
DTYPE_ALIASES: dict[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "e4m3": "fp8",
    "tensorfloat32": "tf32",
    "float32": "fp32",
}


def normalize_dtype(dtype: str) -> str:
    """Lower-case a dtype name and map common aliases (``bfloat16`` -> ``bf16``)."""
    d = str(dtype).strip().lower()
    return DTYPE_ALIASES.get(d, d)


class GPUSpec(BaseModel):
    """One accelerator: capacity, dense peak throughput, HBM bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="short GPU name, e.g. 'H100', 'A100', 'MI300X'")
    vendor: Literal["nvidia", "amd"] = Field(
        "nvidia", description="whose software stack runs the GPU: its collective library (NCCL / RCCL) and kernels; "
                              "one torch.distributed job runs one of them")
    memory_bytes: Annotated[int, Plausible(2**30, 100 * 256 * 2**30, "1 GiB, below any consumer GPU that can hold a "
                                           "training step, to 100x the 256 GiB of AMD MI325X, the largest part")] = Field(
        description="device memory as nvidia-smi/rocm-smi reports it (bytes) = visible MiB * 2**20",
    )
    peak_flops: dict[str, Annotated[float, Plausible(1e11, 1e18, "0.1 TFLOP/s, a tenth of a GT 1030's FP32, to 100x "
                                                      "GB200's dense FP4 10 PFLOP/s")]] = Field(
        description="dense peak FLOP/s by dtype (bf16, fp16, fp8, tf32, fp32, ...); a dtype the GPU "
        "cannot run is absent (A100 has no fp8)",
    )
    hbm_bandwidth_bytes_per_s: Annotated[float, Plausible(1e10, 8e14, "10 GB/s, below a consumer GDDR card, to 100x "
                                                           "the 8 TB/s of B200/GB200")] = Field(
        description="peak HBM bandwidth, bytes/s (decimal)")
    power_limit_w: Annotated[float, Plausible(10, 100 * 1200, "10 W to 100x the 1,200 W of a GB200")] | None = Field(
        None,
        description="board power limit the GPUs run at, watts, when it is below the datasheet TDP (e.g. 500 on "
        "Meta's Grand Teton H100s); None = the datasheet TDP. Needs tdp_w. Its effect on the tensor-core clock is "
        "calibration.power_limit_clock_fraction when measured, else the step-time model's power-clock law "
        "(cost_models.gemm.clock_fraction)",
    )
    tdp_w: Annotated[float, Plausible(10, 100 * 1200, "10 W to 100x the 1,200 W of a GB200")] | None = Field(
        None,
        gt=0,
        description="datasheet board power (TDP), watts, at which the GEMM / attention efficiencies were measured; "
        "required with power_limit_w",
    )
    source: str = Field(min_length=1, description="where each value came from")

    @model_validator(mode="after")
    def _check_peaks(self) -> "GPUSpec":
        if self.power_limit_w is not None and (self.tdp_w is None or self.power_limit_w > self.tdp_w):
            raise ValueError(f"gpu.power_limit_w {self.power_limit_w:g} needs gpu.tdp_w (the datasheet TDP) at or "
                             "above it")
        if not self.peak_flops:
            raise ValueError("peak_flops must list at least one dtype")
        for dtype in self.peak_flops:
            if dtype != normalize_dtype(dtype):
                raise ValueError(f"peak_flops key '{dtype}' must be spelled '{normalize_dtype(dtype)}'")
        return self


class NodeSpec(BaseModel):
    """What the planner calls a *node*: the unit counted by ``--nodes`` and by ``gpus_per_node``.

    On DGX/HGX systems a node is the 8-GPU server and the NVLink domain is the same 8 GPUs. On
    GB200 NVL72 a node is one 4-GPU compute tray while the NVLink domain spans the 72 GPUs of the
    rack (18 trays); the communication model must use ``nvlink_domain_size`` (not
    ``gpus_per_node``) to decide whether a group stays on NVLink.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus_per_node: Annotated[int, Plausible(1, 7200, "one GPU to 100x the 72 GPUs of a GB200 NVL72 rack")] = Field(
        description="GPUs per node (the unit of --nodes)")
    nvlink_bandwidth_bytes_per_s: Annotated[float, Plausible(1e9, 9e13, "1 GB/s, PCIe 3.0 x1 between consumer GPUs, "
                                                              "to 100x NVLink 5's 900 GB/s per direction")] = Field(
        description="NVLink/xGMI bandwidth per GPU per direction, bytes/s (H100: 450e9)"
    )
    nvlink_domain_size: Annotated[int, Plausible(1, 7200, "one GPU to 100x the 72-GPU NVLink domain of GB200 "
                                                  "NVL72")] = Field(
        description="GPUs in one NVLink domain (8 on DGX, 72 on GB200 NVL72); a multiple of gpus_per_node"
    )
    nvls: bool = Field(False, description="NVLink SHARP (in-switch all-reduce, NCCL NVLS) available")
    host_memory_bandwidth_bytes_per_s: Annotated[float, Plausible(
        1e9, 1e14, "1 GB/s, below one DDR3 channel of a desktop board, to 100x the 1.02 TB/s of a GB200 NVL72 tray's "
                   "two Grace CPUs")] | None = Field(
        None, description="peak DRAM bandwidth of the node's CPUs, all sockets together, bytes/s (DGX H100: 2 "
                                "sockets x 8 channels x DDR5-4800 x 8 bytes = 614.4e9); shared by the node's GPUs' "
                                "host-side work (CPU Adam under optimizer offload). None = not known")
    source: str = Field(min_length=1, description="where each value came from")

    @model_validator(mode="after")
    def _check_domain(self) -> "NodeSpec":
        if self.nvlink_domain_size % self.gpus_per_node != 0:
            raise ValueError(
                f"nvlink_domain_size {self.nvlink_domain_size} must be a multiple of gpus_per_node {self.gpus_per_node}"
            )
        return self


class NetworkSpec(BaseModel):
    """Scale-out network (between nodes / NVLink domains) and per-hop latencies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nic_bandwidth_bytes_per_s: Annotated[float, Plausible(1.25e8, 5e12, "1 Gb/s Ethernet to 100x a 400 Gb/s NIC per "
                                                           "GPU")] = Field(
        description="scale-out NIC bandwidth per GPU per direction, bytes/s (400 Gb/s NIC per GPU: 50e9)"
    )
    latency_s: Annotated[float, Plausible(1e-7, 1e-2, "100 ns, below an InfiniBand switch hop of 0.5 us, to 100x a "
                                           "100 us TCP hop")] = Field(
        description="per-hop latency (alpha) of the scale-out network, seconds")
    nvlink_latency_s: Annotated[float, Plausible(1e-8, 1e-3, "10 ns to 100x a PCIe peer copy without P2P, ~11 us")] = \
        Field(description="per-hop latency (alpha) inside the NVLink domain, seconds")
    source: str = Field(min_length=1, description="where each value came from")


#: Achieved fraction of a peak: 1% (below that the calibration is broken: measured MAMF GEMM efficiencies are
#: 0.51-0.87, NCCL bus efficiencies 0.8-0.94, hardware.yaml) to the peak itself.
_EFFICIENCY = Plausible(0.01, 1.0, "an achieved fraction of peak: 1% to all of it; measured ones are 0.3-0.94")

#: Largest cluster plan3d plans for: 100x the 16,384 H100s of Llama 3.1 405B's pre-training (Llama 3 paper Sec. 3.3,
#: the largest run in planner/data/published_runs_dev.yaml). ``--gpus`` / ``--nodes`` beyond it are input errors.
MAX_GPUS = 100 * 16384


class Calibration(BaseModel):
    """Achieved fractions of peak and framework reserves, each with the measurement it came from.

    ``sources`` must have an entry for every other field (validated), including the optional
    ones when they are set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_efficiency: dict[str, Annotated[float, _EFFICIENCY]] = Field(
        description="achieved fraction of dense peak in large GEMMs, by dtype (e.g. H100 bf16 794.5/989.4 = 0.803)"
    )
    nvlink_bus_efficiency: Annotated[float, _EFFICIENCY] = Field(
        description="NCCL busbw / NVLink per-direction line rate (ring algorithms, no NVLS)"
    )
    network_bus_efficiency: Annotated[float, _EFFICIENCY] = Field(
        description="NCCL busbw / NIC per-direction line rate across nodes"
    )
    memory_reserve_bytes: Annotated[int, Plausible(0, 100 * 256 * 2**30, "none to all of the largest plausible GPU "
                                                    "memory (GPUSpec.memory_bytes)")] = Field(
        description="bytes per GPU not available to the model: CUDA context/driver + allocator fragmentation",
    )
    attention_efficiency: dict[str, Annotated[float, _EFFICIENCY]] | None = Field(
        None,
        description="achieved fraction of dense peak in fused (flash) attention, by dtype; "
        "None = not calibrated, cost models fall back to gemm_efficiency",
    )
    hbm_efficiency: Annotated[float, _EFFICIENCY] | None = Field(
        None,
        description="achieved fraction of peak HBM bandwidth in memory-bound kernels; None = not calibrated (use 1.0)",
    )
    power_limit_clock_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="MEASURED sustained tensor-core clock at gpu.power_limit_w over the clock at the TDP the GEMM "
        "and attention efficiencies were measured at (dense GEMMs are power-bound); scales both rates. None = "
        "1 without a power cap, else the step-time model's power-clock law (cost_models.gemm.clock_fraction)",
    )
    sources: dict[str, str] = Field(description="field name -> measurement/source it came from")

    @model_validator(mode="after")
    def _check(self) -> "Calibration":
        for dtype in self.gemm_efficiency:
            if dtype != normalize_dtype(dtype):
                raise ValueError(f"gemm_efficiency key '{dtype}' must be spelled '{normalize_dtype(dtype)}'")
        required = [
            name
            for name in type(self).model_fields
            if name != "sources" and (getattr(self, name) is not None or name in self.sources)
        ]
        missing = [name for name in required if not str(self.sources.get(name, "")).strip()]
        if missing:
            raise ValueError(f"sources has no entry for: {', '.join(missing)}")
        unknown = sorted(set(self.sources) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"sources names unknown field(s): {', '.join(unknown)}")
        return self


class ClusterSpec(BaseModel):
    """A homogeneous GPU cluster: GPU, node/NVLink domain, scale-out network, calibration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = Field(min_length=1, description="one line: vendor system, GPU, NVLink, NICs")
    gpu: GPUSpec
    node: NodeSpec
    network: NetworkSpec
    calibration: Calibration
    default_num_nodes: Annotated[int, Plausible(1, MAX_GPUS, "one node up to MAX_GPUS")] = Field(
        1, description="nodes used when neither --gpus nor --nodes is given")
    operations: OperationsSpec = Field(
        default_factory=OperationsSpec,
        description="power, checkpoint storage, interruptions and price for whole-run cost (cluster_specs/operations.py; "
        "sections left out take its documented defaults)")

    @model_validator(mode="after")
    def _check_consistency(self) -> "ClusterSpec":
        peaks = self.gpu.peak_flops
        extra = sorted(set(self.calibration.gemm_efficiency) - set(peaks))
        if extra:
            raise ValueError(
                f"calibration.gemm_efficiency has dtype(s) {', '.join(extra)} that gpu.peak_flops lacks"
            )
        missing = [d for d in self.supported_precisions
                   if d != FP32_TRAINING and d not in self.calibration.gemm_efficiency]
        if missing:
            raise ValueError(f"calibration.gemm_efficiency has no entry for precision(s): {', '.join(missing)}")
        if not [d for d in self.supported_precisions if d != FP32_TRAINING]:
            raise ValueError(
                f"gpu.peak_flops has none of the training precisions {', '.join(TRAINING_PRECISIONS)}"
            )
        capped = self.calibration.power_limit_clock_fraction
        if capped is not None and capped < 1 and self.gpu.power_limit_w is None:
            raise ValueError(
                "calibration.power_limit_clock_fraction is below 1 but gpu.power_limit_w is not set; "
                "name the power limit it belongs to"
            )
        if self.calibration.memory_reserve_bytes >= self.gpu.memory_bytes:
            raise ValueError(
                f"calibration.memory_reserve_bytes {self.calibration.memory_reserve_bytes} is not below "
                f"gpu.memory_bytes {self.gpu.memory_bytes}"
            )
        return self

    # ----------------------------------------------------------------- derived quantities
    @property
    def supported_precisions(self) -> list[str]:
        """Training precisions (subset of bf16, fp16, fp8, in that order, then fp32 when the GPU has a TF32 peak)
        this GPU has a dense peak for."""
        out = [d for d in TRAINING_PRECISIONS if d in self.gpu.peak_flops]
        return out + [FP32_TRAINING] if "tf32" in self.gpu.peak_flops else out

    @property
    def usable_memory_bytes(self) -> int:
        """Device memory the model may use: ``gpu.memory_bytes - calibration.memory_reserve_bytes``."""
        return self.gpu.memory_bytes - self.calibration.memory_reserve_bytes

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def nvlink_domain_size(self) -> int:
        return self.node.nvlink_domain_size

    @property
    def host_link_bytes_per_s(self) -> float | None:
        """GPU-to-host bandwidth per GPU per direction, bytes/s (``operations.storage.host_link_bytes_per_s``: PCIe
        Gen5 x16 64e9 on DGX H100, NVLink-C2C on GB200); None when the cluster file does not give it."""
        return self.operations.storage.host_link_bytes_per_s

    @property
    def host_memory_bandwidth_per_gpu(self) -> float | None:
        """The node's host DRAM bandwidth shared by its GPUs, bytes/s per GPU (``node.host_memory_bandwidth_bytes_per_s``
        / ``gpus_per_node``); None when not given."""
        bw = self.node.host_memory_bandwidth_bytes_per_s
        return None if bw is None else bw / self.node.gpus_per_node

    def _no_dtype(self, what: str, dtype: str) -> ClusterSpecError:
        return ClusterSpecError(
            f"cluster '{self.name}': GPU {self.gpu.name} has no {what} {dtype}; "
            f"allowed precisions: {', '.join(self.supported_precisions)}"
        )

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s of one GPU for ``dtype`` (bf16, fp16, fp8, tf32, fp32, ...).

        Raises :class:`ClusterSpecError` if the GPU has no such dtype, e.g. fp8 on A100.
        """
        d = normalize_dtype(dtype)
        try:
            return self.gpu.peak_flops[d]
        except KeyError:
            raise ClusterSpecError(
                f"cluster '{self.name}': GPU {self.gpu.name} has no dense {d} peak; "
                f"allowed precisions: {', '.join(self.supported_precisions)}"
            ) from None

    def gemm_efficiency(self, dtype: str) -> float:
        """Calibrated large-GEMM fraction of dense peak for ``dtype``."""
        d = normalize_dtype(dtype)
        self.peak_flops(d)  # same error as peak_flops for an unknown dtype
        try:
            return self.calibration.gemm_efficiency[d]
        except KeyError:
            raise self._no_dtype("calibrated GEMM efficiency for", d) from None

    def attention_efficiency(self, dtype: str) -> float:
        """Fused-attention fraction of dense peak; falls back to the GEMM efficiency when uncalibrated."""
        d = normalize_dtype(dtype)
        table = self.calibration.attention_efficiency or {}
        if d in table:
            self.peak_flops(d)
            return table[d]
        return self.gemm_efficiency(d)

    @property
    def power_limit_ratio(self) -> float:
        """Board power limit over the datasheet TDP (``gpu.power_limit_w / gpu.tdp_w``); 1.0 without a cap."""
        if self.gpu.power_limit_w is None or self.gpu.tdp_w is None:
            return 1.0
        return self.gpu.power_limit_w / self.gpu.tdp_w

    def effective_flops(self, dtype: str) -> float:
        """Achievable GEMM FLOP/s per GPU at the TDP clock: ``peak_flops(dtype) * gemm_efficiency(dtype)`` (the
        step-time model scales it by the sustained clock under a lower power limit, ``cost_models.gemm``)."""
        return self.peak_flops(dtype) * self.gemm_efficiency(dtype)

    @property
    def effective_hbm_bandwidth_bytes_per_s(self) -> float:
        return self.gpu.hbm_bandwidth_bytes_per_s * (self.calibration.hbm_efficiency or 1.0)

    @property
    def effective_nvlink_bandwidth_bytes_per_s(self) -> float:
        """NVLink per-GPU per-direction bandwidth times the NCCL bus efficiency (compare with busbw)."""
        return self.node.nvlink_bandwidth_bytes_per_s * self.calibration.nvlink_bus_efficiency

    @property
    def effective_nic_bandwidth_bytes_per_s(self) -> float:
        """NIC per-GPU per-direction bandwidth times the NCCL bus efficiency (compare with busbw)."""
        return self.network.nic_bandwidth_bytes_per_s * self.calibration.network_bus_efficiency

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-safe dict; ``load_cluster`` of its YAML dump gives an equal spec."""
        return self.model_dump(mode="json")
