"""Per-stage layer counts of a pipeline whose stages run at different speeds and hold different memory.

Stage ``r`` holding layers ``[a, b)`` takes ``t_r = sum of its layers' seconds + e_r`` per micro-batch (forward +
backward at its pool's rates; ``e_r`` the embedding on the first stage, the output layer and loss on the last) and
needs ``base_r + sum of its layers' bytes <= limit_r`` (each layer's bytes include its activations times the
micro-batches stage ``r`` holds in flight). Every stage holds at least one layer, layers stay in order.

**Objective.** The 1F1B makespan model ``M = (m - 1) max_r t_r + sum_r t_r``: exact for equal stages (the
``(m + p - 1)(F + B)`` of Narayanan et al. SC21 Sec. 2.2), and with unequal stages the steady state runs at the
slowest stage while warm-up and drain cross every stage once (the min-max "bottleneck stage" objective of pipeline
partitioners: PipeDream, AMP NeurIPS'22, Metis ATC'24, with the fill term that separates splits of equal
bottleneck). The planner re-scores the chosen split with the simulated schedule (``cost_models.pools``).

**Exact search.** For a threshold ``T`` on the largest stage time, the split with the least ``sum_r t_r`` subject to
``t_r <= T`` and the memory caps is found exactly, and ``M`` is minimised over every threshold that can matter:

* ``T`` ranges over the stage times that occur (a stage time of some feasible range); the smallest feasible one,
  ``T_min``, is found by bisection over those values (feasibility is monotone in ``T``);
* a threshold ``T`` can only beat the best ``M`` found so far, ``M*``, if ``(m - 1) T + S_inf < M*``, where
  ``S_inf`` is the least ``sum_r t_r`` under the memory caps alone, so the thresholds are tried in increasing order
  until that fails.

For one threshold: when every layer costs the same on a stage (all decoder layers of one kind, every dense model
and all-MoE models), ``sum_r t_r = sum_r tau_r n_r + const`` is linear with box constraints ``1 <= n_r <= c_r(T)``,
so filling the fastest stages to their caps first is optimal (a greedy is exact for a linear objective over a box
and one sum constraint). With layers of different kinds (DeepSeek-V3's dense prefix) a dynamic program over
stages and the first layer index each stage starts at does the same, exactly, in ``O(pp x L)`` per threshold (the
layers a stage can hold from a start index form an interval whose end is non-decreasing in the start, so each step
is a sliding-window minimum).

``lower_bound_s`` of a split, ``max_k (sum_{r<k} t_r + m t_k)``, is a lower bound of any schedule's makespan
(stage ``k`` cannot start before the first micro-batch's forward reached it, must run ``m`` forwards and backwards,
and the last backward still has to cross the stages before it); the planner's exact re-scoring stops on it.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import product

import numpy as np

#: Relative tolerance when comparing seconds (floating-point sums of the same per-layer times).
REL_EPS = 1e-12


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage for the split: seconds per layer of each kind (``layer_s[k]``, forward + backward of one
    micro-batch), fixed seconds ``extra_s``, bytes held with no layer (``mem_base``) and per layer of each kind
    (``mem_layer[k]``), the usable bytes ``mem_limit``, and optionally at most ``max_layers`` layers (a cap the exact
    memory estimate imposed)."""

    layer_s: tuple[float, ...]
    extra_s: float
    mem_base: float
    mem_layer: tuple[float, ...]
    mem_limit: float
    max_layers: int | None = None


@dataclass(frozen=True)
class StageArrays:
    """The stages of ``StageSpec`` as arrays (``p`` stages, ``K`` layer kinds): ``layer_s`` and ``mem_layer``
    ``(p, K)``, ``extra_s``, ``mem_base``, ``mem_limit`` and ``max_layers`` ``(p,)`` (``max_layers`` -1: no cap)."""

    layer_s: np.ndarray
    extra_s: np.ndarray
    mem_base: np.ndarray
    mem_layer: np.ndarray
    mem_limit: np.ndarray
    max_layers: np.ndarray

    @classmethod
    def of(cls, stages: list[StageSpec]) -> "StageArrays":
        return cls(np.array([s.layer_s for s in stages], dtype=float), np.array([s.extra_s for s in stages], float),
                   np.array([s.mem_base for s in stages], float), np.array([s.mem_layer for s in stages], float),
                   np.array([s.mem_limit for s in stages], float),
                   np.array([-1 if s.max_layers is None else s.max_layers for s in stages], dtype=int))

    def __len__(self) -> int:
        return len(self.extra_s)


