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

* ``zb-v``, ``dualpipe``, ``dualpipev``, ``combined-1f1b``: the static op orders of the reference implementations
  (``cost_models.zero_bubble_v``, ``cost_models.dualpipe``, ``cost_models.combined_1f1b``), timed by
  ``cost_models.pipeline_ops.replay``: forward ``F``, full backward ``B``, the zero-bubble split into
  input-gradient and weight-gradient ops, and overlapped forward-backward pairs (``FB``) whose communication
  hides behind each other's compute.

Closed forms of the new schedules (bubble time, ``F``/``B``/``W`` per chunk, ``B`` the full backward, ``F&B`` an
overlapped pair): ZB-V a parallelogram with no idle time once a rank has started when ``F = B - W = W`` (Qi et al.
2024, arXiv 2405.15362: "zero bubble" between steps with their optimizer post-validation; per step the ``(p-1) F``
start-up remains, half of ZB-H1's ``(p-1) F`` since a chunk is half a stage); DualPipe and DualPipeV
``(PP/2 - 1)(F&B + B - 3W)`` with ``PP`` stages (DeepSeek-V3 report, arXiv 2412.19437, Table 2: ``PP = p`` for
DualPipe, ``2p`` for DualPipeV on ``p`` ranks); combined 1F1B the interleaved bubble.

For long runs (``m`` much larger than ``p``) the makespan grows linearly in ``m`` once the steady state is reached,
so ``simulate`` runs two shorter schedules and extrapolates (exact for the periodic steady state).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from .combined_1f1b import combined_1f1b_orders, interleaved_placement
from .config import Schedule
from .dualpipe import dualpipe_orders, dualpipe_placement, dualpipev_orders, dualpipev_placement
from .layout import V_SHAPE_SCHEDULES
from .pipeline_ops import Op, Placement, peak_in_flight, replay
from .zero_bubble_v import zbv_orders, zbv_placement

#: Schedules timed from static op orders (``pipeline_ops.replay``); the others have their own simulators here.
OP_ORDER_SCHEDULES = ("zb-v", "dualpipe", "dualpipev", "combined-1f1b")
#: Schedules whose ranks hold two model chunks in a V (rank r: virtual stages r and 2p-1-r).
V_SCHEDULES = V_SHAPE_SCHEDULES
#: Schedules that run a forward and another micro-batch's backward as one overlapped pair (``FB`` ops).
PAIRING_SCHEDULES = ("dualpipe", "dualpipev", "combined-1f1b")


def bubble_ratio(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> float:
    """Pipeline idle time divided by ideal compute time (dimensionless), closed form (module docstring; the
    zero-bubble and DualPipe forms at ``t_F = t_B = t_W``, backward = input + weight gradient = 2 ``t_F``, no
    communication to hide)."""
    if pp <= 1 or m <= 0:
        return 0.0
    if schedule in ("interleaved", "combined-1f1b"):
        return (pp - 1) / (vpp * m)
    if schedule == "zb-h1":
        return (pp - 1) / (3 * m)
    if schedule == "zb-v":
        # a parallelogram: (p - 1) F of start-up per step over 2 chunks x m x 3F (zero across steps only with the
        # paper's optimizer post-validation, which Megatron and torch do not run)
        return (pp - 1) / (6 * m)
    if schedule == "dualpipe":
        # (p/2 - 1)(F&B + B - 3W) with F&B = F + B, B = 2F, W = F: (p - 2) F over m (F + B) = 3 m F
        return (pp - 2) / (3 * m)
    if schedule == "dualpipev":
        # (2p/2 - 1)(F&B + B - 3W) per chunk = 2 (p - 1) F over 2 chunks x m x 3F
        return (pp - 1) / (3 * m)
    return (pp - 1) / m


def bubble_fraction(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> float:
    """Fraction of the pipeline's total time that is bubble: ``r / (1 + r)`` with ``r`` the bubble ratio."""
    r = bubble_ratio(schedule, pp, m, vpp)
    return r / (1 + r)


@dataclass
class Simulation:
    """Result of ``simulate``: makespan (seconds), per-rank busy seconds, and the ops (when recorded)."""

    makespan: float
    busy: list[float]
    ops: list[Op] = field(default_factory=list)
    extrapolated: bool = False
    #: per-rank seconds that overlapped forward-backward pairs hid (the op-order schedules; zeros otherwise)
    hidden: list[float] | None = None

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


def chunks_per_rank(schedule: Schedule, vpp: int = 1) -> int:
    """Entries per rank of ``simulate``'s per-virtual-stage time lists: ``vpp`` for the interleaved orders, 2 for
    the V schedules, 1 otherwise (DualPipe's mirrored copies reuse the ``pp`` model stages' times)."""
    if schedule in ("interleaved", "combined-1f1b"):
        return vpp
    return 2 if schedule in V_SCHEDULES else 1


def op_orders(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> tuple[tuple, Placement]:
    """Static per-rank op orders and stage placement of an ``OP_ORDER_SCHEDULES`` schedule.

    Raises:
        ValueError: the schedule cannot run ``m`` micro-batches on ``pp`` ranks (the message says why).
    """
    if schedule == "zb-v":
        return zbv_orders(pp, m), zbv_placement(pp)
    if schedule == "dualpipev":
        return dualpipev_orders(pp, m), dualpipev_placement(pp)
    if schedule == "dualpipe":
        return dualpipe_orders(pp, m), dualpipe_placement(pp)
    if schedule == "combined-1f1b":
        return combined_1f1b_orders(pp, m, vpp), interleaved_placement(pp, vpp)
    raise ValueError(f"schedule {schedule!r} has no static op order here")


def schedule_microbatch_rule(schedule: Schedule, pp: int) -> tuple[int, int]:
    """(smallest, multiple) of the micro-batch counts an ``OP_ORDER_SCHEDULES`` schedule runs: DualPipe an even
    count >= 2p, DualPipeV >= 2p (deepseek-ai/DualPipe asserts; torch ``ScheduleDualPipeV``), else any >= 1."""
    if schedule == "dualpipe":
        return 2 * pp, 2
    if schedule == "dualpipev":
        return 2 * pp, 1
    return 1, 1


@lru_cache(maxsize=1024)
def in_flight_chunks(schedule: Schedule, pp: int, m: int, vpp: int = 1) -> tuple[int, ...]:
    """Per rank, the most model-chunk activations alive at once (``pipeline_ops.peak_in_flight``) in an
    ``OP_ORDER_SCHEDULES`` order. The peak is reached within the warm-up and the first steady-state steps, so orders
    longer than ``4 p v`` micro-batches are counted at the smallest valid count above that (checked against the full
    order by tests/test_schedules.py)."""
    lo, mult = schedule_microbatch_rule(schedule, pp)
    cap = max(lo, 4 * pp * max(vpp, 2))
    cap += (-cap) % (mult * pp)
    orders, place = op_orders(schedule, pp, min(m, cap) if m > cap else m, vpp)
    return tuple(peak_in_flight([list(o) for o in orders], place))


def _simulate_ops(schedule: str, p: int, m: int, v: int, fwd: list[float], bwd: list[float], wgt: list[float],
                  hide_f: list[float], hide_b: list[float], p2p: float, record: bool) -> Simulation:
    orders, place = op_orders(schedule, p, m, v)
    n_mb = m
    if schedule == "dualpipe":  # the reverse pipeline's stage p + k is model stage k; m/2 micro-batches each way
        fwd, bwd, wgt, hide_f, hide_b = (x + x for x in (fwd, bwd, wgt, hide_f, hide_b))
        n_mb = m // 2
    rp = replay([list(o) for o in orders], place, n_mb, fwd, bwd, wgt, hide_f, hide_b, p2p, record)
    return Simulation(rp.makespan, rp.busy, rp.ops, hidden=rp.hidden)


#: Relative tolerance (of the makespan) within which two successive makespan increments count as equal: the
#: schedule has reached its periodic steady state (``_steady_state_extrapolation``).
STEADY_STATE_RTOL = 1e-9
#: Above this many ops a GPipe / 1F1B / interleaved order may be extrapolated from its verified steady state.
STEADY_STATE_MIN_OPS = 1000
#: A static order without a verified steady state is simulated in full up to this many times ``simulate``'s
#: ``max_ops`` (400,000 ops by default, about 0.3 s of CPU): past it, the makespan is extrapolated linearly from
#: two runs of about half as many ops each.
FULL_SIMULATION_FACTOR = 20


def _steady_state_extrapolation(schedule: str, p: int, m: int, v: int, fwd: list[float], bwd: list[float],
                                p2p: float) -> Simulation | None:
    """The makespan of a long GPipe / 1F1B / interleaved order from shorter runs, exact once it is periodic.

    A static order of fixed op times is a max-plus linear system: past a transient each further group of ``p``
    micro-batches adds the same time to the makespan and to each rank's busy time (the cycle time, the largest
    circuit mean; Baccelli et al. 1992, "Synchronization and Linearity", Ch. 3). Runs of ``m0``, ``m0 + p`` and
    ``m0 + 2p`` micro-batches that add equal increments (within ``STEADY_STATE_RTOL``), no less than the busiest
    rank's work, give a candidate cycle time; it is accepted when runs of about ``4 m0`` and ``4 m0 + p``
    micro-batches land where it predicts (a transient can mimic a steady state for a while: two circuits of nearly
    equal mean), and the rest is extrapolated linearly from there; otherwise the search moves on to ``4 m0``. None
    when ``m`` is short (``STEADY_STATE_MIN_OPS``) or no steady state shows well before ``m`` (the caller then
    simulates every op). The greedy ZB-H1 list schedule is not a static order and is never extrapolated here."""
    if 2 * m * p * v <= STEADY_STATE_MIN_OPS:
        return None

    def run(n: int) -> Simulation:
        return _run_static(schedule, p, n, v, fwd, bwd, p2p, False)

    def linear(x: Simulation, y: Simulation, groups: int, step: float, busy_step: list[float]) -> bool:
        tol = STEADY_STATE_RTOL * y.makespan
        return (abs(y.makespan - x.makespan - groups * step) <= tol
                and all(abs(yb - xb - groups * s) <= tol for xb, yb, s in zip(x.busy, y.busy, busy_step)))

    m0 = max(4 * p, 8)
    m0 += (m - m0) % p  # m - m0 a whole number of groups of p
    while True:
        m1 = m0 + p * (3 * m0 // p)  # about 4 m0, m1 = m (mod p)
        if 3 * m0 + 2 * m1 + 4 * p > m // 2:  # the short runs would cost more than half the full one
            return None
        a, b, c = run(m0), run(m0 + p), run(m0 + 2 * p)
        step = c.makespan - b.makespan
        busy_step = [z - y for y, z in zip(b.busy, c.busy)]
        # the makespan cannot grow slower than the busiest rank works: a run that does is still in a transient
        if linear(a, b, 1, step, busy_step) and step >= max(busy_step) * (1 - STEADY_STATE_RTOL):
            d, e = run(m1), run(m1 + p)
            if linear(c, d, (m1 - m0 - 2 * p) // p, step, busy_step) and linear(d, e, 1, step, busy_step):
                k = (m - m1 - p) // p
                return Simulation(e.makespan + k * step, [x + k * s for x, s in zip(e.busy, busy_step)],
                                  extrapolated=True)
        m0 = m1


def simulate(schedule: Schedule, pp: int, m: int, fwd_s: list[float], bwd_s: list[float], vpp: int = 1,
             p2p_s: float = 0.0, record: bool = False, w_fraction: float = 0.5,
             max_ops: int = 20000, wgt_s: list[float] | None = None, hide_f_s: list[float] | None = None,
             hide_b_s: list[float] | None = None) -> Simulation:
    """Simulate one optimizer step's pipeline.

    Args:
        fwd_s, bwd_s: seconds of one micro-batch's forward / backward on each *virtual* stage (length
            ``pp * chunks_per_rank``, in pipeline order: interleaved chunk ``c`` of rank ``r`` is stage ``c*pp + r``, a
            V schedule's rank ``r`` holds stages ``r`` and ``2pp-1-r``, DualPipe's ``pp`` entries are the model
            stages); ``bwd_s`` includes recompute.
        p2p_s: seconds to send one activation (or gradient) between neighbouring stages.
        w_fraction: ZB-H1 only: share of the backward that is weight-gradient work (``W``); 0.5 when
            ``t_B = t_W`` (Qi et al. 2024 Sec. 2).
        max_ops: above this many ops the schedule is simulated for fewer micro-batches and extrapolated linearly
            (steady state), unless ``record``. GPipe, 1F1B and interleaved orders are first extrapolated from a
            verified steady state whenever that is cheaper (``_steady_state_extrapolation``: exact to rounding),
            and without one simulated in full up to ``FULL_SIMULATION_FACTOR`` x ``max_ops``.
        wgt_s: weight-gradient seconds within each ``bwd_s`` (zero-bubble and DualPipe schedules; default
            ``w_fraction`` of it).
        hide_f_s, hide_b_s: seconds of each stage's forward / backward communication that an overlapped partner
            op hides (DualPipe, DualPipeV, combined 1F1B; default 0).

    Raises:
        ValueError: wrong list lengths, or a micro-batch count the schedule cannot run.
    """
    v = chunks_per_rank(schedule, vpp)
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
    if schedule in OP_ORDER_SCHEDULES:
        n = len(fwd_s)
        wgt = list(wgt_s) if wgt_s is not None else [x * w_fraction for x in bwd_s]
        hf = list(hide_f_s) if hide_f_s is not None else [0.0] * n
        hb = list(hide_b_s) if hide_b_s is not None else [0.0] * n
        if not len(wgt) == len(hf) == len(hb) == n:
            raise ValueError(f"wgt_s/hide_f_s/hide_b_s need {n} entries")
        args = (list(fwd_s), list(bwd_s), wgt, hf, hb, p2p_s)
        lo, mult = schedule_microbatch_rule(schedule, pp)
        m0 = max(lo, 4 * pp)
        m0 += (-m0) % (mult * pp)
        step = mult * pp
        if record or 3 * m * pp * v <= max_ops or m <= m0 + step:
            return _simulate_ops(schedule, pp, m, vpp, *args, record)
        a = _simulate_ops(schedule, pp, m0, vpp, *args, False)
        b = _simulate_ops(schedule, pp, m0 + step, vpp, *args, False)
        k = (m - m0) / step
        lin = lambda x, y: x + (y - x) * k  # noqa: E731
        return Simulation(lin(a.makespan, b.makespan), [lin(x, y) for x, y in zip(a.busy, b.busy)],
                          extrapolated=True, hidden=[lin(x, y) for x, y in zip(a.hidden, b.hidden)])
    if schedule != "zb-h1" and not record:
        periodic = _steady_state_extrapolation(schedule, pp, m, v, fwd_s, bwd_s, p2p_s)
        if periodic is not None:
            return periodic
    n_ops = (3 if schedule == "zb-h1" else 2) * m * pp * v
    # no verified steady state: simulate every op up to FULL_SIMULATION_MAX_OPS (a transient can last hundreds of
    # micro-batches: a point-to-point-bound interleaved order of 2,048 micro-batches extrapolated from 16 and 24 came
    # out 7% short, from 616 and 624 still 4%), beyond it extrapolate from the longest runs the budget allows
    full = FULL_SIMULATION_FACTOR * max_ops
    if record or n_ops <= full or m <= 4 * pp:
        return _simulate_once(schedule, pp, m, v, fwd_s, bwd_s, p2p_s, record, w_fraction)
    m0 = max(2 * pp * max(1, math.ceil(8 / pp)), full // (n_ops // m) // 2)
    m0 = max(2 * pp, min(m0, m - pp) - min(m0, m - pp) % pp)
    a = _simulate_once(schedule, pp, m0, v, fwd_s, bwd_s, p2p_s, False, w_fraction)
    b = _simulate_once(schedule, pp, m0 + pp, v, fwd_s, bwd_s, p2p_s, False, w_fraction)
    busy_slope = [(y - x) / pp for x, y in zip(a.busy, b.busy)]
    # the makespan grows at least as fast as the busiest rank works (a short run still in its transient can add
    # less per group: extrapolated from it, the makespan fell below that rank's busy time)
    slope = max((b.makespan - a.makespan) / pp, max(busy_slope))
    return Simulation(a.makespan + slope * (m - m0), [x + s * (m - m0) for x, s in zip(a.busy, busy_slope)],
                      extrapolated=True)
