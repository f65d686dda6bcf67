"""Plan one job over pools of different GPUs (``cluster_specs.pools.MixedCluster``): which pools to use, in which
pipeline order, and how many layers each stage gets.

**What is searched** is what Megatron-LM runs on such a cluster (``cost_models.pools``):

* TP, CP, EP (and ETP) and DP are the same on every stage, so every pipeline replica spans the same pools; a stage
  is ``d = tp x cp x dp`` GPUs (``planner.space.structures`` at world ``d`` with pp 1: every divisibility, head,
  sequence and expert-grid rule of the homogeneous search);
* pools: every non-empty subset of the pools in every order (pipeline order = node-rank order). A used pool holds
  as many whole stages as it has GPUs for, ``floor(G_i / d)``, when a stage tiles its nodes (``d`` a multiple or a
  divisor of its GPUs per node); what is left of it stays idle and is reported. At most one stage per layer;
* per stage layer counts: any split (Megatron's ``--pipeline-model-parallel-layout``), chosen by
  ``planner.pool_split.best_split`` from each stage's speed (its pool's cost tables, ``planner.pool_costs``) and
  memory caps (in-flight micro-batches fall along the pipeline, the first stage holds the embedding, the last the
  output layer and logits);
* micro-batch size, sequence parallel, recompute (none, selective, full of every layer) and ZeRO 0 / 1 (Megatron's
  DDP and distributed optimizer), on the 1F1B schedule (interleaving alternates pools chunk by chunk: not modelled).

Single pools are also planned by the homogeneous search (``planner.search.run_search``, its whole space: vpp,
uneven first/last splits, ZeRO 2/3), so leaving a pool out is always among the answers and adding a slower pool
never lowers the best throughput.

**Exactness.** For each candidate (structure, pools in order, micro-batch, sp, recompute, ZeRO) the split is the one
that minimises the 1F1B makespan model (``pool_split``; exact over all contiguous splits with the memory caps).
Candidates are then evaluated by the full cost model (``cost_models.pools.estimate_pools``: simulated schedule, DP
and optimizer per pool, exact per-stage memory) in increasing order of a lower bound of their step time, first one
valid for every split (``_pre_bound``: the fluid balance of the layers at each pool's speed and the 1F1B fill) and
then the split's own (``pool_split.lower_bound_1f1b``), until the bound exceeds the K-th best step time found and
each subset of pools' best: the top K, and the best of each subset, are exactly the best candidates under the full
cost model, each with its makespan-optimal split. A stage whose exact memory exceeds its pool's capacity (a buffer
the tables leave out) gets its layer cap lowered by one and the candidate is split again (exact with one layer kind:
a stage's memory grows with its layer count; with dense and MoE layers mixed, a cap also rules out lighter layers on
that stage).
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from cluster_specs.pools import MixedCluster
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from cost_models.activations import in_flight_microbatches
from cost_models.pools import PoolsEstimate, estimate_pools
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM, check_config
from .launch_options import megatron_overlaps_dp
from .pool_costs import NUM_LAYER_KINDS, LayerTimes, StageMemoryFacts, layer_kinds, layer_times, stage_memory
from .pool_split import Split, StageArrays, best_split, lower_bound_1f1b, memory_fits
from .space import SearchSpace, Structure, micro_batch_options, sp_options, structures

#: ZeRO stages searched across pools: Megatron's DDP (0) and distributed optimizer (1).
POOL_ZERO_STAGES = (0, 1)
#: Most pools whose every order is tried (P! orders); beyond, the pools' own order only.
MAX_PERMUTED_POOLS = 5


@dataclass
class PoolPlan:
    """One plan on a mixed cluster: the configuration (``pipeline_layout`` holds the per-stage layers), the pool
    of every stage, its full estimate, violations of the independent checker (empty = feasible), where it came
    from (``pools search`` or ``homogeneous search``) and, for the pools search, the split's makespan model."""

    parallel: ParallelConfig
    stage_pool: list[int]
    estimate: PoolsEstimate
    violations: list[str] = field(default_factory=list)
    source: str = "pools search"
    split: Split | None = None

    @property
    def feasible(self) -> bool:
        return not self.violations

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.step.tokens_per_s

    @property
    def pools_used(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.stage_pool))


@dataclass
class SubsetResult:
    """The best plan using exactly the pools ``pools`` (indices, any order), or why there is none."""

    pools: tuple[int, ...]
    plan: PoolPlan | None
    reason: str | None = None


