"""Megatron-LM's combined 1F1B (MoE all-to-all overlap) op order.

With ``--overlap-moe-expert-parallel-comm`` Megatron-LM runs the steady state of its schedule as merged
forward-backward steps: the forward of one micro-batch and the backward of another run layer by layer on two
streams, so that each one's expert-parallel dispatch / combine all-to-all hides behind the other's attention and
MLP compute ("EP A2A in forward step is hidden by the attention/mlp computation in the backward step, and vice
versa"; ``megatron/core/pipeline_parallel/combined_1f1b.py``; ``--delay-wgrad-compute`` moves the expert weight
gradients behind the backward dispatch). Sources, NVIDIA/Megatron-LM commit d98e8a64dd:

* ``pp == 1``: ``combined_1f1b_schedule_for_no_pipelining``: F(0), then F(i+1) with B(i), then B(m-1).
* ``pp > 1`` needs interleaving (``TransformerConfig``: "virtual_pipeline_model_parallel_size must be specified
  when pipeline_model_parallel_size > 1"): ``forward_backward_pipelining_with_interleaving`` with
  ``get_pp_rank_microbatches``' warm-up ``(p-r-1)*2 + (v-1)*p`` plus one ("we schedule one extra micro-batch
  forward step before the 1f1b stages ... to ensure the forward and backward computations are independent"), the
  steady state as merged pairs (``forward_backward_helper_wrapper`` -> ``combined_1f1b_schedule_for_interleaved_
  pipelining``), the cool-down backwards alone. Micro-batches go through the chunks in groups of ``p``
  (``get_schedule_table``), backwards visit the chunks in reverse.

The bubble is the interleaved schedule's (the pairing changes what is exposed, not the order's shape); the extra
warm-up forward keeps one more chunk's activations alive, and the merged step holds the new forward's activations
before the old backward frees its own (``pipeline_ops.peak_in_flight``).
"""
from __future__ import annotations

from functools import lru_cache

from .pipeline_ops import OpT, Placement, chain_placement


def interleaved_placement(p: int, v: int) -> Placement:
    """Megatron's interleaving: virtual stage ``c*p + r`` is chunk ``c`` of rank ``r``."""
    return chain_placement([[k % p for k in range(p * v)]])


def schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch, Megatron ``get_schedule_table`` (groups of ``group``
    micro-batches through every chunk; the last group takes the rest)."""
    out = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        out += [(mb, c) for c in range(v) for mb in range(lo, hi)]
    return out


@lru_cache(maxsize=64)
def combined_1f1b_orders(p: int, m: int, v: int) -> tuple[tuple[OpT, ...], ...]:
    """Per-rank op orders of the combined 1F1B schedule on ``p`` ranks, ``v`` chunks per rank, ``m``
    micro-batches (stages numbered as ``interleaved_placement``).

    Raises:
        ValueError: a count below 1.
    """
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"combined 1F1B needs pp, micro-batches and vpp >= 1, got {p}, {m}, {v}")
    table = schedule_table(m, v, p)
    total = m * v
    out = []
    for r in range(p):
        fwd = [("F", c * p + r, mb) for mb, c in table]
        bwd = [("B", (v - 1 - c) * p + r, mb) for mb, c in table]
        warm = min(total, (p - r - 1) * 2 + (v - 1) * p + 1)
        ops: list[OpT] = list(fwd[:warm])
        for k in range(total - warm):
            f, b = fwd[warm + k], bwd[k]
            ops.append(("FB", f[1], f[2], b[1], b[2]))
        ops += bwd[total - warm:]
        out.append(tuple(ops))
    return tuple(out)
