"""DualPipe and DualPipeV op orders (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1, Fig. 5, Table 2).

Transcribed step by step from the reference implementation, deepseek-ai/DualPipe commit 3da1bbe
(``dualpipe/dualpipe.py`` and ``dualpipe/dualpipev.py`` ``step``); torch's ``ScheduleDualPipeV``
(``torch/distributed/pipelining/schedules.py``, torch 2.13) builds the same DualPipeV order. ``_backward_chunk(..,
enable_zb=True)`` is an input-gradient op ``I`` whose weight gradient waits in a FIFO for a later ``_weight_chunk``
(``W``); ``_forward_backward_chunk`` is an overlapped ``FB`` pair.

* **DualPipe** (``p`` ranks, ``p`` even; ``m`` micro-batches, even, ``m >= 2p``): two pipelines run in opposite
  directions, each over all ``p`` ranks with ``m/2`` micro-batches; rank ``r`` holds model stage ``r`` of the
  forward-direction pipeline and model stage ``p-1-r`` of the reverse one (two copies of the parameters: "2x").
  Stage numbering here: forward pipeline stages ``0..p-1`` (rank k), reverse pipeline stages ``p..2p-1`` (stage
  ``p+k`` is model stage k on rank ``p-1-k``).
* **DualPipeV** (``p`` ranks, ``2p`` stages in a V: rank ``r`` holds stages ``r`` and ``2p-1-r``; ``m >= 2p``):
  DualPipe "cut in half" (Sea AI Lab); same bubble as DualPipe on ``2p`` stages with half the devices.

Bubble (Table 2; F, B, W per chunk, B the full backward, F&B an overlapped pair): ``(PP/2 - 1)(F&B + B - 3W)``,
PP the number of stages (``p`` for DualPipe, ``2p`` for DualPipeV); activations ``PP + 1`` chunks per device.
"""
from __future__ import annotations

from functools import lru_cache

from .pipeline_ops import OpT, Placement, chain_placement


def dualpipe_placement(p: int) -> Placement:
    """Forward pipeline over ranks 0..p-1, reverse pipeline over ranks p-1..0."""
    return chain_placement([list(range(p)), list(range(p - 1, -1, -1))])


def dualpipev_placement(p: int) -> Placement:
    """One pipeline of 2p stages in a V: stage k on rank k for k < p, else on rank 2p-1-k."""
    return chain_placement([[k if k < p else 2 * p - 1 - k for k in range(2 * p)]])


class _Rank:
    """Op emitter of one rank: per-phase stage, forward/backward micro-batch counters, the FIFO of pending W."""

    def __init__(self, stages: tuple[int, int]):
        self.stage = stages
        self.nf = [0, 0]
        self.nb = [0, 0]
        self.wq: list[tuple[int, int]] = []
        self.ops: list[OpT] = []

    def f(self, ph: int) -> None:
        self.ops.append(("F", self.stage[ph], self.nf[ph]))
        self.nf[ph] += 1

    def b(self, ph: int, zb: bool = False) -> None:
        s, mb = self.stage[ph], self.nb[ph]
        self.nb[ph] += 1
        self.ops.append(("I" if zb else "B", s, mb))
        if zb:
            self.wq.append((s, mb))

    def w(self) -> None:
        if self.wq:
            s, mb = self.wq.pop(0)
            self.ops.append(("W", s, mb))

    def fb(self, ph_f: int, ph_b: int) -> None:
        sf, sb = self.stage[ph_f], self.stage[ph_b]
        self.ops.append(("FB", sf, self.nf[ph_f], sb, self.nb[ph_b]))
        self.nf[ph_f] += 1
        self.nb[ph_b] += 1


def _steps(e: _Rank, n_ranks: int, rank: int, n_chunks: int, last: bool) -> list[OpT]:
    """Steps 1-8 of ``step`` with ``n_ranks`` / ``rank`` / ``n_chunks`` as the reference's (half) counts;
    ``last``: the rank whose first main-step pair is not overlapped (DualPipe's middle ranks, DualPipeV's last)."""
    for _ in range((n_ranks - rank - 1) * 2):          # step 1: nF0
        e.f(0)
    for _ in range(rank + 1):                           # step 2: nF0F1
        e.f(0)
        e.f(1)
    for _ in range(n_ranks - rank - 1):                 # step 3: nB1W1F1 (zero bubble)
        e.b(1, zb=True)
        e.w()
        e.f(1)
    for i in range(n_chunks - n_ranks * 2 + rank + 1):  # step 4 (main): nF0B1F1B0
        if i == 0 and last:
            e.f(0)  # "We don't overlap these two chunks to further reduce bubble size."
            e.b(1)
        else:
            e.fb(0, 1)
        e.fb(1, 0)
    for _ in range(n_ranks - rank - 1):                 # step 5: nB1F1B0
        e.b(1)
        e.fb(1, 0)
    zb = False
    step_6 = rank + 1
    for i in range(step_6):                             # step 6: nB1B0 (second half zero bubble)
        if i == step_6 // 2 and rank % 2 == 1:
            zb = True
        e.b(1, zb)
        if i == step_6 // 2 and rank % 2 == 0:
            zb = True
        e.b(0, zb)
    for _ in range(n_ranks - rank - 1):                 # step 7: nWB0 (zero bubble)
        e.w()
        e.b(0, zb=True)
    for _ in range(rank + 1):                           # step 8: nW
        e.w()
    return e.ops


@lru_cache(maxsize=64)
def dualpipe_orders(p: int, m: int) -> tuple[tuple[OpT, ...], ...]:
    """Per-rank op orders of DualPipe on ``p`` ranks with ``m`` micro-batches (``m/2`` per direction).

    Raises:
        ValueError: ``p`` odd or < 2, ``m`` odd or ``m < 2p`` (the reference asserts both).
    """
    if p < 2 or p % 2:
        raise ValueError(f"DualPipe needs an even number of pipeline ranks, got pp {p}")
    if m % 2 or m < 2 * p:
        raise ValueError(f"DualPipe needs an even number of micro-batches >= 2*pp = {2 * p}, got {m}")
    half = p // 2
    out = []
    for r in range(p):
        h = min(r, p - 1 - r)
        # phase 0 is the forward-direction pipeline on the first half of the ranks, the reverse one on the second
        own, mirror = r, p + (p - 1 - r)
        stages = (own, mirror) if r < half else (mirror, own)
        e = _Rank(stages)
        out.append(tuple(_steps(e, half, h, m // 2, last=(r in (half - 1, half)))))
    return tuple(out)


@lru_cache(maxsize=64)
def dualpipev_orders(p: int, m: int) -> tuple[tuple[OpT, ...], ...]:
    """Per-rank op orders of DualPipeV on ``p`` ranks (``2p`` stages) with ``m`` micro-batches.

    Raises:
        ValueError: ``m < 2p`` (the reference and torch's ``ScheduleDualPipeV`` assert it).
    """
    if p < 1:
        raise ValueError(f"DualPipeV needs pp >= 1, got {p}")
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs micro-batches >= 2*pp = {2 * p}, got {m}")
    return tuple(tuple(_steps(_Rank((r, 2 * p - 1 - r)), p, r, m, last=(r == p - 1))) for r in range(p))