@dataclass
class PoolsSearchResult:
    plans: list[PoolPlan]
    subsets: list[SubsetResult]
    num_candidates: int
    num_split: int
    num_evaluated: int
    timings_s: dict[str, float] = field(default_factory=dict)


def layout_string(layers: list[int] | tuple[int, ...], mtp_layers: int = 0) -> str:
    """Megatron ``--pipeline-model-parallel-layout`` of one chunk per stage holding ``layers[r]`` decoder layers,
    the embedding first and the MTP layers and loss last; runs of equal middle chunks are written ``(t*9|)*5``
    (Megatron's grammar: ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` ``parse_str_to_list``).
    ``[7, 9, 9, 9, 6]`` -> ``Et*7|(t*9|)*3t*6L``."""
    p = len(layers)
    chunks = ["" if n == 0 else "t" if n == 1 else f"t*{n}" for n in layers]
    chunks[0] = "E" + chunks[0]
    chunks[-1] = chunks[-1] + "m" * mtp_layers + "L"
    parts, i = [chunks[0]], 1
    while i < p - 1:
        j = i
        while j + 1 < p - 1 and chunks[j + 1] == chunks[i]:
            j += 1
        parts.append(f"({chunks[i]}|)*{j - i + 1}" if j > i else chunks[i])
        i = j + 1
    if p > 1:
        parts.append(chunks[-1])
    text = parts[0]
    for prev, c in zip(parts, parts[1:]):
        text += c if prev.startswith("(") else "|" + c
    return text


# ------------------------------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class _Arr:
    """Pools in pipeline order and the stages each holds."""

    order: tuple[int, ...]
    stages: tuple[int, ...]

    @property
    def pp(self) -> int:
        return sum(self.stages)

    def stage_pool(self) -> list[int]:
        return [i for i, n in zip(self.order, self.stages) for _ in range(n)]


@dataclass(order=True)
class _Cand:
    pre_lb: float
    key: tuple
    st: Structure = field(compare=False)
    arr: _Arr = field(compare=False)
    mbs: int = field(compare=False)
    sp: bool = field(compare=False)
    rc: str = field(compare=False)
    zero: int = field(compare=False)
    caps: dict = field(default_factory=dict, compare=False)


