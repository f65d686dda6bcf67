"""Step time and memory of one pipeline whose stages sit on pools of different GPUs (``cluster_specs.pools``).

What Megatron-LM runs on such a cluster (and what this model times): TP, CP, EP and DP are the same on every
stage, so each pipeline replica spans the same pools; stage ``r`` runs on pool ``stage_pool[r]`` (contiguous
ranges, pool after pool in rank order: Megatron's ``tp-cp-ep-dp-pp`` order puts pp outermost, so a pool's nodes
hold whole pipeline stages), and the per-stage layer counts are the ``--pipeline-model-parallel-layout`` string
(``ParallelConfig.pipeline_layout``).

* **Per-stage times**: each stage's forward and backward are ``cost_models.step_time.estimate_step``'s, computed on
  its own pool's cluster (GEMM, attention and HBM rates, NVLink and network of its TP/CP/EP groups).
* **Pipeline**: ``cost_models.pipeline.simulate`` replays the schedule with those per-stage times. P2P sends within
  a pool use the pool's network; the send across a pool boundary uses the network between pools
  (``MixedCluster.network``). The simulator takes one P2P time for every boundary, so the slowest boundary's is
  used for all (an upper bound; on the plans of ``benchmarks/bench_pools.py`` the P2P sends are < 1% of a stage).
* **Data parallel and optimizer**: a stage's gradients are reduced over its own DP group, which sits inside its
  pool, on that pool's network (``estimate_step(..., stages=...)`` per pool); the stages reduce at the same time,
  so the exposed DP time is the slowest pool's, and so is the optimizer step. Tied embeddings whose first and last
  stages sit in different pools are all-reduced over each pool's network in this model, not the inter-pool link.
* **Memory**: each stage's estimate (``cost_models.memory.estimate_memory``) on its pool's cluster (reserve), checked
  against that pool's GPU capacity.
* **MFU** is against the summed dense 16-bit peaks of the GPUs used (each stage's ``tp*cp*dp`` GPUs at its pool's
  peak), the measure FlashFlex/HexiScale (arXiv 2409.01143) compare heterogeneous and homogeneous runs by.

Across pools only 1F1B (``vpp`` 1) is modelled (the interleaved schedule alternates pools chunk by chunk); a pipeline
on one pool is the homogeneous model, any schedule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from cluster_specs.pools import MixedCluster
from model_zoo.spec import ModelSpec

from .comm import collective_time
from .config import BYTES_16BIT, FlopsConvention, ParallelConfig, TrainingJob
from .layout import GroupPlacement, LayoutError
from .memory import StageMemory, estimate_memory
from .pipeline import simulate
from .step_time import StepEstimate, estimate_step, other_compute_s


@dataclass
class PoolsEstimate:
    """One configuration on a mixed cluster: the whole step (``step``, the same fields as a homogeneous
    ``StepEstimate``; ``peak_flops_per_gpu`` is the mean over the GPUs used), each stage's memory on its pool with
    that pool's capacity (bytes), the pool of every stage, and the P2P seconds of every stage boundary."""

    step: StepEstimate
    stages: list[StageMemory]
    capacity_bytes: list[int]
    stage_pool: list[int]
    boundary_p2p_s: list[float]
    pool_steps: dict[int, StepEstimate] = field(default_factory=dict)

    def slack_bytes(self, memory_headroom: float) -> list[float]:
        """Usable bytes left on each stage: capacity x (1 - headroom) minus the stage's peak."""
        return [c * (1 - memory_headroom) - s.total for s, c in zip(self.stages, self.capacity_bytes)]

    def fits(self, memory_headroom: float) -> bool:
        return min(self.slack_bytes(memory_headroom)) >= 0

    def binding_stage(self, memory_headroom: float) -> int:
        """The stage with the least usable memory left (ties: the lowest index)."""
        sl = self.slack_bytes(memory_headroom)
        return min(range(len(sl)), key=lambda r: (sl[r], r))


def check_stage_pool(stage_pool: Sequence[int], pp: int, num_pools: int) -> None:
    """``stage_pool`` gives each of the ``pp`` stages a pool index, each pool one contiguous range.

    Raises:
        LayoutError: wrong length, an unknown pool index, or a pool split into two ranges.
    """
    if len(stage_pool) != pp:
        raise LayoutError(f"stage_pool has {len(stage_pool)} entries for pp {pp}")
    if any(not 0 <= p < num_pools for p in stage_pool):
        raise LayoutError(f"stage_pool {list(stage_pool)}: pool indices must be in 0..{num_pools - 1}")
    seen: list[int] = []
    for p in stage_pool:
        if not seen or seen[-1] != p:
            if p in seen:
                raise LayoutError(f"stage_pool {list(stage_pool)}: pool {p} holds two separate stage ranges")
            seen.append(p)