@dataclass(frozen=True)
class Split:
    """Layers per stage, each stage's seconds, the makespan model ``M`` and the lower bound (module docstring)."""

    layers: tuple[int, ...]
    stage_s: tuple[float, ...]
    makespan_model_s: float
    lower_bound_s: float


def makespan_model(stage_s, m: int) -> float:
    """``(m - 1) max_r t_r + sum_r t_r`` seconds (module docstring)."""
    return (m - 1) * max(stage_s) + sum(stage_s)


def lower_bound(stage_s, m: int) -> float:
    """``max_k (sum_{r<k} t_r + m t_k)`` seconds: no 1F1B schedule of these stages is shorter."""
    t = np.asarray(stage_s, dtype=float)
    before = np.concatenate(([0.0], np.cumsum(t)[:-1]))
    return float(np.max(before + m * t))


def lower_bound_1f1b(stage_s, stage_f, m: int) -> float:
    """A tighter 1F1B bound with the forward seconds ``stage_f`` of each stage known: besides ``lower_bound``, stage
    ``k`` cannot run the backward of the first micro-batch before its forward crossed every stage and its backward
    the stages after ``k``; by then it ran at most ``pp - k`` forwards (1F1B's warm-up, Megatron-LM
    ``forward_backward_pipelining_without_interleaving``), so ``m`` backwards and ``max(0, m - pp + k)`` forwards
    remain, and after its last backward the stages before it still run theirs:
    ``sum_r F_r + sum_{r != k} B_r + m B_k + max(0, m - pp + k) F_k``."""
    t = np.asarray(stage_s, dtype=float)
    f = np.asarray(stage_f, dtype=float)
    b = t - f
    p = len(t)
    k = np.arange(p)
    lb2 = f.sum() + b.sum() - b + m * b + np.maximum(0, m - p + k) * f
    return max(lower_bound(t, m), float(lb2.max()))


def _split(layers, stage_s, m: int) -> Split:
    return Split(tuple(int(x) for x in layers), tuple(float(x) for x in stage_s), makespan_model(stage_s, m),
                 lower_bound(stage_s, m))


def best_split(stages: list[StageSpec] | StageArrays, num_layers: int, m: int,
               layer_kinds: list[int] | None = None) -> Split | None:
    """The split minimising the makespan model over the stages' time and memory caps (module docstring), or None
    when no split fits (fewer layers than stages, or the memory caps hold fewer than ``num_layers``).

    ``layer_kinds[l]`` is the kind (index into ``layer_s`` / ``mem_layer``) of decoder layer ``l``; None = all of
    kind 0. Ties between equal splits are broken towards fewer layers on earlier stages (the first stages hold the
    most micro-batches in flight).
    """
    if not isinstance(stages, StageArrays):
        stages = StageArrays.of(stages)
    p = len(stages)
    if p == 0 or num_layers < p or m < 1:
        return None
    kinds = sorted(set(layer_kinds)) if layer_kinds is not None else [0]
    if len(kinds) == 1:
        return _uniform(stages, num_layers, m, kinds[0])
    return _mixed(stages, num_layers, m, layer_kinds)


def memory_caps(stages: StageArrays, num_layers: int, kinds: list[int] | None = None) -> np.ndarray:
    """Most layers each stage's memory holds (of the kind with the fewest bytes per layer among ``kinds``, default
    kind 0: exact with one kind, an upper bound otherwise), capped by ``max_layers`` and ``num_layers``; -1 where
    not even the stage's fixed bytes fit."""
    L = num_layers
    slope = stages.mem_layer[:, kinds or [0]].min(axis=1)
    room = stages.mem_limit - stages.mem_base
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where(slope > 0, np.floor(room / np.where(slope > 0, slope, 1.0) * (1 + REL_EPS)), L)
    cap = np.minimum(np.where(room >= 0, cap, -1), L).astype(int)
    return np.where(stages.max_layers >= 0, np.minimum(cap, stages.max_layers), cap)


def memory_fits(stages: StageArrays, num_layers: int, layer_kinds: list[int] | None = None) -> bool:
    """Whether the stages' memory caps can hold the ``num_layers`` layers (of kinds ``layer_kinds``, default all of
    kind 0) in order, at least one on each stage: exactly when ``best_split`` finds a split."""
    kinds = sorted(set(layer_kinds)) if layer_kinds is not None else [0]
    if len(kinds) == 1:
        cap = memory_caps(stages, num_layers, kinds)
        return bool(cap.min() >= 1 and cap.sum() >= num_layers)
    px = _Prefix(stages, num_layers, layer_kinds)
    return bool(px.room.min() >= 0 and px.fits(math.inf))