class _Costs:
    """Cached cost tables per pool and knobs (``planner.pool_costs``), and each candidate's stage arrays."""

    def __init__(self, model: ModelSpec, mixed: MixedCluster, job: TrainingJob, limit: dict[int, float]):
        self.model, self.mixed, self.job, self.limit = model, mixed, job, limit
        self.kinds = tuple(layer_kinds(model))
        self._t: dict[tuple, LayerTimes] = {}
        self._m: dict[tuple, StageMemoryFacts] = {}
        self._f: dict[tuple, np.ndarray] = {}

    def par(self, st: Structure, mbs: int, sp: bool, rc: str, zero: int = 0, pp: int = 2) -> ParallelConfig:
        return ParallelConfig(tp=st.tp, pp=pp, dp=st.dp, cp=st.cp, ep=st.ep, etp=st.etp, micro_batch_size=mbs,
                              zero_stage=zero, sequence_parallel=sp, recompute=rc)

    def times(self, pool: int, st: Structure, mbs: int, sp: bool, rc: str) -> LayerTimes:
        k = (pool, st, mbs, sp, rc)
        if k not in self._t:
            self._t[k] = layer_times(self.model, self.mixed.pools[pool].cluster, self.job, self.par(st, mbs, sp, rc),
                                     kinds=self.kinds)
        return self._t[k]

    def memory(self, pool: int, st: Structure, mbs: int, sp: bool, rc: str, zero: int) -> StageMemoryFacts:
        k = (pool, st, mbs, sp, rc, zero)
        if k not in self._m:
            self._m[k] = stage_memory(self.model, self.mixed.pools[pool].cluster, self.job,
                                      self.par(st, mbs, sp, rc, zero), kinds=self.kinds)
        return self._m[k]

    def in_flight(self, pp: int, m: int) -> np.ndarray:
        """Micro-batches each of ``pp`` 1F1B stages holds (``cost_models.activations.in_flight_microbatches``)."""
        if (pp, m) not in self._f:
            par = ParallelConfig(pp=pp)
            self._f[pp, m] = np.array([in_flight_microbatches(par, r, m) for r in range(pp)], dtype=float)
        return self._f[pp, m]

    def forward_s(self, c: "_Cand", layers: tuple[int, ...]) -> list[float]:
        """Forward seconds of one micro-batch on each stage of ``c`` holding ``layers[r]`` decoder layers."""
        out, a, pp = [], 0, c.arr.pp
        for r, pool in enumerate(c.arr.stage_pool()):
            lt = self.times(pool, c.st, c.mbs, c.sp, c.rc)
            f = sum(lt.layer_f[k] for k in self.kinds[a:a + layers[r]])
            f += (lt.first_f if r == 0 else 0.0) + (lt.last_f if r == pp - 1 else 0.0)
            out.append(f)
            a += layers[r]
        return out

    def bound(self, c: "_Cand", split: Split, m: int) -> float:
        """A lower bound of the candidate's full step time with this split (``pool_split.lower_bound_1f1b``)."""
        return lower_bound_1f1b(split.stage_s, self.forward_s(c, split.layers), m)

    def arrays(self, c: "_Cand", m: int) -> StageArrays:
        """The candidate's stages for ``pool_split.best_split``: seconds and bytes per layer on each stage's pool."""
        pp = c.arr.pp
        f = self.in_flight(pp, m)
        layer_s, mem_layer = np.empty((pp, NUM_LAYER_KINDS)), np.empty((pp, NUM_LAYER_KINDS))
        extra, base, lim = np.zeros(pp), np.empty(pp), np.empty(pp)
        r0 = 0
        for pool, n in zip(c.arr.order, c.arr.stages):
            lt, mf = self.times(pool, c.st, c.mbs, c.sp, c.rc), self.memory(pool, c.st, c.mbs, c.sp, c.rc, c.zero)
            sl = slice(r0, r0 + n)
            layer_s[sl] = lt.layer_s
            mem_layer[sl] = np.asarray(mf.layer_states) + np.outer(f[sl], mf.layer_act)
            base[sl] = mf.reserve + mf.working
            lim[sl] = self.limit[pool]
            if r0 == 0:
                base[0] += mf.first_states + mf.first_act * f[0]
                extra[0] += lt.first_s
            if r0 + n == pp:
                base[-1] += mf.last_states + mf.last_act * f[-1] + mf.logits
                extra[-1] += lt.last_s
            r0 += n
        caps = np.full(pp, -1, dtype=int)
        for r, n in c.caps.items():
            caps[r] = n
        return StageArrays(layer_s, extra, base, mem_layer, lim, caps)


def _arrangements(mixed: MixedCluster, d: int, num_layers: int, usable: list[int],
                  orders: set[tuple[int, ...]] | None = None) -> list[_Arr]:
    """Every non-empty subset of the usable pools in every order (or only ``orders``), each pool holding
    floor(G_i / d) stages."""
    per = {}
    for i in usable:
        gpn = mixed.pools[i].cluster.node.gpus_per_node
        if d % gpn and gpn % d:
            continue
        n = mixed.pools[i].num_gpus // d
        if n >= 1:
            per[i] = n
    out = []
    pools = sorted(per)
    for k in range(1, len(pools) + 1):
        for sub in itertools.combinations(pools, k):
            perms = itertools.permutations(sub) if len(sub) <= MAX_PERMUTED_POOLS else [sub]
            for order in perms:
                if orders is not None and tuple(order) not in orders:
                    continue
                stages = tuple(per[i] for i in order)
                if sum(stages) <= num_layers:
                    out.append(_Arr(tuple(order), stages))
    return out


