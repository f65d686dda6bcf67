"""Pipeline-parallel schedules: closed-form bubbles and a discrete-event schedule simulator.

Closed forms (formulas.md Sec. 5), bubble ratio = idle / ideal compute for ``p`` stages, ``m`` micro-batches,
``v`` chunks per rank: GPipe and 1F1B ``(p-1)/m`` (Huang et al. 2019; Narayanan et al. SC21 Sec. 2.2.1),
interleaved 1F1B ``(p-1)/(v*m)`` (SC21 Sec. 2.2.2), ZB-H1 ``(p-1)/(3m)`` when ``t_F = t_B = t_W`` (Qi et al. 2024,
"Zero Bubble Pipeline Parallelism", Table 1).

``simulate`` runs the schedule op by op with per-virtual-stage forward/backward times (so the end stages'
embedding and output layer, uneven layer splits and P2P latency shape the bubble), in the orders the frameworks
use:

* ``gpipe``: every forward, then every backward (Huang et al. 2019).
* ``1f1b``: rank ``r`` runs ``min(p-r-1, m)`` warm-up forwards, then alternates one forward / one backward, then
  drains the backwards (PipeDream-Flush; Megatron-LM ``forward_backward_pipelining_without_interleaving``).
* ``interleaved``: Megatron-LM ``forward_backward_pipelining_with_interleaving``: model chunk ``c`` of rank ``r``
  is virtual stage ``c*p + r``; micro-batches go through the chunks in groups of ``p``; warm-up
  ``(p-r-1)*2 + (v-1)*p`` forwards, then 1F1B, backwards visiting the chunks in reverse.
* ``zb-h1``: backward split into input-gradient ``B`` and weight-gradient ``W`` (each half the backward time
  unless given); a rank runs a ready ``B`` first, then a ``F`` while fewer than ``p-r`` micro-batches are in
  flight (1F1B's memory bound, the "H1" handcrafted schedule), and fills idle time with deferred ``W``
  (Qi et al. 2024, Sec. 3).

For long runs (``m`` much larger than ``p``) the makespan grows linearly in ``m`` once the steady state is reached,
so ``simulate`` runs two shorter schedules and extrapolates (exact for the periodic steady state).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from .config import Schedule


def bubble_ratio(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> float:
    """Pipeline idle time divided by ideal compute time (dimensionless), closed form."""
    if pp <= 1 or m <= 0:
        return 0.0
    if schedule == "interleaved":
        return (pp - 1) / (vpp * m)
    if schedule == "zb-h1":
        return (pp - 1) / (3 * m)
    return (pp - 1) / m


def bubble_fraction(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> float:
    """Fraction of the pipeline's total time that is bubble: ``r / (1 + r)`` with ``r`` the bubble ratio."""
    r = bubble_ratio(schedule, pp, m, vpp)
    return r / (1 + r)


