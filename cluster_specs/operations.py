"""What running a cluster for a whole training run costs besides step time: power, checkpoint storage,
interruptions and restarts, and the rental price (``ClusterSpec.operations``).

Every section has a ``source`` naming where its numbers come from. A section left out of a cluster YAML takes the
documented default below (``DEFAULT_*``); a section that sets any value must also set its ``source`` (a default
source would be wrong for the user's own numbers).

Units: watts, bytes/s (decimal), seconds, interruptions per GPU-hour, US dollars per GPU-hour.

Defaults and their sources:

* Interruptions: Meta's Llama 3 405B run had 419 unexpected interruptions in a 54-day snapshot on 16,384 H100s
  ("The Llama 3 Herd of Models", 2024, Sec. 3.3.4, Table 5): 419 / (54 x 24 h x 16,384 GPUs) = 1.973e-5 per
  GPU-hour, i.e. a job mean time between interruptions of 1 / (rate x GPUs) (3.09 h on 16,384 GPUs).
* Restart: Meta's restarts average 6.47 min = 388.2 s (TrainMover, arXiv 2412.12636), split into rescheduling 23%,
  checkpoint load 24%, NCCL set-up 17%, warm-up 28%; the 8% those four phases leave is kept as
  ``detection_and_other`` (failure detection and the rest).
* Checkpoint storage: Meta's Tectonic file system sustained 2 TB/s for the Llama 3 pre-training cluster of 16,384
  GPUs (Llama 3 paper, Sec. 3.3.1: 240 PB on 7,500 SSD servers, 2 TB/s sustainable, 7 TB/s peak): 2e12 / 16,384 =
  1.22e8 bytes/s of write bandwidth per training GPU, a storage fabric sized with the cluster.
* PUE: 1.58, the industry-average power usage effectiveness of Uptime Institute's Global Data Center Survey 2023
  (UII Keynote Report 106, July 2023; Uptime Intelligence Update 221, Nov 2023). New large facilities report about
  1.3 and hyperscalers about 1.1: override with ``--pue``.
* Board power, node overhead and price have no default: a cluster without them reports no energy (board power) or
  GPU boards only (node overhead), and no dollars unless ``--gpu-hour-price`` is given.
"""
from __future__ import annotations

import datetime

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .input_guard import Plausible

#: 419 unexpected interruptions / (54 days x 24 h x 16,384 GPUs) (Llama 3 paper Sec. 3.3.4, Table 5)
META_INTERRUPTIONS_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
#: Meta's average restart, seconds (6.47 min; TrainMover arXiv 2412.12636)
META_RESTART_S = 6.47 * 60
#: TrainMover's shares of Meta's 6.47-min restart; ``detection_and_other`` is the 8% the four named phases leave
RESTART_SHARES = {"rescheduling": 0.23, "checkpoint_load": 0.24, "nccl_setup": 0.17, "warmup": 0.28,
                  "detection_and_other": 0.08}
#: Tectonic's sustained 2 TB/s over the 16,384 Llama 3 training GPUs, bytes/s per GPU (Llama 3 paper Sec. 3.3.1)
META_CHECKPOINT_WRITE_BYTES_PER_S_PER_GPU = 2e12 / 16384
#: Uptime Institute Global Data Center Survey 2023 industry-average PUE
DEFAULT_PUE = 1.58

_RELIABILITY_SOURCE = (
    "default: interruptions 419 unexpected in a 54-day snapshot on 16,384 H100s (Meta, 'The Llama 3 Herd of Models' "
    "2024, Sec. 3.3.4, Table 5) = 1.973e-5 per GPU-hour; restart 6.47 min average (Meta, via TrainMover arXiv "
    "2412.12636) split rescheduling 23%, checkpoint load 24%, NCCL set-up 17%, warm-up 28%, detection and other 8% "
    "(the remainder)")
_STORAGE_SOURCE = (
    "default: checkpoint write 2 TB/s sustained by Meta's Tectonic for 16,384 training GPUs (Llama 3 paper Sec. "
    "3.3.1) = 1.22e8 bytes/s per GPU; no host-link figure (asynchronous checkpoints then block for the full write)")
_POWER_SOURCE = (
    "default: PUE 1.58, industry average of the Uptime Institute Global Data Center Survey 2023 (UII Keynote Report "
    "106); no board-power or node-overhead figure (energy is not reported)")


