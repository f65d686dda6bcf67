"""Replay of a pipeline schedule given as static per-rank op lists, over any placement of virtual stages.

The schedules of ``cost_models.dualpipe``, ``cost_models.zero_bubble_v`` and ``cost_models.combined_1f1b`` are
written as the op order each rank runs (what the reference implementations run: a fixed list per rank). This
module times them: each rank runs its next op as soon as the op's inputs have arrived, as in
``cost_models.pipeline`` for 1F1B and interleaved 1F1B.

Ops (``Op`` tuples ``(kind, stage, mb)``, and ``("FB", stage_f, mb_f, stage_b, mb_b)``):

* ``F``: forward of micro-batch ``mb`` on virtual stage ``stage``; needs the previous stage's forward (plus the
  P2P send when the previous stage sits on another rank).
* ``B``: full backward (input and weight gradient); needs the next stage's input gradient (the last stage needs
  its own forward: the loss).
* ``I``: input-gradient backward only (zero-bubble split; Qi et al. 2024, arXiv 2401.10241, Sec. 2); its weight
  gradient runs later as a ``W`` op of the same stage and micro-batch.
* ``W``: weight-gradient backward; needs that stage's ``I``.
* ``FB``: a forward of one micro-batch and a full backward of another run together so that each one's
  communication hides behind the other's compute (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1 "F&B"; Megatron
  ``combined_1f1b.py``). It takes ``max(F + B - hide_f - hide_b, F, B)``: both ops' time less the hideable
  communication of each (``hide_f`` / ``hide_b`` seconds, given per stage), and never less than the longer op.

Activation memory: a micro-batch's activations of a stage are alive from its forward to its backward (``B`` or
``I``); ``peak_in_flight`` counts them per rank from the static order alone (the count does not depend on timing).
The weight-gradient inputs an ``I`` leaves for its ``W`` are not counted, as in the DeepSeek-V3 report's Table 2
and the DualPipe README (activation PP + 1 per device).
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: One op of a static order: (kind, stage, mb) or ("FB", stage_f, mb_f, stage_b, mb_b).
OpT = tuple


@dataclass(frozen=True)
class Placement:
    """Where each virtual stage runs and how stages chain.

    ``rank[s]``: pipeline rank of virtual stage ``s``; ``prev[s]`` / ``next[s]``: the stage feeding ``s`` in forward
    / fed by it (-1 at a pipeline's end); ``chunk[s]``: index of ``s`` among its rank's model chunks (0, 1, ...).
    """

    rank: tuple[int, ...]
    prev: tuple[int, ...]
    next: tuple[int, ...]
    chunk: tuple[int, ...]

    @property
    def num_ranks(self) -> int:
        return max(self.rank) + 1


def chain_placement(ranks: list[list[int]]) -> Placement:
    """Placement of one or more pipelines, each given as the ranks of its stages in forward order; stages are
    numbered pipeline after pipeline. The chunk index of a stage is its order of appearance on its rank."""
    rank, prev, nxt, chunk = [], [], [], []
    seen: dict[int, int] = {}
    for pipe in ranks:
        base = len(rank)
        for k, r in enumerate(pipe):
            rank.append(r)
            prev.append(base + k - 1 if k else -1)
            nxt.append(base + k + 1 if k + 1 < len(pipe) else -1)
            chunk.append(seen.get(r, 0))
            seen[r] = seen.get(r, 0) + 1
    return Placement(tuple(rank), tuple(prev), tuple(nxt), tuple(chunk))


@dataclass(frozen=True)
class Op:
    """One scheduled op: ``kind`` F (forward), B (backward, or its input-gradient part when the schedule splits
    it), W (weight gradient); ``paired`` when it ran inside an overlapped ``FB`` pair."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float
    paired: bool = False


@dataclass
class Replay:
    """Makespan (seconds), per-rank busy seconds, per-rank seconds hidden by ``FB`` pairing, ops if recorded."""

    makespan: float
    busy: list[float]
    hidden: list[float]
    ops: list[Op] = field(default_factory=list)


def fb_seconds(f: float, b: float, hide_f: float, hide_b: float) -> float:
    """Seconds of an overlapped forward + backward pair (module docstring)."""
    return max(f + b - hide_f - hide_b, f, b)


def replay(orders: list[list[OpT]], place: Placement, num_microbatches: int, fwd: list[float], bwd: list[float],
           wgt: list[float], hide_f: list[float], hide_b: list[float], p2p: float,
           record: bool = False) -> Replay:
    """Time static per-rank op ``orders`` (module docstring) with per-virtual-stage seconds ``fwd`` (forward),
    ``bwd`` (full backward), ``wgt`` (its weight-gradient part), ``hide_f`` / ``hide_b`` (communication a paired op
    hides), and ``p2p`` seconds per send between different ranks.

    Raises:
        RuntimeError: the orders deadlock (an op waits for one that never runs).
    """
    ns = len(place.rank)
    m = num_microbatches
    f_end = [[-1.0] * m for _ in range(ns)]
    i_end = [[-1.0] * m for _ in range(ns)]
    nr = len(orders)
    free = [0.0] * nr
    busy = [0.0] * nr
    hidden = [0.0] * nr
    ptr = [0] * nr
    rank, prev, nxt, chunk = place.rank, place.prev, place.next, place.chunk
    ops: list[Op] = []

    def f_ready(s: int, mb: int) -> float:
        p = prev[s]
        if p < 0:
            return 0.0
        d = f_end[p][mb]
        return -1.0 if d < 0 else d + (p2p if rank[p] != rank[s] else 0.0)

    def b_ready(s: int, mb: int) -> float:
        if f_end[s][mb] < 0:
            return -1.0
        n = nxt[s]
        if n < 0:
            return f_end[s][mb]
        d = i_end[n][mb]
        return -1.0 if d < 0 else d + (p2p if rank[n] != rank[s] else 0.0)

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(nr):
            seq, i, t = orders[r], ptr[r], free[r]
            start = i
            while i < len(seq):
                op = seq[i]
                kind = op[0]
                if kind == "F":
                    dep = f_ready(op[1], op[2])
                elif kind == "W":
                    dep = i_end[op[1]][op[2]]
                elif kind == "FB":
                    df, db = f_ready(op[1], op[2]), b_ready(op[3], op[4])
                    dep = -1.0 if df < 0 or db < 0 else max(df, db)
                else:  # B, I
                    dep = b_ready(op[1], op[2])
                if dep < 0:
                    break
                t0 = t if t > dep else dep
                s, mb = op[1], op[2]
                if kind == "F":
                    dur = fwd[s]
                    f_end[s][mb] = t0 + dur
                elif kind == "B":
                    dur = bwd[s]
                    i_end[s][mb] = t0 + dur
                elif kind == "I":
                    dur = bwd[s] - wgt[s]
                    i_end[s][mb] = t0 + dur
                elif kind == "W":
                    dur = wgt[s]
                else:
                    sb, mbb = op[3], op[4]
                    f, b = fwd[s], bwd[sb]
                    dur = fb_seconds(f, b, hide_f[s], hide_b[sb])
                    hidden[r] += f + b - dur
                    f_end[s][mb] = i_end[sb][mbb] = t0 + dur
                t = t0 + dur
                busy[r] += dur
                if record:
                    if kind == "FB":
                        split = t0 + dur * f / (f + b) if f + b > 0 else t0
                        ops.append(Op(r, "F", mb, chunk[s], t0, split, True))
                        ops.append(Op(r, "B", op[4], chunk[op[3]], split, t, True))
                    else:
                        ops.append(Op(r, "B" if kind == "I" else kind, mb, chunk[s], t0, t))
                i += 1
            if i > start:
                ptr[r], free[r] = i, t
                remaining -= i - start
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked: an op waits for one that never runs")
    return Replay(max(free), busy, hidden, ops)


def peak_in_flight(orders: list[list[OpT]], place: Placement) -> list[int]:
    """Per rank, the most (stage, micro-batch) activations alive at once: +1 at a forward, -1 at its backward
    (``B`` or ``I``; an ``FB`` adds its forward before its backward frees). Timing-independent."""
    out = []
    for seq in orders:
        n = peak = 0
        for op in seq:
            k = op[0]
            if k in ("F", "FB"):
                n += 1
                peak = max(peak, n)
            if k in ("B", "I", "FB"):
                n -= 1
        out.append(peak)
    return out
