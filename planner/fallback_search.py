"""Fallback plans after losing nodes: for each count of lost nodes, the best plan that keeps the checkpoint's
layout and the best plan of any layout (``planner.fallback`` is the API and the document).

**keep_layout** keeps TP, PP, CP, EP, ETP, VPP, the stage layout, the micro-batch size, recompute and the ZeRO stage
(so the checkpoint's tensors load as saved); only DP changes, and with it the micro-batches per replica at the same
global batch and the ZeRO shards. Every data-parallel size that fits the healthy GPUs is evaluated by the full cost
model (``planner.evaluation.evaluate``: memory, step time and the independent checker; with fewer replicas the ZeRO
shards grow, so a smaller DP can run out of memory): the answer is exact. The layout needs at least
``pp x max(tp x cp, ep x etp)`` GPUs (Megatron's dense and expert grids both tile the world; Megatron-Bridge PR
#3509); below that it cannot run at all, the limitation Oobleck (SOSP'23) reports when no pipeline template fits.

**best** is ``plan``'s whole search (``planner.search.run_search``: every structure, micro-batch, vpp, ZeRO stage,
recompute and split) on at most the healthy GPUs, any world size ``W <= G'`` (the GPUs beyond ``W`` idle). Which
world sizes can win is what makes this fast:

* ``W = tp x pp x cp x dp`` with ``dp`` dividing the global batch (``GBS % (mbs x dp) == 0``). With a power-of-two
  global batch, TP and CP, a world that is not a power of two needs a pipeline size with an odd factor, and then
  the micro-batch count ``GBS / (mbs x dp)`` (a power of two) is not a multiple of pp: no interleaving (Megatron
  requires ``m % pp == 0``) and the 1F1B bubble ``(pp - 1) / m`` stays. Losing one node of 16,384 H100s leaves
  the choice between half the GPUs with the original interleaved layout and ~94% of them with an odd pp.
* Every candidate world size gets a lower bound of the step time of each structure (tp, pp, cp, dp) that forms it:
  the fastest forward + backward of a layer at that (tp, cp, micro-batch) (``planner.pool_costs.layer_times``, the
  step model's own per-layer terms): the busiest rank's ``m`` forwards and backwards of the ``ceil(L / pp)``
  layers every split puts on some stage (``planner.space.stage_splits``: the search tries several splits per pp;
  with pp 1, of all layers and the embedding and output layer), over every micro-batch dividing the per-replica
  batch. Memory, DP traffic, the bubble, recompute and the optimizer only add to it. World sizes are taken in increasing order of their bound and solved exactly (``run_search``,
  restricted to the (tp, pp, cp) whose bound is below the best step found so far for a count of lost nodes the
  world size fits); one whose every structure is slower than the best plans found for all the counts it fits is
  skipped. So the answer is the exact best of ``plan``'s space over all ``W <= G'`` (``tests/test_fallback.py``
  checks it against planning every world size). The bound's world sizes are a superset of what
  ``planner.space.structures`` accepts (tp by the head count and NVLink domain, pp by the layer splits, cp by the
  sequence, dp by the global batch); it assumes the schedules ``plan`` ranks (1F1B, interleaved).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from cluster_specs.spec import ClusterSpec
from cost_models.config import FlopsConvention, ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .evaluation import Evaluation, evaluate
from .pool_costs import layer_kinds, layer_times
from .space import SearchSpace, divisors, stage_splits


def min_gpus(par: ParallelConfig) -> int:
    """Fewest GPUs a layout runs on: ``pp x max(tp x cp, ep x etp)`` (dense and expert grids, Megatron-Bridge PR
    #3509; with EP carved out of DP x CP x TP the larger grid sets the step, the smaller must divide it)."""
    return par.pp * max(par.tp * par.cp, par.ep * par.expert_tp)


def keep_layout(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, max_gpus: int,
                headroom: float, framework: str, convention: FlopsConvention,
                cache: dict[int, Evaluation] | None = None) -> tuple[Evaluation | None, str | None]:
    """The best feasible evaluation of ``par`` with only ``dp`` changed, on at most ``max_gpus`` GPUs (module
    docstring), or None and the reason. ``cache``: evaluations by dp, shared across calls."""
    cache = {} if cache is None else cache
    mp = par.tp * par.pp * par.cp
    lo = min_gpus(par)
    if max_gpus < lo:
        return None, (f"the layout needs at least pp x max(tp x cp, ep x etp) = {par.pp} x max({par.tp * par.cp}, "
                      f"{par.ep * par.expert_tp}) = {lo} GPUs, {max_gpus} are left")
    best: Evaluation | None = None
    why = None
    for dp in range(max_gpus // mp, 0, -1):
        if job.global_batch_size % (par.micro_batch_size * dp):
            continue
        if dp not in cache:
            cache[dp] = evaluate(model, cluster, job, par.model_copy(update={"dp": dp}), mp * dp, headroom, framework,
                                 convention)
        ev = cache[dp]
        if ev.feasible and (best is None or ev.step.tokens_per_s > best.step.tokens_per_s):
            best = ev
        elif not ev.feasible and why is None:
            why = f"dp {dp}: " + "; ".join(v.message for v in ev.violations)
    if best is None:
        return None, why or (f"no data-parallel size divides the global batch {job.global_batch_size} over "
                             f"micro-batches of {par.micro_batch_size} within {max_gpus} GPUs")
    return best, None


@dataclass
class BestResult:
    """``best_fallbacks``' answer: the best evaluation for each healthy-GPU count (None: nothing fits), and how the
    search went (world sizes bounded, solved, seconds)."""

    best: dict[int, Evaluation | None]
    num_worlds: int
    solved: list[int] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)


def _world_bounds(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, max_gpus: int, space: SearchSpace,
                  framework: str) -> dict[int, list[tuple[float, tuple[int, int, int]]]]:
    """World size -> [(step-time lower bound, (tp, pp, cp))] over the structures that could form it (module
    docstring)."""
    L, s, gbs = model.num_layers, job.seq_length, job.global_batch_size
    dom, gpn = cluster.node.nvlink_domain_size, cluster.node.gpus_per_node
    a = model.num_attention_heads
    tps = [t for t in range(1, dom + 1) if a % t == 0 and (space.tp is None or t in space.tp)]
    cps = [c for c in divisors(s) if (c == 1 or s % (2 * c) == 0) and (space.cp is None or c in space.cp)]
    pps = [p for p in range(1, L + 1) if stage_splits(L, p) and (space.pp is None or p in space.pp)]
    dps = divisors(gbs)
    kinds = layer_kinds(model)
    moe = model.moe is not None
    per_layer: dict[tuple, tuple[float, float, float]] = {}

    def costs(tp: int, cp: int, mbs: int) -> tuple[float, float, float]:
        """Fastest forward + backward seconds of one layer of one micro-batch (sp on or off; for MoE, any ep), and
        of the first stage's embedding and the last stage's output layer and loss."""
        key = (tp, cp, mbs)
        if key not in per_layer:
            best = (math.inf, math.inf, math.inf)
            eps = [e for e in divisors(model.moe.num_experts)] if moe else [1]
            for sp in ([False, True] if tp > 1 and (s // cp) % tp == 0 else [False]):
                for ep in eps:
                    par = ParallelConfig(tp=tp, pp=2, cp=cp, dp=ep, ep=ep, micro_batch_size=mbs,
                                         sequence_parallel=sp or (moe and tp > 1 and ep > 1))
                    lt = layer_times(model, cluster, job, par, framework, kinds)
                    best = tuple(min(x, y) for x, y in zip(best, (min(lt.layer_s[k] for k in set(kinds)),
                                                                 lt.first_s, lt.last_s)))
            per_layer[key] = best
        return per_layer[key]

    out: dict[int, list[tuple[float, tuple[int, int, int]]]] = {}
    for pp in pps:
        busiest = -(-L // pp)  # every layer split of pp stages (planner.space.stage_splits) puts this many on one
        for tp in tps:
            for cp in cps:
                mp = tp * pp * cp
                for dp in dps:
                    w = mp * dp
                    if w > max_gpus:
                        break
                    if w % gpn and gpn % w:
                        continue
                    lb = math.inf
                    for mbs in space.micro_batch_size or divisors(gbs // dp):
                        if gbs % (mbs * dp):
                            continue
                        m = gbs // (mbs * dp)
                        t, e_first, e_last = costs(tp, cp, mbs)
                        if pp == 1:
                            bound = m * (L * t + e_first + e_last)
                        else:  # the busiest rank runs m forwards and backwards of its layers, whatever the split
                            bound = m * busiest * t
                        lb = min(lb, bound)
                    if lb < math.inf:
                        out.setdefault(w, []).append((lb, (tp, pp, cp)))
    return out


def best_fallbacks(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, gpu_counts: list[int],
                   space: SearchSpace, headroom: float, framework: str, convention: FlopsConvention,
                   known: dict[int, Evaluation] | None = None, at_risk_margin: float | None = None) -> BestResult:
    """The exact best plan of ``plan``'s space on at most ``g`` GPUs for every ``g`` in ``gpu_counts`` (module
    docstring). ``known``: a feasible plan per count (e.g. keep_layout's), used only as a starting bound.
    ``at_risk_margin``: each world size's plan is ``plan``'s first (plans clearing the margin rank first)."""
    from .search import run_search
    t0 = time.perf_counter()
    tm: dict[str, float] = {}
    counts = sorted(set(gpu_counts), reverse=True)
    bounds = _world_bounds(model, cluster, job, counts[0], space, framework)
    tm["bounds"] = time.perf_counter() - t0
    # world sizes by their best (smallest) step bound
    order = sorted(bounds, key=lambda w: (min(lb for lb, _ in bounds[w]), -w))
    best: dict[int, Evaluation | None] = {g: None for g in counts}
    floor = {g: (known or {}).get(g) for g in counts}  # best known step per count (feasible plans)

    def threshold(w: int) -> float:
        """Largest best-known step time among the counts this world fits: a structure slower than that cannot win
        any of them."""
        ts = []
        for g in counts:
            if w > g:
                continue
            known_steps = [e.step.step_s for e in (best[g], floor[g]) if e is not None]
            ts.append(min(known_steps, default=math.inf))
        return max(ts, default=-math.inf)

    solved = []
    for w in order:
        thr = threshold(w)
        open_ = [shape for lb, shape in bounds[w] if lb <= thr * (1 + 1e-9)]
        if not open_:
            continue
        tps, pps, cps = (tuple(sorted({x[i] for x in open_})) for i in range(3))
        sp = replace(space, tp=tps, pp=pps, cp=cps)
        res = run_search(model, cluster, job, w, 1, sp, headroom, framework, convention=convention,
                         at_risk_margin=at_risk_margin)
        solved.append(w)
        if not res.plans:
            continue
        ev = res.plans[0]
        for g in counts:
            if w <= g and (best[g] is None or ev.step.tokens_per_s > best[g].step.tokens_per_s):
                best[g] = ev
    tm["solve"] = time.perf_counter() - t0 - tm["bounds"]
    return BestResult(best, len(bounds), solved, tm)