def _pre_bound(times: dict[int, LayerTimes], arr: _Arr, m: int, kind_counts: dict[int, int]) -> float:
    """A lower bound of the step time over every split (module docstring), from ``T``, a lower bound of the slowest
    stage's seconds, and ``S``, of the sum of the stage seconds: ``max(m T, S + c T)`` with ``c = m - 1 - max(pp - 1,
    m - 1) phi`` (``phi`` the largest forward share of a stage's seconds): ``pool_split.lower_bound_1f1b`` at the
    slowest stage is at least that.

    ``T``: the fluid balance of the layers over the stages at each pool's speed, and no stage below one layer; with
    layers of several kinds, in units of the most frequent kind ``k*``: a layer of kind ``k`` takes at least
    ``rho_k = min over pools of tau_k / tau_k*`` units, and stage ``r`` holds ``(T - e_r) / tau_{r,k*}`` units within
    ``T``, so ``T >= (sum_l rho_{k(l)} + sum_r e_r / tau_{r,k*}) / sum_r 1 / tau_{r,k*}``. ``S``: every layer at its
    fastest pool, plus the end stages' fixed seconds."""
    ref = max(kind_counts, key=lambda k: (kind_counts[k], -k))
    tau = {i: times[i].layer_s[ref] for i in arr.order}
    rho = {k: min(times[i].layer_s[k] / tau[i] for i in arr.order) for k in kind_counts}
    units = sum(rho[k] * n for k, n in kind_counts.items())
    first, last = arr.order[0], arr.order[-1]
    e_first, e_last = times[first].first_s, times[last].last_s
    speed = sum(n / tau[i] for i, n in zip(arr.order, arr.stages))
    t_fluid = (units + e_first / tau[first] + e_last / tau[last]) / speed
    one = {i: min(times[i].layer_s[k] for k in kind_counts) for i in arr.order}
    if arr.pp == 1:
        least = one[first] + e_first + e_last
    else:
        least = max(max(one.values()), one[first] + e_first, one[last] + e_last)
    T = max(t_fluid, least)
    S = sum(n * min(times[i].layer_s[k] for i in arr.order) for k, n in kind_counts.items()) + e_first + e_last
    phi = max(times[i].forward_share for i in arr.order)
    c = m - 1 - max(arr.pp - 1, m - 1) * phi
    return max(m * T, S + max(0.0, c) * T)


def _config(model: ModelSpec, c: _Cand, split: Split) -> ParallelConfig:
    return ParallelConfig(tp=c.st.tp, pp=c.arr.pp, dp=c.st.dp, cp=c.st.cp, ep=c.st.ep, etp=c.st.etp,
                          micro_batch_size=c.mbs, zero_stage=c.zero, sequence_parallel=c.sp, recompute=c.rc,
                          pipeline_layout=layout_string(split.layers, model.num_mtp_layers))


def _violations(model: ModelSpec, mixed: MixedCluster, job: TrainingJob, par: ParallelConfig, stage_pool: list[int],
                est: PoolsEstimate, headroom: float) -> list[str]:
    """The independent checker (``planner.checks``) on every used pool's cluster, and each stage's memory against
    its pool's capacity."""
    out: list[str] = []
    for i in dict.fromkeys(stage_pool):
        for v in check_config(model, mixed.pools[i].cluster, job, par, par.world_size, framework="megatron"):
            msg = f"{mixed.pools[i].name}: {v.message}"
            if msg not in out:
                out.append(msg)
    for r, sl in enumerate(est.slack_bytes(headroom)):
        if sl < 0:
            s = est.stages[r]
            out.append(f"memory: stage {r} on {mixed.pools[stage_pool[r]].name} needs {s.total / 2**30:.1f} GiB > "
                       f"{est.capacity_bytes[r] * (1 - headroom) / 2**30:.1f} GiB usable by {-sl / 2**30:.1f} GiB")
    return out


def _key(p: PoolPlan) -> tuple:
    q = p.parallel
    return (-round(p.tokens_per_s, 6), q.tp, q.pp, q.cp, q.ep, -q.micro_batch_size, q.zero_stage,
            ("none", "selective", "full").index(q.recompute), not q.sequence_parallel, q.dp, tuple(p.stage_pool),
            q.pipeline_layout or "", p.source)


