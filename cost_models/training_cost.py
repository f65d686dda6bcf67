"""Whole-run cost of training on ``T`` tokens: failure-free time, goodput under interruptions and checkpoints,
energy and money. Pure functions of a step estimate (tokens/s, step seconds) and the cluster's operations figures
(``cluster_specs/operations.py``); the planner attaches the result to each plan (``planner/cost.py``).

Units: seconds, bytes, bytes/s, watts, MWh (1e6 Wh), US dollars, interruptions per GPU-hour.

The chain, one function per term:

1. ``checkpoint_bytes``: the model states a checkpoint holds, weights + optimizer states of every parameter once
   (a sharded, fully parallel save writes each distinct shard once), bytes per parameter from the memory model
   (``cost_models.memory.state_bytes``: Megatron bf16 weights 2 + fp32 master 4 + Adam moments 8 = 14).
2. ``checkpoint_write_s``: those bytes over the storage's write bandwidth (per GPU x GPUs).
3. ``async_snapshot_s``: an asynchronous save (Megatron ``--async-save``, torch DCP ``async_save``) blocks training
   only while each GPU copies its shard (bytes / GPUs) to pinned host memory over the host link; the write to
   storage then runs behind compute, and the checkpoint is durable one write time later.
4. ``job_mtbf_s``: mean time between interruptions of a job on ``n`` GPUs, 1 / (rate x n) for a per-GPU rate
   (independent exponential failures; Meta's 419 interruptions in 54 days on 16,384 GPUs give 3.09 h).
5. ``checkpoint_period_s``: Young/Daly's interval with restart time, ``T_s + sqrt(2 (T_f + T_r) T_s + T_s^2)``
   (Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006;
   arXiv 2410.18124), ``T_s`` the blocking checkpoint time, ``T_f`` the MTBF, ``T_r`` the restart time; the period
   is measured between checkpoint starts and rounded to whole steps (a save happens between steps).
6. ``goodput_fraction``: useful time over wall time for exponential failures, Daly 2006's expected wall time
   ``T_w = M e^{R/M} (e^{(tau+delta)/M} - 1) T_solve / tau`` (compute ``tau`` between checkpoints, blocking
   ``delta``, MTBF ``M``, restart ``R``); an asynchronous checkpoint adds its write time to the work lost per
   failure (the last durable checkpoint is that much older), counted with ``R``.
The failure-free time is the whole optimizer steps the tokens need: ceil(T / tokens per step) x step seconds.

7. ``energy_mwh``: (GPUs x board power + nodes x node overhead) x PUE x wall time. Board and node powers are the
   datasheet maxima, so this is an upper bound (the method of Meta's Llama 3.1 model card: "peak power capacity
   per GPU device used, adjusted for power usage efficiency").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from cluster_specs.operations import OperationsSpec
from model_zoo.spec import ModelSpec

from .config import ParallelConfig
from .memory import state_bytes, state_options_of

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


def checkpoint_bytes(model: ModelSpec, framework: str, par: ParallelConfig) -> float:
    """Bytes of one checkpoint: every parameter's weights + optimizer states once, at the memory model's bytes per
    parameter for ``framework`` and ``par``'s recipe (fp8 weights, optimizer-state dtypes). Optimizer states offloaded
    to the host are saved too, so offload does not shrink the checkpoint."""
    opts = {**state_options_of(par), "optimizer_offload_fraction": 0.0}
    b = state_bytes(framework, **opts)
    return float(model.num_parameters()) * (b.weights + b.optimizer)


def checkpoint_write_s(ckpt_bytes: float, write_bytes_per_s_per_gpu: float, num_gpus: int) -> float:
    """Seconds to write ``ckpt_bytes`` to storage when all ``num_gpus`` write their shards in parallel, each at
    ``write_bytes_per_s_per_gpu`` (the file system's sustained bandwidth shared over the training GPUs)."""
    return ckpt_bytes / (write_bytes_per_s_per_gpu * num_gpus)


def async_snapshot_s(ckpt_bytes: float, num_gpus: int, host_link_bytes_per_s: float) -> float:
    """Seconds an asynchronous save blocks training: each GPU copies its ``ckpt_bytes / num_gpus`` shard to pinned
    host memory over the host link (Megatron ``--async-save`` / torch DCP ``async_save`` stage to CPU first)."""
    return ckpt_bytes / num_gpus / host_link_bytes_per_s


def job_mtbf_s(interruptions_per_gpu_hour: float, num_gpus: int) -> float:
    """Mean seconds between interruptions of a job on ``num_gpus`` GPUs: 3600 / (rate x GPUs)."""
    return SECONDS_PER_HOUR / (interruptions_per_gpu_hour * num_gpus)


def checkpoint_period_s(blocking_s: float, mtbf_s: float, restart_s: float) -> float:
    """Young/Daly's checkpoint interval between checkpoint starts, seconds: ``T_s + sqrt(2 (T_f + T_r) T_s + T_s^2)``
    (Daly 2006; arXiv 2410.18124). Raises ``ValueError`` unless ``blocking_s`` > 0."""
    if not blocking_s > 0:
        raise ValueError(f"blocking checkpoint time must be > 0 s, got {blocking_s}")
    return blocking_s + math.sqrt(2.0 * (mtbf_s + restart_s) * blocking_s + blocking_s ** 2)


def goodput_fraction(compute_s: float, blocking_s: float, mtbf_s: float, restart_s: float,
                     lost_per_failure_s: float = 0.0) -> float:
    """Useful fraction of wall time (Daly 2006, exponential failures): ``tau / (M e^{(R+L)/M} (e^{(tau+delta)/M}
    - 1))`` for ``compute_s`` (tau) of training between checkpoints that each block ``blocking_s`` (delta), MTBF
    ``mtbf_s`` (M), restart ``restart_s`` (R) and ``lost_per_failure_s`` (L) more work lost per failure than the
    synchronous model counts (an asynchronous save's write time). In (0, 1]; 1 only without failures and
    checkpoints."""
    m = mtbf_s
    b = (compute_s + blocking_s) / m
    # in logs, so that a restart or interval many MTBFs long gives a goodput near 0, not an OverflowError:
    # log(e^b - 1) = b + log(1 - e^-b)
    log_g = math.log(compute_s / m) - (restart_s + lost_per_failure_s) / m - (b + math.log(-math.expm1(-b)))
    return math.exp(log_g)


@dataclass(frozen=True)
class TrainingCost:
    """Cost of one plan trained on ``train_tokens`` tokens (module docstring gives every formula)."""

    train_tokens: float
    steps: int
    failure_free_s: float
    effective_s: float
    gpu_hours: float
    goodput_fraction: float
    checkpoint_bytes: float
    checkpoint_write_s: float
    checkpoint_blocking_s: float
    checkpoint_interval_s: float
    checkpoint_interval_steps: int
    async_checkpoint: bool
    mtbf_s: float
    restart_s: float
    expected_interruptions: float
    it_power_w: float | None
    pue: float
    energy_mwh: float | None
    energy_scope: str
    usd_per_gpu_hour: float | None
    usd: float | None


#: ``energy_scope`` of a cluster whose file has a board power but no node overhead: its energy leaves out CPUs, NICs,
#: fans and the rest of the node, so it is not comparable with a cluster that has both (``ENERGY_SCOPE_NODE``).
ENERGY_SCOPE_BOARDS_ONLY = "GPU boards at datasheet power only (no node-overhead figure), x PUE"
ENERGY_SCOPE_NODE = "GPU boards + node overhead at datasheet maximum power, x PUE (an upper bound)"


def energy_scope(ops: OperationsSpec) -> str:
    """What the energy figure counts, in words (or why there is none)."""
    p = ops.power
    if p.gpu_board_w is None:
        return "unknown: no GPU board power in the cluster spec"
    if p.node_overhead_w is None:
        return ENERGY_SCOPE_BOARDS_ONLY
    return ENERGY_SCOPE_NODE


def it_power_w(ops: OperationsSpec, num_gpus: int, gpus_per_node: int) -> float | None:
    """IT power of the job, watts: GPUs x board power + nodes x node overhead (None without a board power)."""
    p = ops.power
    if p.gpu_board_w is None:
        return None
    return num_gpus * p.gpu_board_w + (num_gpus // gpus_per_node) * (p.node_overhead_w or 0.0)


def training_cost(*, train_tokens: float, tokens_per_s: float, step_s: float, tokens_per_step: int, num_gpus: int,
                  gpus_per_node: int, ckpt_bytes: float, ops: OperationsSpec, async_checkpoint: bool = False,
                  interruptions_per_gpu_hour: float | None = None, restart_s: float | None = None,
                  pue: float | None = None, usd_per_gpu_hour: float | None = None) -> TrainingCost:
    """The whole-run cost of training ``train_tokens`` tokens at ``tokens_per_s`` (steps of ``step_s`` seconds and
    ``tokens_per_step`` tokens) on ``num_gpus`` GPUs. ``interruptions_per_gpu_hour``, ``restart_s`` and ``pue``
    override the cluster's ``ops`` figures; ``usd_per_gpu_hour`` None gives no dollar figure. Without a host-link
    bandwidth an asynchronous save blocks for the whole write (nothing to stage through)."""
    rate = ops.reliability.interruptions_per_gpu_hour if interruptions_per_gpu_hour is None else interruptions_per_gpu_hour
    r = ops.reliability.restart_s if restart_s is None else restart_s
    pue_v = ops.power.pue if pue is None else pue
    mtbf = job_mtbf_s(rate, num_gpus)
    write = checkpoint_write_s(ckpt_bytes, ops.storage.checkpoint_write_bytes_per_s_per_gpu, num_gpus)
    host = ops.storage.host_link_bytes_per_s
    staged = async_checkpoint and host is not None
    blocking = async_snapshot_s(ckpt_bytes, num_gpus, host) if staged else write
    lag = write if staged else 0.0
    period = checkpoint_period_s(blocking, mtbf, r)
    if staged:
        period = max(period, write)  # one save in flight at a time: the next snapshot waits for the write
    interval_steps = max(1, round((period - blocking) / step_s))
    compute = interval_steps * step_s
    g = goodput_fraction(compute, blocking, mtbf, r, lag)
    steps = math.ceil(train_tokens / tokens_per_step)
    failure_free = steps * step_s  # whole optimizer steps (train_tokens / tokens_per_s short of the last one)
    effective = failure_free / g if g > 0 else math.inf  # no progress (the caller refuses a goodput that low)
    gpu_hours = effective * num_gpus / SECONDS_PER_HOUR
    power = it_power_w(ops, num_gpus, gpus_per_node)
    energy = None if power is None else power * pue_v * effective / SECONDS_PER_HOUR / 1e6
    return TrainingCost(
        train_tokens=float(train_tokens), steps=steps,
        failure_free_s=failure_free, effective_s=effective, gpu_hours=gpu_hours, goodput_fraction=g,
        checkpoint_bytes=ckpt_bytes, checkpoint_write_s=write, checkpoint_blocking_s=blocking,
        checkpoint_interval_s=compute + blocking, checkpoint_interval_steps=interval_steps,
        async_checkpoint=bool(async_checkpoint), mtbf_s=mtbf, restart_s=r,
        expected_interruptions=effective / mtbf, it_power_w=power, pue=pue_v, energy_mwh=energy,
        energy_scope=energy_scope(ops), usd_per_gpu_hour=usd_per_gpu_hour,
        usd=None if usd_per_gpu_hour is None else gpu_hours * usd_per_gpu_hour)