# ------------------------------------------------------------------------------------------------ one layer kind
def _uniform(stages: StageArrays, L: int, m: int, kind: int) -> Split | None:
    tau, e = stages.layer_s[:, kind], stages.extra_s
    cap = memory_caps(stages, L, [kind])
    if cap.min() < 1 or cap.sum() < L:
        return None
    p = len(stages)
    # fill order: fastest stage first; among equal speeds the later stage first (fewer layers on early stages)
    order = np.lexsort((-np.arange(p), tau))

    def fill(c: np.ndarray) -> np.ndarray:
        extra = np.minimum(np.cumsum((c - 1)[order]), L - p)
        n = np.ones(p, dtype=int)
        n[order] += np.diff(np.concatenate(([0], extra)))
        return n

    def caps_at(T: float) -> np.ndarray:
        return np.minimum(cap, np.floor((T - e) / tau * (1 + REL_EPS) + REL_EPS).astype(int))

    values = np.unique(np.concatenate([tau[r] * np.arange(1, cap[r] + 1) + e[r] for r in range(p)]))
    feasible = lambda T: (lambda c: c.min() >= 1 and c.sum() >= L)(caps_at(T))  # noqa: E731
    lo = bisect_left(range(len(values)), True, key=lambda i: feasible(values[i]))
    if lo == len(values):  # pragma: no cover - the memory caps alone hold L layers, so the largest value is feasible
        return None
    n_inf = fill(cap)
    s_inf = float(np.sum(tau * n_inf + e))
    best: Split | None = None
    for T in values[lo:]:
        if best is not None and (m - 1) * T + s_inf >= best.makespan_model_s * (1 - REL_EPS):
            break
        n = fill(caps_at(T))
        t = tau * n + e
        if t.max() < T * (1 - REL_EPS):
            continue  # the same split as a smaller threshold
        cand = _split(n, t, m)
        if best is None or cand.makespan_model_s < best.makespan_model_s * (1 - REL_EPS):
            best = cand
    return best


# ------------------------------------------------------------------------------------------- several layer kinds
class _Prefix:
    """Prefix sums over the layers, per stage: seconds ``C[r][b] - C[r][a]`` and bytes ``B[r][b] - B[r][a]`` of
    layers ``[a, b)`` on stage ``r``."""

    def __init__(self, stages: StageArrays, L: int, layer_kinds: list[int]):
        kinds = np.asarray(layer_kinds, dtype=int)
        zero = np.zeros((len(stages), 1))
        self.C = np.hstack([zero, np.cumsum(stages.layer_s[:, kinds], axis=1)])
        self.B = np.hstack([zero, np.cumsum(stages.mem_layer[:, kinds], axis=1)])
        self.room = stages.mem_limit - stages.mem_base
        self.extra = stages.extra_s
        self.most = np.where(stages.max_layers >= 0, stages.max_layers, L)
        self.L = L
        self.starts = np.arange(L + 1)

    def reach(self, r: int, T: float) -> np.ndarray:
        """reach[a]: the largest b with layers [a, b) within stage r's time ``T`` and memory (b = a: none fit);
        non-decreasing in a (the costs are positive)."""
        C, B = self.C[r], self.B[r]
        bt = np.searchsorted(C, C + (T - self.extra[r]) * (1 + REL_EPS) + 1e-300, side="right") - 1
        bm = np.searchsorted(B, B + self.room[r] * (1 + REL_EPS) + 1e-300, side="right") - 1
        out = np.minimum(np.minimum(bt, bm), self.starts + self.most[r])
        return np.maximum(np.minimum(out, self.L), self.starts)

    def fits(self, T: float) -> bool:
        """Whether the stages can hold every layer in order, at least one each, within ``T`` (exact: the layer
        indices a stage can end at, propagated stage by stage; greedy packing is not exact with several kinds, as a
        slow stage may take only a light layer)."""
        L = self.L
        ends = np.zeros(L + 1, dtype=bool)
        ends[0] = True
        for r in range(len(self.extra)):
            rc = self.reach(r, T)
            starts = np.nonzero(ends)[0]
            diff = np.zeros(L + 2, dtype=int)
            np.add.at(diff, starts + 1, 1)
            np.add.at(diff, rc[starts] + 1, -1)
            ends = np.cumsum(diff)[:L + 1] > 0  # ends b with a < b <= reach[a] for a start a
            if not ends.any():
                return False
        return bool(ends[L])