def search_pools(model: ModelSpec, mixed: MixedCluster, job: TrainingJob, top_k: int = 5,
                 space: SearchSpace = SearchSpace(), memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                 convention: FlopsConvention = "megatron", homogeneous: bool = True,
                 orders: list[tuple[int, ...]] | None = None, at_risk_margin: float | None = None) -> PoolsSearchResult:
    """The best ``top_k`` plans over the pools of ``mixed`` and the best plan of every subset of pools (module
    docstring). ``homogeneous``: also plan each single pool with the homogeneous search (its whole space).
    ``orders``: only these pipeline orders of pools (tuples of pool indices; default every subset in every order).
    ``at_risk_margin``: passed to the homogeneous search (plans clearing it rank first, as in ``plan``)."""
    t0 = time.perf_counter()
    tm: dict[str, float] = {}
    L = model.num_layers
    kinds_l = layer_kinds(model)
    kind_counts = {k: kinds_l.count(k) for k in set(kinds_l)}
    usable = [i for i, p in enumerate(mixed.pools) if job.precision in p.cluster.supported_precisions]
    limit = {i: p.cluster.gpu.memory_bytes * (1 - memory_headroom) for i, p in enumerate(mixed.pools)}
    costs = _Costs(model, mixed, job, limit)
    all_kinds = kinds_l  # best_split takes the one-kind fast path itself (kind 1 for all-MoE stacks)
    widest = max(mixed.pools, key=lambda p: p.cluster.node.nvlink_domain_size).cluster
    zeros = tuple(z for z in space.zero_stage if z in POOL_ZERO_STAGES)
    sp1 = SearchSpace(tp=space.tp, pp=(1,), cp=space.cp, ep=space.ep, micro_batch_size=space.micro_batch_size,
                      zero_stage=zeros, recompute=space.recompute, sequence_parallel=space.sequence_parallel)
    cands: list[_Cand] = []
    # per (structure, arrangement) and recompute: the knobs with the least memory (smallest micro-batch, SP on, the
    # highest ZeRO stage); if none of these fits, no sibling does (full recompute's doubled working set can exceed
    # no recompute on a one-layer stage, so every recompute choice is tried)
    least: dict[tuple, list[_Cand]] = {}
    max_d = max((mixed.pools[i].num_gpus for i in usable), default=0)
    for d in range(1, max_d + 1):
        arrs = _arrangements(mixed, d, L, usable, None if orders is None else {tuple(o) for o in orders})
        if not arrs:
            continue
        for st in structures(model, widest, job, d, sp1, "megatron"):
            mbss = micro_batch_options(st, job, sp1)
            sps = sp_options(st, job, "megatron", sp1, model.moe is not None)
            fit = [arr for arr in arrs if st.tp <= min(mixed.pools[i].cluster.node.nvlink_domain_size
                                                       for i in arr.order)]
            if not fit:
                continue
            pools_in = sorted({i for arr in fit for i in arr.order})
            z_least = max((z for z in zeros if z == 0 or st.dp * st.cp > 1), default=None)
            if mbss and sps and z_least is not None:
                for arr in fit:
                    least[st, arr] = [_Cand(0.0, (), st, arr, min(mbss), max(sps), rc, z_least)
                                      for rc in space.recompute]
            for mbs, sp, rc in itertools.product(mbss, sps, space.recompute):
                m = job.global_batch_size // (mbs * st.dp)
                times = {i: costs.times(i, st, mbs, sp, rc) for i in pools_in}
                for arr in fit:
                    pre = _pre_bound(times, arr, m, kind_counts)
                    for z in zeros:
                        if z >= 1 and st.dp * st.cp == 1:
                            continue
                        key = (st.tp, arr.pp, st.cp, st.ep, -mbs, z, ("none", "selective", "full").index(rc),
                               not sp, st.dp, arr.order)
                        cands.append(_Cand(pre, key, st, arr, mbs, sp, rc, z))
    cands.sort(key=lambda c: (c.pre_lb, c.key))
    tm["candidates"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    found: list[PoolPlan] = []
    best_by_subset: dict[tuple[int, ...], PoolPlan] = {}
    heap: list[tuple[float, tuple, int, _Cand, Split]] = []
    seq = itertools.count()
    group_fits: dict[tuple, bool] = {}
    n_split = n_eval = 0
    i = 0

    def kth() -> float:
        return found[top_k - 1].estimate.step.step_s if len(found) >= top_k else math.inf

    def subset_open(c: _Cand, bound: float) -> bool:
        """A candidate is still needed while it may enter the top K or beat its subset's best."""
        sub = tuple(sorted(c.arr.order))
        b = best_by_subset.get(sub)
        return bound <= kth() or b is None or bound <= b.estimate.step.step_s

    while True:
        nxt = cands[i].pre_lb if i < len(cands) else math.inf
        if heap and heap[0][0] <= nxt:
            lb, _, _, c, split = heapq.heappop(heap)
            if not subset_open(c, lb):
                continue
            m = job.global_batch_size // (c.mbs * c.st.dp)
            par = _config(model, c, split)
            n_eval += 1
            est = estimate_pools(model, mixed, job, par, c.arr.stage_pool(), convention,
                                 megatron_overlaps_dp(par.dp, par.cp))
            if not est.fits(memory_headroom):
                # a term the tables leave out binds: cap the overfull stages below their layer count, split again
                caps = dict(c.caps)
                for r, sl in enumerate(est.slack_bytes(memory_headroom)):
                    if sl < 0:
                        caps[r] = split.layers[r] - 1
                c2 = _Cand(c.pre_lb, c.key, c.st, c.arr, c.mbs, c.sp, c.rc, c.zero, caps)
                n_split += 1
                s2 = best_split(costs.arrays(c2, m), L, m, all_kinds)
                if s2 is not None:
                    heapq.heappush(heap, (costs.bound(c2, s2, m), c2.key, next(seq), c2, s2))
                continue
            plan = PoolPlan(par, c.arr.stage_pool(), est,
                            _violations(model, mixed, job, par, c.arr.stage_pool(), est, memory_headroom),
                            split=split)
            if plan.violations:  # pragma: no cover - the search's rules are the checker's
                continue
            found.append(plan)
            found.sort(key=_key)
            sub = tuple(sorted(c.arr.order))
            if sub not in best_by_subset or _key(plan) < _key(best_by_subset[sub]):
                best_by_subset[sub] = plan
            continue
        if i >= len(cands):
            break
        c = cands[i]
        i += 1
        if not subset_open(c, c.pre_lb):
            continue
        g = (c.st, c.arr)
        if g not in group_fits:
            group_fits[g] = any(memory_fits(costs.arrays(lc, job.global_batch_size // (lc.mbs * lc.st.dp)), L,
                                            all_kinds) for lc in least[g])
        if not group_fits[g]:
            continue
        m = job.global_batch_size // (c.mbs * c.st.dp)
        n_split += 1
        split = best_split(costs.arrays(c, m), L, m, all_kinds)
        if split is not None:
            heapq.heappush(heap, (costs.bound(c, split, m), c.key, next(seq), c, split))
    tm["search"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    if homogeneous:
        for idx in (i for i in usable if orders is None or (i,) in orders):
            plan = _homogeneous(model, mixed, job, idx, space, memory_headroom, convention, at_risk_margin)
            if plan is None:
                continue
            found.append(plan)
            sub = (idx,)
            if sub not in best_by_subset or _key(plan) < _key(best_by_subset[sub]):
                best_by_subset[sub] = plan
        tm["homogeneous"] = time.perf_counter() - t2
    found = _distinct(sorted(found, key=_key))
    subsets = []
    for k in range(1, len(mixed.pools) + 1):
        for sub in itertools.combinations(range(len(mixed.pools)), k):
            plan = best_by_subset.get(sub)
            reason = None
            if plan is None:
                missing = [mixed.pools[j].name for j in sub if j not in usable]
                reason = (f"{', '.join(missing)}: no {job.precision} rate" if missing else
                          "not searched (orders)" if orders is not None and not any(set(o) == set(sub) for o in orders)
                          else "no configuration fits (memory, or no stage size that tiles every pool's nodes)")
            subsets.append(SubsetResult(sub, plan, reason))
    subsets.sort(key=lambda s: (s.plan is None, _key(s.plan) if s.plan else (), s.pools))
    tm["total"] = time.perf_counter() - t0
    return PoolsSearchResult(found[:top_k], subsets, len(cands), n_split, n_eval, tm)


def _distinct(plans: list[PoolPlan]) -> list[PoolPlan]:
    """``plans`` (ranked) without repeats: the homogeneous search and the pools search can both reach one layout on
    one pool (one written as first/last-stage layer counts, the other as a layout string); the first kept."""
    seen, out = set(), []
    for p in plans:
        q = p.parallel
        key = (q.tp, q.pp, q.dp, q.cp, q.ep, q.expert_tp, q.vpp, q.micro_batch_size, q.zero_stage,
               q.sequence_parallel, q.recompute, q.recompute_num_layers, tuple(p.stage_pool),
               float(f"{p.estimate.step.step_s:.9g}"))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _homogeneous(model: ModelSpec, mixed: MixedCluster, job: TrainingJob, idx: int, space: SearchSpace,
                 headroom: float, convention: FlopsConvention, at_risk_margin: float | None) -> PoolPlan | None:
    """The homogeneous search's best plan on pool ``idx`` alone, as a ``PoolPlan``."""
    from .search import run_search
    pool = mixed.pools[idx]
    res = run_search(model, pool.cluster, job, pool.num_gpus, 1, space, headroom, "megatron", convention=convention,
                     at_risk_margin=at_risk_margin)
    if not res.plans:
        return None
    par = res.plans[0].parallel
    est = estimate_pools(model, mixed, job, par, [idx] * par.pp, convention, megatron_overlaps_dp(par.dp, par.cp))
    return PoolPlan(par, [idx] * par.pp, est, _violations(model, mixed, job, par, [idx] * par.pp, est, headroom),
                    source="homogeneous search")
