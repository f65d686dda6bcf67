"""The search space: candidate values of each knob and the divisibility rules used to prune it.

The pruning here is the search's own; emitted plans are re-checked by ``planner.checks`` independently.
Heuristic bounds (documented, and what a practitioner would try): tp within one NVLink domain and a divisor
of the attention heads; micro-batch sizes 1, 2, 4, 8; cp only while each rank keeps >= 2048 tokens of the
sequence; vpp up to 8 chunks per rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import uneven_split
from model_zoo.spec import ModelSpec

MICRO_BATCH_SIZES = (1, 2, 4, 8)
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
MAX_VPP = 8
#: Smallest per-rank sequence chunk considered for context parallelism (tokens).
MIN_TOKENS_PER_CP_RANK = 2048


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


@dataclass(frozen=True)
class SearchSpace:
    """Which knobs the search may vary (a user can pin any of them from the CLI)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    micro_batch_size: tuple[int, ...] = MICRO_BATCH_SIZES
    zero_stage: tuple[int, ...] = ZERO_STAGES
    recompute: tuple[str, ...] = RECOMPUTE
    sequence_parallel: tuple[bool, ...] = (True, False)
    vpp: tuple[int, ...] | None = None


def layer_split(model: ModelSpec, pp: int) -> tuple[int | None, int | None] | None:
    """Even split if possible, else Megatron first/last stage counts, else None (pp impossible)."""
    if model.num_layers % pp == 0:
        return (None, None)
    if pp > model.num_layers:
        return None
    return uneven_split(model.num_layers, pp)


def candidates(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
               space: SearchSpace = SearchSpace()) -> Iterator[ParallelConfig]:
    """Every configuration of ``space`` that passes the cheap divisibility rules (no memory, no time)."""
    a, g = model.num_attention_heads, model.num_kv_heads
    dom = cluster.node.nvlink_domain_size
    gbs, s = job.global_batch_size, job.seq_length
    for tp in divisors(num_gpus):
        if space.tp is not None and tp not in space.tp:
            continue
        if tp > dom or a % tp or (model.mla is None and g % tp and tp % g):
            continue
        for pp in divisors(num_gpus // tp):
            if space.pp is not None and pp not in space.pp:
                continue
            split = layer_split(model, pp)
            if split is None:
                continue
            for cp in divisors(num_gpus // (tp * pp)):
                if space.cp is not None and cp not in space.cp:
                    continue
                if cp > 1 and (s % (2 * cp) or s // cp < MIN_TOKENS_PER_CP_RANK):
                    continue
                dp = num_gpus // (tp * pp * cp)
                eps = [1]
                if model.moe is not None:
                    eps = [e for e in divisors(model.moe.num_experts) if (dp * cp * tp) % e == 0]
                for ep in eps:
                    if space.ep is not None and ep not in space.ep:
                        continue
                    etp = 1 if ep > 1 else None
                    for mbs in space.micro_batch_size:
                        if gbs % (mbs * dp):
                            continue
                        m = gbs // (mbs * dp)
                        per_stage = [model.num_layers // pp] if split == (None, None) else [split[0], (model.num_layers - 2 * split[0]) // (pp - 2)]
                        vpps = [1]
                        if pp > 1 and m % pp == 0:
                            vpps += [v for v in range(2, MAX_VPP + 1) if all(c % v == 0 for c in per_stage)]
                        if space.vpp is not None:
                            vpps = [v for v in vpps if v in space.vpp]
                        for vpp in vpps:
                            for zero in space.zero_stage:
                                if zero >= 1 and dp * cp == 1:
                                    continue  # nothing to shard over
                                for rc in space.recompute:
                                    for sp in space.sequence_parallel:
                                        if sp and (tp == 1 or (s // cp) % tp):
                                            continue
                                        yield ParallelConfig(
                                            tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp,
                                            micro_batch_size=mbs, zero_stage=zero, sequence_parallel=sp,
                                            recompute=rc, first_stage_layers=split[0], last_stage_layers=split[1])