@dataclass(frozen=True)
class Op:
    """One scheduled op: ``kind`` F (forward), B (backward or input-gradient), W (weight-gradient)."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


@dataclass
class Simulation:
    """Result of ``simulate``: makespan (seconds), per-rank busy seconds, and the ops (when recorded)."""

    makespan: float
    busy: list[float]
    ops: list[Op] = field(default_factory=list)
    extrapolated: bool = False

    @property
    def bubble_s(self) -> float:
        """Idle seconds of the busiest rank (makespan minus its compute)."""
        return self.makespan - max(self.busy)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.makespan if self.makespan > 0 else 0.0


def _orders(schedule: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Static op order per rank: (kind, microbatch, chunk)."""
    out = []
    if schedule == "interleaved" and v > 1:
        fwd, groups = [], math.ceil(m / p)
        for g in range(groups):
            mbs = range(g * p, min(m, (g + 1) * p))
            for c in range(v):
                fwd.extend((mb, c) for mb in mbs)
        bwd = []
        for g in range(groups):
            mbs = range(g * p, min(m, (g + 1) * p))
            for c in reversed(range(v)):
                bwd.extend((mb, c) for mb in mbs)
        total = m * v
        for r in range(p):
            warm = min(total, (p - r - 1) * 2 + (v - 1) * p)
            seq = [("F", *fwd[i]) for i in range(warm)]
            fi, bi = warm, 0
            while fi < total:
                seq.append(("F", *fwd[fi]))
                fi += 1
                seq.append(("B", *bwd[bi]))
                bi += 1
            seq.extend(("B", *bwd[i]) for i in range(bi, total))
            out.append(seq)
        return out
    for r in range(p):
        if schedule == "gpipe":
            seq = [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
        else:
            warm = min(m, p - r - 1)
            seq = [("F", i, 0) for i in range(warm)]
            for i in range(m - warm):
                seq.append(("F", warm + i, 0))
                seq.append(("B", i, 0))
            seq.extend(("B", i, 0) for i in range(m - warm, m))
        out.append(seq)
    return out


@lru_cache(maxsize=256)
def _compiled_orders(schedule: str, p: int, m: int, v: int) -> tuple[tuple[tuple[bool, int, int, int], ...], ...]:
    """``_orders`` per rank as (is_forward, micro-batch, chunk, virtual stage c*p + r) tuples, cached: the
    search re-scores many configurations with the same (schedule, pp, m, vpp)."""
    return tuple(tuple((kind == "F", mb, c, c * p + r) for kind, mb, c in seq)
                 for r, seq in enumerate(_orders(schedule, p, m, v)))


def _run_static(schedule: str, p: int, m: int, v: int, fwd: list[float], bwd: list[float], p2p: float,
                record: bool) -> Simulation:
    """Event-driven replay of the static per-rank op orders: each rank runs its next op as soon as its input
    (the previous virtual stage's forward, or the next one's backward, plus ``p2p``) has arrived."""
    orders = _compiled_orders(schedule, p, m, v)
    nv = p * v
    last = nv - 1
    f_end = [[-1.0] * m for _ in range(nv)]
    b_end = [[-1.0] * m for _ in range(nv)]
    free = [0.0] * p
    busy = [0.0] * p
    ptr = [0] * p
    lens = [len(o) for o in orders]
    ops: list[Op] = []
    remaining = sum(lens)
    while remaining:
        progressed = False
        for r in range(p):
            seq, i, n, t = orders[r], ptr[r], lens[r], free[r]
            start = i
            while i < n:
                is_f, mb, c, k = seq[i]
                if is_f:
                    if k == 0:
                        t0 = t
                    else:
                        dep = f_end[k - 1][mb]
                        if dep < 0:
                            break
                        dep += p2p
                        t0 = t if t > dep else dep
                    dur = fwd[k]
                    t = t0 + dur
                    f_end[k][mb] = t
                else:
                    if f_end[k][mb] < 0:
                        break
                    if k == last:
                        dep = f_end[k][mb]
                    else:
                        dep = b_end[k + 1][mb]
                        if dep < 0:
                            break
                        dep += p2p
                    t0 = t if t > dep else dep
                    dur = bwd[k]
                    t = t0 + dur
                    b_end[k][mb] = t
                busy[r] += dur
                if record:
                    ops.append(Op(r, "F" if is_f else "B", mb, c, t0, t))
                i += 1
            if i > start:
                ptr[r], free[r] = i, t
                remaining -= i - start
                progressed = True
        if not progressed:  # pragma: no cover - orders are always satisfiable
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked")
    return Simulation(max(free), busy, ops)


def _run_zb(p: int, m: int, fwd: list[float], bwd: list[float], wgt: list[float], p2p: float,
            record: bool) -> Simulation:
    """ZB-H1 greedy list schedule (v = 1): B first, then F under the 1F1B in-flight bound, W fills gaps."""
    f_end = [[-1.0] * m for _ in range(p)]
    b_end = [[-1.0] * m for _ in range(p)]
    free = [0.0] * p
    busy = [0.0] * p
    nf, nb = [0] * p, [0] * p
    pending_w: list[list[int]] = [[] for _ in range(p)]
    nw = [0] * p
    ops: list[Op] = []
    total = 3 * m * p
    done = 0
    while done < total:
        # pick the rank whose next op can start earliest
        best = None
        for r in range(p):
            cands = []
            if nb[r] < nf[r]:
                mb = nb[r]
                dep = f_end[r][mb] if r == p - 1 else b_end[r + 1][mb]
                if dep >= 0:
                    cands.append((max(free[r], dep + (p2p if r < p - 1 else 0.0)), 0, "B", mb))
            if nf[r] < m and nf[r] - nb[r] < p - r:
                mb = nf[r]
                dep = 0.0 if r == 0 else f_end[r - 1][mb]
                if dep >= 0:
                    cands.append((max(free[r], dep + (p2p if r > 0 else 0.0)), 1, "F", mb))
            non_w = sorted(cands)
            if pending_w[r] and (not non_w or non_w[0][0] > free[r]):
                pick = (free[r], 2, "W", pending_w[r][0])  # the rank would idle: fill the gap with a W
            elif non_w:
                pick = non_w[0]
            else:
                continue
            key = (pick[0], pick[1], r)
            if best is None or key < best[0]:
                best = (key, r, pick)
        if best is None:  # only Ws remain blocked: cannot happen
            raise RuntimeError("zb-h1 schedule deadlocked")  # pragma: no cover
        _, r, (t0, _, kind, mb) = best
        if kind == "F":
            dur = fwd[r]
            f_end[r][mb] = t0 + dur
            nf[r] += 1
        elif kind == "B":
            dur = bwd[r]
            b_end[r][mb] = t0 + dur
            nb[r] += 1
            pending_w[r].append(mb)
        else:
            dur = wgt[r]
            pending_w[r].pop(0)
            nw[r] += 1
        free[r] = t0 + dur
        busy[r] += dur
        if record:
            ops.append(Op(r, kind, mb, 0, t0, t0 + dur))
        done += 1
    return Simulation(max(free), busy, ops)


def _simulate_once(schedule: str, p: int, m: int, v: int, fwd: list[float], bwd: list[float],
                   p2p: float, record: bool, w_fraction: float) -> Simulation:
    if schedule == "zb-h1":
        b = [x * (1 - w_fraction) for x in bwd]
        w = [x * w_fraction for x in bwd]
        return _run_zb(p, m, fwd, b, w, p2p, record)
    return _run_static(schedule, p, m, v, fwd, bwd, p2p, record)


def simulate(schedule: Schedule, pp: int, m: int, fwd_s: list[float], bwd_s: list[float], vpp: int = 1,
             p2p_s: float = 0.0, record: bool = False, w_fraction: float = 0.5,
             max_ops: int = 20000) -> Simulation:
    """Simulate one optimizer step's pipeline.

    Args:
        fwd_s, bwd_s: seconds of one micro-batch's forward / backward on each *virtual* stage (length ``pp*vpp``;
            virtual stage ``c*pp + r`` is chunk ``c`` of rank ``r``); ``bwd_s`` includes recompute.
        p2p_s: seconds to send one activation (or gradient) between neighbouring stages.
        w_fraction: ZB-H1 only: share of the backward that is weight-gradient work (``W``); 0.5 when
            ``t_B = t_W`` (Qi et al. 2024 Sec. 2).
        max_ops: above this many ops the schedule is simulated for fewer micro-batches and extrapolated linearly
            (steady state), unless ``record``.
    """
    v = vpp if schedule == "interleaved" else 1
    if len(fwd_s) != pp * v or len(bwd_s) != pp * v:
        raise ValueError(f"fwd_s/bwd_s need pp*vpp = {pp * v} entries, got {len(fwd_s)}/{len(bwd_s)}")
    if m < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {m}")
    if schedule == "interleaved" and v > 1 and m % pp:
        # Megatron's interleaved order runs micro-batches in groups of pp; with a partial last group run the
        # largest whole number of groups and add the rest at the steady-state rate (busiest rank's F+B per
        # micro-batch); with fewer micro-batches than stages, no interleaving (chunks of a rank run back to back)
        whole = m - m % pp
        per_mb = [sum(fwd_s[c * pp + r] + bwd_s[c * pp + r] for c in range(v)) for r in range(pp)]
        if whole == 0:
            f1 = [sum(fwd_s[c * pp + r] for c in range(v)) for r in range(pp)]
            b1 = [sum(bwd_s[c * pp + r] for c in range(v)) for r in range(pp)]
            return simulate("1f1b", pp, m, f1, b1, 1, p2p_s, record, w_fraction, max_ops)
        base = simulate(schedule, pp, whole, fwd_s, bwd_s, vpp, p2p_s, record, w_fraction, max_ops)
        extra = m - whole
        return Simulation(base.makespan + extra * max(per_mb), [b + extra * x for b, x in zip(base.busy, per_mb)],
                          base.ops, extrapolated=True)
    n_ops = (3 if schedule == "zb-h1" else 2) * m * pp * v
    if record or n_ops <= max_ops or m <= 4 * pp:
        return _simulate_once(schedule, pp, m, v, fwd_s, bwd_s, p2p_s, record, w_fraction)
    m0 = 2 * pp * max(1, math.ceil(8 / pp))
    m0 = max(2 * pp, m0 - m0 % pp)
    a = _simulate_once(schedule, pp, m0, v, fwd_s, bwd_s, p2p_s, False, w_fraction)
    b = _simulate_once(schedule, pp, m0 + pp, v, fwd_s, bwd_s, p2p_s, False, w_fraction)
    slope = (b.makespan - a.makespan) / pp
    busy_slope = [(y - x) / pp for x, y in zip(a.busy, b.busy)]
    return Simulation(a.makespan + slope * (m - m0), [x + s * (m - m0) for x, s in zip(a.busy, busy_slope)],
                      extrapolated=True)