def _mixed(stages: StageArrays, L: int, m: int, layer_kinds: list[int]) -> Split | None:
    p = len(stages)
    px = _Prefix(stages, L, layer_kinds)
    if px.room.min() < 0 or not px.fits(math.inf):
        return None
    C, extra = px.C, [float(x) for x in stages.extra_s]

    def solve(T: float) -> tuple[float, list[int]] | None:
        """Least sum of stage times with every stage <= T (None: infeasible), and the layers per stage."""
        best = [math.inf] * (L + 1)
        best[0] = 0.0
        choice: list[list[int]] = []
        for r in range(p):
            rc = px.reach(r, T).tolist()
            Cr = C[r].tolist()
            nxt, arg = [math.inf] * (L + 1), [-1] * (L + 1)
            g = [best[a] - Cr[a] for a in range(L + 1)]
            dq: deque[int] = deque()
            a_next = 0
            # b: end of stage r's range; valid starts a: a < b <= rc[a]; rc is non-decreasing, so valid starts for
            # increasing b form a window [a_lo(b), b - 1] whose both ends move right
            for b in range(1, L + 1):
                while a_next < b:
                    if best[a_next] < math.inf:
                        while dq and g[dq[-1]] > g[a_next]:
                            dq.pop()
                        dq.append(a_next)
                    a_next += 1
                while dq and rc[dq[0]] < b:
                    dq.popleft()
                if dq:
                    nxt[b] = g[dq[0]] + Cr[b] + extra[r]
                    arg[b] = dq[0]
            best = nxt
            choice.append(arg)
        if best[L] == math.inf:
            return None
        n, b = [0] * p, L
        for r in range(p - 1, -1, -1):
            a = choice[r][b]
            n[r], b = b - a, a
        return best[L], n

    def times(n: list[int]) -> list[float]:
        out, a = [], 0
        for r, k in enumerate(n):
            out.append(float(C[r][a + k] - C[r][a]) + extra[r])
            a += k
        return out

    s_inf = solve(math.inf)[0]
    # candidate thresholds: the stage times of the ranges each stage can hold (memory and layer caps)
    vals = []
    for r in range(p):
        D = C[r][None, :] - C[r][:, None] + extra[r]
        ok = (np.triu(np.ones((L + 1, L + 1), dtype=bool), 1)
              & (px.B[r][None, :] - px.B[r][:, None] <= px.room[r] * (1 + REL_EPS))
              & (px.starts[None, :] - px.starts[:, None] <= px.most[r]))
        vals.append(D[ok])
    values = np.unique(np.concatenate(vals))
    lo = bisect_left(range(len(values)), True, key=lambda i: px.fits(float(values[i])))
    best: Split | None = None
    for T in values[lo:]:
        T = float(T)
        if best is not None and (m - 1) * T + s_inf >= best.makespan_model_s * (1 - REL_EPS):
            break
        sol = solve(T)
        if sol is None:  # pragma: no cover - feasibility is monotone in T
            continue
        t = times(sol[1])
        if max(t) < T * (1 - REL_EPS):
            continue
        cand = _split(sol[1], t, m)
        if best is None or cand.makespan_model_s < best.makespan_model_s * (1 - REL_EPS):
            best = cand
    return best


def brute_force_split(stages: list[StageSpec], num_layers: int, m: int,
                      layer_kinds: list[int] | None = None) -> Split | None:
    """Every split, the least makespan model (the test oracle of ``best_split``; exponential, small cases only)."""
    p = len(stages)
    kinds = layer_kinds or [0] * num_layers
    best = None
    for cuts in product(range(1, num_layers), repeat=p - 1):
        if list(cuts) != sorted(set(cuts)) or len(set(cuts)) != p - 1:
            continue
        bounds = (0, *cuts, num_layers)
        t, ok = [], True
        for r in range(p):
            ks = kinds[bounds[r]:bounds[r + 1]]
            s = stages[r]
            if s.max_layers is not None and len(ks) > s.max_layers:
                ok = False
                break
            if s.mem_base + sum(s.mem_layer[k] for k in ks) > s.mem_limit * (1 + REL_EPS):
                ok = False
                break
            t.append(sum(s.layer_s[k] for k in ks) + s.extra_s)
        if not ok:
            continue
        cand = _split([bounds[r + 1] - bounds[r] for r in range(p)], t, m)
        if best is None or cand.makespan_model_s < best.makespan_model_s * (1 - REL_EPS):
            best = cand
    return best