class _Sourced(BaseModel):
    """A section whose ``source`` must be given whenever any of its values is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _source_with_values(self):
        given = self.model_fields_set - {"source"}
        if given and "source" not in self.model_fields_set:
            raise ValueError(f"source is required when {', '.join(sorted(given))} is set (name where the values "
                             f"come from)")
        if not str(getattr(self, "source", "")).strip():
            raise ValueError("source must not be empty")
        return self


class ReliabilitySpec(_Sourced):
    """Interruptions and restarts of a training job on this cluster."""

    interruptions_per_gpu_hour: Annotated[float, Plausible(
            1e-9, 2e-3, "1e-9 to 100x the 1.97e-5 per GPU-hour of Meta's Llama 3 405B run")] = Field(
        META_INTERRUPTIONS_PER_GPU_HOUR,
        description="unexpected job interruptions per GPU per hour; the job's mean time between interruptions is "
                    "1 / (rate x GPUs)")
    restart_phases_s: dict[str, Annotated[float, Plausible(0, 86400, "none to a day per phase; Meta's whole restart "
                                                                 "is 388 s")]] = Field(
        default_factory=lambda: {k: round(v * META_RESTART_S, 2) for k, v in RESTART_SHARES.items()},
        description="seconds of each restart phase (detection, rescheduling, checkpoint load, NCCL set-up, "
                    "warm-up); their sum is the restart time")
    source: str = _RELIABILITY_SOURCE

    @field_validator("restart_phases_s")
    @classmethod
    def _phases(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("restart_phases_s must list at least one phase")
        bad = [k for k, s in v.items() if not s >= 0]
        if bad:
            raise ValueError(f"restart_phases_s[{bad[0]}] must be >= 0 seconds")
        return v

    @property
    def restart_s(self) -> float:
        """Restart time, seconds: the sum of the phases."""
        return float(sum(self.restart_phases_s.values()))


class StorageSpec(_Sourced):
    """Where checkpoints go and how fast."""

    checkpoint_write_bytes_per_s_per_gpu: Annotated[float, Plausible(
            1e6, 1.22e10, "1 MB/s to 100x the 1.22e8 bytes/s per GPU of Meta's Tectonic")] = Field(
        META_CHECKPOINT_WRITE_BYTES_PER_S_PER_GPU,
        description="sustained checkpoint write bandwidth of the shared file system per training GPU, bytes/s "
                    "(a fully parallel sharded save writes at GPUs x this)")
    host_link_bytes_per_s: Annotated[float, Plausible(1e8, 6.4e12, "PCIe 1.0 x1 to 100x PCIe Gen5 x16's 64e9 "
                                                                   "bytes/s")] | None = Field(
        None,
        description="GPU-to-host copy bandwidth per GPU per direction, bytes/s (PCIe Gen5 x16: 64e9): the blocking "
                    "part of an asynchronous save copies the GPU's shard to pinned host memory at this rate")
    source: str = _STORAGE_SOURCE


class PowerSpec(_Sourced):
    """Electrical power: GPU boards, the rest of each node, and the facility's PUE."""

    gpu_board_w: Annotated[float, Plausible(10, 100 * 1200, "10 W to 100x the 1,200 W of a GB200")] | None = Field(
        None, description="GPU board power (datasheet TDP), watts")
    node_overhead_w: Annotated[float, Plausible(0, 1e6, "none to 100x a DGX's 10.2 kW")] | None = Field(
        None, description="node power besides the GPU boards (CPUs, memory, NICs, fans, switches), watts: "
                                "the node's datasheet maximum less GPUs x board power")
    pue: float = Field(DEFAULT_PUE, ge=1, le=3, description="power usage effectiveness (facility / IT power)")
    source: str = _POWER_SOURCE


class PriceSpec(BaseModel):
    """A rental price. Prices move: ``date`` says when it was read, and the output repeats it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_gpu_hour: Annotated[float, Plausible(1e-3, 1e4, "0.1 cent to 100x a $100 GPU-hour")] = Field(
        description="US dollars per GPU-hour")
    date: datetime.date = Field(description="when the price was read (ISO date)")
    source: str = Field(min_length=1, description="who quotes it (URL) and for what (on-demand, reserved)")


class OperationsSpec(BaseModel):
    """Running the cluster for a whole run: reliability, checkpoint storage, power, price (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reliability: ReliabilitySpec = Field(default_factory=ReliabilitySpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    power: PowerSpec = Field(default_factory=PowerSpec)
    price: PriceSpec | None = Field(None, description="default rental price, or None (give --gpu-hour-price)")