def estimate_pools(model: ModelSpec, mixed: MixedCluster, job: TrainingJob, par: ParallelConfig,
                   stage_pool: Sequence[int], convention: FlopsConvention = "megatron",
                   overlap_dp: bool | None = None) -> PoolsEstimate:
    """Step time and per-stage memory of ``par`` with stage ``r`` on pool ``stage_pool[r]`` of ``mixed`` (module
    docstring). ``par.pipeline_layout`` (or an even / first-last split) gives the layers of every stage.
    ``overlap_dp``: the data-parallel reduction overlapped (``estimate_step``'s; None = the framework default).

    Raises:
        LayoutError: an impossible split, interleaving (vpp > 1), or a bad ``stage_pool``.
    """
    pp = par.pp
    check_stage_pool(stage_pool, pp, len(mixed.pools))
    used = list(dict.fromkeys(stage_pool))
    if len(used) == 1:  # one pool: the homogeneous model, any schedule
        i = used[0]
        c = mixed.pools[i].cluster
        est = estimate_step(model, c, job, par, convention, overlap_dp=overlap_dp)
        return PoolsEstimate(est, estimate_memory(model, c, job, par).stages, [c.gpu.memory_bytes] * pp,
                             list(stage_pool), [est.p2p_s] * (pp - 1), {i: est})
    if par.vpp > 1 or par.pipeline_schedule != "1f1b":
        raise LayoutError(f"pools: only the 1F1B schedule (vpp 1) is modelled across pools (vpp {par.vpp}, "
                          f"schedule {par.pipeline_schedule})")
    ests = {i: estimate_step(model, mixed.pools[i].cluster, job, par, convention, overlap_dp=overlap_dp,
                             stages=frozenset(r for r in range(pp) if stage_pool[r] == i)) for i in used}
    fwd = [ests[stage_pool[r]].stage_forward_s[r] for r in range(pp)]
    bwd = [ests[stage_pool[r]].stage_backward_s[r] for r in range(pp)]
    tok = par.micro_batch_size * job.seq_length / par.cp
    nbytes = BYTES_16BIT * tok * model.hidden_size / (par.tp if par.sequence_parallel else 1)
    p2p_b = []
    for r in range(pp - 1):
        a, b = stage_pool[r], stage_pool[r + 1]
        p2p_b.append(ests[a].p2p_s if a == b else
                     collective_time("p2p", nbytes, GroupPlacement(2, 1), mixed.link_cluster(a)))
    p2p = max(p2p_b, default=0.0)
    m = max(1, par.num_microbatches(job.global_batch_size))
    sim = simulate(par.pipeline_schedule, pp, m, fwd, bwd, vpp=1, p2p_s=p2p)
    busy = max(sim.busy)
    rb = max(range(pp), key=lambda r: (sim.busy[r], -r))
    eb = ests[stage_pool[rb]]
    dp = max(e.exposed_comm_s["dp"] for e in ests.values())
    opt = max(e.optimizer_s for e in ests.values())
    bubble = max(0.0, sim.makespan - busy)
    exposed = {k: eb.exposed_comm_s[k] for k in ("tp", "cp", "ep")}
    exposed["pp"] = min(bubble, 2 * (pp - 1) * p2p) if pp > 1 else 0.0
    exposed["dp"] = dp
    step = sim.makespan + dp + opt
    d = par.tp * par.cp * par.dp
    peak_total = sum(d * mixed.pools[stage_pool[r]].cluster.gpu.peak_flops[ests[stage_pool[r]].mfu_peak_dtype]
                     for r in range(pp))
    n_gpus = par.world_size
    mf, hf = eb.model_flops, eb.hardware_flops
    compute = busy - exposed["tp"] - exposed["cp"] - exposed["ep"]
    kinds = dict(eb.compute_breakdown_s)
    kinds["other"] = other_compute_s(compute, (v for k, v in kinds.items() if k != "other"))
    total = StepEstimate(
        step_s=step, compute_s=compute, bubble_s=bubble, optimizer_s=opt, exposed_comm_s=exposed,
        bubble_fraction=bubble / step if step > 0 else 0.0, num_microbatches=m,
        tokens_per_s=par.processed_share(job.global_batch_size) * job.tokens_per_step / step, model_flops=mf,
        hardware_flops=hf,
        tflops_per_gpu=mf / step / n_gpus / 1e12, mfu=mf / (step * peak_total), hfu=hf / (step * peak_total),
        peak_flops_per_gpu=peak_total / n_gpus, mfu_peak_dtype=eb.mfu_peak_dtype, flops_convention=convention,
        stage_forward_s=fwd, stage_backward_s=bwd, p2p_s=p2p, pp=pp, schedule=par.pipeline_schedule,
        framework=eb.framework, compute_breakdown_s=kinds)
    mems = {i: estimate_memory(model, mixed.pools[i].cluster, job, par) for i in used}
    stages = [mems[stage_pool[r]].stages[r] for r in range(pp)]
    caps = [mixed.pools[stage_pool[r]].cluster.gpu.memory_bytes for r in range(pp)]
    return PoolsEstimate(total, stages, caps, list(stage_pool), p2p_b, ests)
