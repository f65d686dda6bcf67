"""The per-cell terms of the solver's lower bounds, shared by the tables (``planner.tables``) and the two group
bounds of the branch and bound (``busiest_rank_bounds`` <= ``group_bound`` <= the tight bound of every cell of the
group; ``planner.solver``). tests/test_tables_bounds.py checks them against the scalar model.
"""
from __future__ import annotations

import math

from cost_models.config import BYTES_16BIT
from cost_models.memory import TOKEN_ID_BYTES
from cost_models.pipeline import PAIRING_SCHEDULES

from .bound_facts import (ZEROS, BoundContext, MicroBatchFacts, StructureFacts, ce_seconds, decoder_sync_facts,
                          end_extras, in_flight, layer_costs, microbatch_facts, p2p_seconds, rank_runs, round_trips, stm,
                          with_comm, with_memory_facts)
from .space import schedule_options, vpp_options


def z_bound(sf: StructureFacts, m: int, z: int, f0: float, b0: float) -> float:
    """The ``Z`` table's value: the DP / ZeRO-3 terms that the smallest per-rank forward f0 and backward b0
    (seconds per micro-batch) cannot hide (``dp_table``). An overlapped collective of ``x`` seconds under a pass of
    ``c`` takes c + ``data_parallel.overlapped_exposed_s(x, c)`` = max(c, x) + OVERLAP_COMPUTE_SLOWDOWN min(c, x),
    non-decreasing in c, so its value at f0 / b0 bounds the pass + its exposure (``_under``). Megatron-FSDP ZeRO-2
    (``sf.rs_every_microbatch``) reduces in every micro-batch (``o_bound``'s per-micro-batch term) and overlaps only
    the weight gather with the first forward: step >= m (f + b) + overlapped_exposed_s(ag, f)."""
    zc = 1 if z else 0
    if z < 3 and not sf.dp_full and sf.shard * sf.edp > 1:
        if z == 2 and sf.rs_every_microbatch:
            return (m - 1) * (f0 + b0) + b0 + _under(sf.ag_t[zc], f0)
        return (m - 1) * (f0 + b0) + _under(sf.ag_t[zc], f0) + _under(sf.rs_t[zc], b0)
    if z >= 3 and (sf.shard > 1 or sf.edp > 1):
        return m * (max(f0, sf.ag3) + max(b0, sf.ag3 + sf.rs3))
    return 0.0


def _under(comm_s: float, compute_s: float) -> float:
    """Seconds of a pass of ``compute_s`` with a collective of ``comm_s`` overlapped under it
    (``compute_s + data_parallel.overlapped_exposed_s(comm_s, compute_s)``)."""
    if comm_s <= 0:
        return compute_s
    return max(compute_s, comm_s) + stm.OVERLAP_COMPUTE_SLOWDOWN * min(compute_s, comm_s)


def d_bound(sf: StructureFacts, m: int, z: int) -> float:
    """The ``D`` table's value: DP / ZeRO-3 time the step model adds to the pipeline in any case (seconds).

    * ZeRO-3 / FSDP: every forward and backward pass of every micro-batch exposes at least its first layer's
      all-gather, and the last backward its last layer's reduce-scatter (``step_time.fsdp_exposed_s`` >= (gather +
      reduce) / layers, with at most ``n_hi`` layers on the busiest rank): (2 m ag + rs) / n_hi.
    * An overlapped reduction / gather (ZeRO 0-2, ``overlapped_dp_s``) exposes
      ``data_parallel.overlapped_exposed_s(x, c)`` = max(0, x - c) + OVERLAP_COMPUTE_SLOWDOWN min(x, c) >=
      OVERLAP_COMPUTE_SLOWDOWN x for any compute c (the slowdown is below 1)."""
    if z < 3:
        return stm.OVERLAP_COMPUTE_SLOWDOWN * overlapped_dp_s(sf, z)
    if sf.shard == 1:
        return 0.0
    return (2 * m * sf.ag3 + sf.rs3) / sf.n_hi


def overlapped_dp_s(sf: StructureFacts, z: int) -> float:
    """Seconds of the ZeRO 0-2 reduction and gather that the launch overlaps with the compute (0 where they are
    fully exposed, in ``o_bound``, or absent); Megatron-FSDP ZeRO-2's per-micro-batch reduction is in ``o_bound``,
    so only its gather."""
    if z >= 3 or sf.dp_full or sf.shard * sf.edp == 1:
        return 0.0
    zc = 1 if z else 0
    return sf.ag_t[zc] + (0.0 if z == 2 and sf.rs_every_microbatch else sf.rs_t[zc])


def makespan_share(m: int) -> float:
    """kappa(m) = 1 - (1 - OVERLAP_COMPUTE_SLOWDOWN) / m: the step is at least kappa x the makespan + the
    overlapped DP collectives (``overlapped_dp_s``) + ``o_bound``. An overlapped collective of x seconds under the
    busiest rank's pass of c exposes ``overlapped_exposed_s(x, c)`` >= x - (1 - OVERLAP_COMPUTE_SLOWDOWN) c, and
    that rank's forward + backward of one micro-batch (the c of the gather and of the reduction) is at most the
    makespan / m, since the rank runs all m of them one after the other in the default schedules (1F1B,
    interleaved). This keeps the bound tight where the pipeline's sends and bubble, not the compute under the
    collectives, make the step long (``Z`` bounds compute + exposure, which then falls far short)."""
    return 1.0 - (1.0 - stm.OVERLAP_COMPUTE_SLOWDOWN) / max(1, m)


def default_schedule_bound(sf: StructureFacts, m: int, z: int, p: float, f0: float, b0: float) -> float:
    """The default schedule's ``max(P + D, Z, kappa P + F)`` (seconds, before ``O``): ``p`` a lower bound of the
    pipeline makespan, f0 / b0 of every rank's forward / backward per micro-batch (``d_bound``, ``z_bound``,
    ``makespan_share``, ``overlapped_dp_s``)."""
    return max(p + d_bound(sf, m, z), z_bound(sf, m, z, f0, b0), makespan_share(m) * p + overlapped_dp_s(sf, z))


def o_bound(ctx: BoundContext, sf: StructureFacts, m: int, z: int) -> float:
    """The ``O`` table's value: the optimizer step plus the fully exposed DP terms (``dp_table``)."""
    a, c = sf.o_coef[z]
    return a + m * c


def stored_bytes(ctx: BoundContext, mb: MicroBatchFacts, sp: bool, rc: str, stage: int, nd: int, nm: int,
                 pp: int) -> float:
    """Stored activation bytes of one micro-batch on a stage with nd dense and nm MoE layers (token ids on the
    first stage, the MTP layers on the last: ``memory.estimate_memory``); full recompute keeps only each layer's
    input (the least of any recompute_num_layers)."""
    per_t, lin = mb.acts[(sp, rc)]
    if stage == pp - 1 and ctx.n_mtp:
        nd, nm = (nd, nm + ctx.n_mtp) if ctx.last_type else (nd + ctx.n_mtp, nm)
    stored = lin * (nd + nm) if rc == "full" else nd * per_t.get(0, 0.0) + nm * per_t.get(1, 0.0)
    return stored + (TOKEN_ID_BYTES * mb.tok if stage == 0 else 0.0)


def working_bytes(ctx: BoundContext, mb: MicroBatchFacts, sp: bool, rc: str, stage: int, nd: int, nm: int,
                  pp: int) -> float:
    """The running layer's working set (bytes): the largest layer's activations, twice under full recompute (the
    recomputed layer and the gradients of its activations: ``memory.estimate_memory``)."""
    per_t, _ = mb.acts[(sp, rc)]
    if stage == pp - 1 and ctx.n_mtp:
        nd, nm = (nd, nm + ctx.n_mtp) if ctx.last_type else (nd + ctx.n_mtp, nm)
    big = max([per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t], default=0.0)
    return 2 * big if rc == "full" else big


def min_recomputed_layers(ctx: BoundContext, sf: StructureFacts, mb: MicroBatchFacts, rc: str, sp: bool, v: int) -> int:
    """A lower bound of N, the recomputed layers per model chunk (Megatron ``--recompute-num-layers``, the same
    for every chunk of every stage) of a full-recompute candidate at vpp ``v`` that fits: on every slot the
    memory lower bound ``w + (lin n + (L - n) a_min + token ids) x in-flight + 2 x largest layer`` must fit the
    limit, which needs n >= need recomputed layers of the stage (L its layers, MTP included on the last stage),
    and a stage of v chunks recomputes at most v N, so N >= ceil(need / v). 1 when the framework recomputes every
    layer or no headroom is given."""
    if rc != "full" or not ctx.partial_rc or ctx.mem_lim is None:
        return 1
    per_t, lin = mb.acts[(sp, rc)]
    pp = sf.st.pp
    need = 1
    for j, (stage, nd, nm, rg) in enumerate(sf.lay.groups):
        if stage == pp - 1 and ctx.n_mtp:
            nd, nm = (nd, nm + ctx.n_mtp) if ctx.last_type else (nd + ctx.n_mtp, nm)
        present = [per_t[t] for t, c in ((0, nd), (1, nm)) if c and t in per_t]
        if not present:
            continue
        a_min, big = min(present), max(present)
        n_l = nd + nm
        w = min(sf.states[j][z] for z in sf.zs) + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0)
        infl = mb.inflight[v][j] if v in mb.inflight else in_flight(ctx, pp, v, stage, mb.m)
        tid = TOKEN_ID_BYTES * mb.tok if stage == 0 else 0.0
        over = w + (n_l * a_min + tid) * infl + 2 * big - ctx.mem_lim
        if over <= 0 or a_min <= lin or infl <= 0:
            continue
        need = max(need, min(n_l, math.ceil(over / ((a_min - lin) * infl) - 1e-9)))
    return max(1, -(-need // v))


def rank_fb(ctx: BoundContext, mb: MicroBatchFacts, rc: str, sp: bool, nlb: int):
    """``fb(nd, nm, nch=1)``: lower bounds of the forward and backward seconds per micro-batch of nd dense and nm
    MoE layers in ``nch`` model chunks under recompute ``rc``. Full recompute with a derivable N
    (planner.recompute) re-runs at least min(nlb, chunk layers) layers per chunk (``nlb`` a lower bound of N,
    chunks of at least floor(layers / nch)), every layer otherwise."""
    lt = mb.lay[sp]
    memo: dict[tuple, tuple[float, float]] = {}
    partial = ctx.partial_rc

    def fb(nd: int, nm: int, nch: int = 1) -> tuple[float, float]:
        key = (nd, nm, nch)
        if key not in memo:
            f = b = 0.0
            full_min = math.inf
            for t, n in ((0, nd), (1, nm)):
                if n and t in lt:
                    lf, lb, sel, full = lt[t][:4]
                    f += n * lf
                    b += n * (lb + (sel if rc == "selective" else full if rc == "full" and not partial else 0.0))
                    full_min = min(full_min, full)
            if rc == "full" and partial and full_min < math.inf:
                b += nch * min(nlb, (nd + nm) // nch) * full_min
            memo[key] = (f, b)
        return memo[key]
    fb.lay, fb.sp = lt, sp
    return fb


def pipeline_bound(ctx: BoundContext, sf: StructureFacts, mb: MicroBatchFacts, fb, v: int,
                   minima: list | None = None, hidden=None) -> float:
    """``P`` at vpp ``v``: max over ranks r of (the first micro-batch's forward + backward through the ranks before
    r, first chunk only, each hop paying its point-to-point send in and out, ``bound_facts.p2p_seconds``) + m x (r's
    forward + backward), and at least m' / K round trips of a micro-batch through every rank (at most K in flight on
    rank 0, ``bound_facts.round_trips``), which binds when the sends between stages are slow. Ranks come in runs of
    equal (stage signature, first-chunk mix), along which the bound grows, so each run's last rank is its maximum.
    ``minima`` collects the smallest per-rank (forward, backward).

    ``hidden(nm)`` (combined 1F1B's rows, ``tables.schedule_rows``): seconds an overlapped pair hides on a rank of
    ``nm`` MoE layers (``paired_hidden``), subtracted from its m x (forward + backward); no round-trip term. The
    start-up and drain stay: ``combined_1f1b.combined_1f1b_orders`` begins every rank with at least one lone
    forward (warm-up ``(p-r-1) 2 + (v-1) p + 1`` >= 1) and ends it with a lone backward of its chunk 0 for the same
    last micro-batch on every rank (the cool-down is the last ``warm`` backwards), so rank r starts after micro-batch
    0's unpaired forwards through ranks 0..r-1 and its last backward still goes back through their unpaired
    backwards, each hop after a send (``pipeline_ops.replay``)."""
    pp = sf.st.pp
    p2p = p2p_seconds(ctx, sf.st, mb.tok, fb.sp)
    best = pre = rt = 0.0
    lf, lb = end_extras(ctx, fb.lay, mb.lg, mb.ce)
    for g, nd0, nm0, cnt, r0 in rank_runs(ctx, sf.lay, pp, v):
        stage, nd, nm, rg = sf.lay.groups[g]
        f, b = fb(nd, nm, v)
        if r0 + cnt - 1 == pp - 1:
            f += lf
            b += lb
        if r0 == 0:
            f += mb.emb
            b += 2 * mb.emb
        if minima is not None:
            minima[0], minima[1] = min(minima[0], f), min(minima[1], b)
        f0, b0 = fb(nd0, nm0, 1)
        if r0 == 0:
            f0 += mb.emb
            b0 += 2 * mb.emb
        busy = mb.m * (f + b) - (hidden(nm) if hidden is not None else 0.0)
        best = max(best, pre + (cnt - 1) * (f0 + b0 + 2 * p2p) + busy)
        pre += cnt * (f0 + b0 + 2 * p2p)
        rt += cnt * (f + b)
    if pp > 1 and hidden is None:  # at most K micro-batches in flight on rank 0, each needing a round trip
        kk, m_eff, hops = round_trips(pp, mb.m, v)
        best = max(best, m_eff / kk * (rt + 2 * hops * p2p))
    return best


def _vpps(ctx: BoundContext, st, m: int) -> list[int]:
    """``space.vpp_options`` of (structure, m), memoized on what it reads of m (m % pp == 0)."""
    key = ("vpps", st, m % st.pp == 0)
    got = ctx.cache.get(key)
    if got is None:
        got = ctx.cache[key] = vpp_options(ctx.model, st, m, ctx.framework, ctx.space)
    return got


def busiest_rank_bounds(ctx: BoundContext, sf: StructureFacts, mbss, only_v1) -> list[float]:
    """For each micro-batch of ``mbss``: a lower bound (seconds) of the tight bound ``A + max(P + D, Z, K P + F) + O``
    of every candidate of (structure, micro-batch), cheap enough for the whole space: ``P`` by the busiest rank's
    m x (forward + backward) per micro-batch, or the vpp-1 pipeline bound when vpp 1 is the only choice
    (``only_v1``, one flag per micro-batch), and ``Z`` with the smallest per-rank forward / backward, all at no
    recompute (recompute only adds) and the smaller sp setting; the smallest ``default_schedule_bound + O[z]`` over
    the ZeRO stages. Per-layer costs and the DP / optimizer terms are cached (``bound_facts.layer_costs``,
    ``bound_facts.with_comm``). Where the framework's other pipeline schedules run (``other_schedule_cells``), the
    smaller of that and ``paired_bound``'s."""
    with_comm(ctx, sf)
    st, job, cache = sf.st, ctx.job, ctx.cache
    pp, dp, tp, h, vocab = st.pp, st.dp, st.tp, ctx.model.hidden_size, sf.vocab
    slots = [(stage == 0, stage == pp - 1, nd, nm) for stage, nd, nm, _ in sf.lay.groups]
    runs = [(g, cnt) for g, _, _, cnt, _ in rank_runs(ctx, sf.lay, pp, 1)] if pp > 1 else [(0, 1)]
    out = []
    for mbs, v1 in zip(mbss, only_v1):
        m = job.global_batch_size // (mbs * dp)
        tok = mbs * job.seq_length / st.cp
        lg = cache.get(("lg", tp, tok))
        if lg is None:
            lg = cache[("lg", tp, tok)] = stm.gemm_time(tok, h, vocab / tp, ctx.rate, ctx.hbm, ctx.el)
        ce = ce_seconds(ctx, tok * vocab / tp)
        emb = 2 * BYTES_16BIT * tok * h / ctx.hbm
        best = math.inf
        cells = _merge_cells(other_schedule_cells(ctx, sf, m, _vpps(ctx, st, m))) if sf.other_schedules else {}
        for sp in sf.sps:
            lt = layer_costs(ctx, st, mbs, sp)
            d, e = lt.get(0), lt.get(1)
            lf, lb = end_extras(ctx, lt, lg, ce)
            busy, f0, b0 = 0.0, math.inf, math.inf
            fbs = []
            for is_first, is_last, nd, nm in slots:
                f = b = 0.0
                if nd and d is not None:
                    f, b = nd * d[0], nd * d[1]
                if nm and e is not None:
                    f, b = f + nm * e[0], b + nm * e[1]
                if is_last:
                    f, b = f + lf, b + lb
                if is_first:
                    f, b = f + emb, b + 2 * emb
                fbs.append(f + b)
                busy = max(busy, f + b)
                f0, b0 = min(f0, f), min(b0, b)
            if v1:  # _pipeline_bound at vpp 1: the first micro-batch through the ranks before each run
                p = pre = 0.0
                for g, cnt in runs:
                    p = max(p, pre + (cnt - 1 + m) * fbs[g])
                    pre += cnt * fbs[g]
            else:
                p = m * busy
            for z, (a, c) in sf.o_coef.items():
                best = min(best, default_schedule_bound(sf, m, z, p, f0, b0) + a + m * c)
            if cells:
                best = min(best, paired_bound(ctx, sf, m, lambda nd, nm: (
                    (nd * d[0] if nd and d is not None else 0.0) + (nm * e[0] if nm and e is not None else 0.0),
                    (nd * d[1] if nd and d is not None else 0.0) + (nm * e[1] if nm and e is not None else 0.0)),
                    e[6] if e is not None else 0.0, cells, p2p_seconds(ctx, st, tok, sp)))
        out.append(best)
    return out


def sends_around(rank: int) -> int:
    """Point-to-point sends that lie outside rank ``rank``'s busy time in any schedule that puts virtual stage r on
    rank r (Megatron's interleaving, the V schedules): its first op waits for micro-batch 0's forward through
    stages 0..r-1 on ranks 0..r-1 (``rank`` sends), and its last op holds a backward of stage r that must still go
    back through those ranks to stage 0 (``rank`` sends); ``pipeline_ops.replay`` charges every send between
    ranks."""
    return 2 * rank


def paired_microbatches(m: int, v: int) -> int:
    """At most how many of a rank's m x v forwards (and backwards) a pairing schedule (combined 1F1B, DualPipeV)
    overlaps with a partner op, counted in whole micro-batches: a rank's first op is a forward with no backward
    ready and its last a backward with no forward left (``pipeline_ops``: only an ``FB`` pair hides), so with one
    chunk per rank (v 1) at most m - 1 of them hide; with more chunks, m (each op hides at most once)."""
    return m - 1 if v == 1 else m


def paired_hidden(sf: StructureFacts, nm: int, ep_s: float, m: int, v: int) -> float:
    """Most seconds of a rank's EP all-to-all that a pairing schedule's ``FB`` pairs hide
    (``pipeline_ops.fb_seconds`` >= F + B - hide_F - hide_B): ``sf.pair_hide`` of each of the rank's ``nm`` MoE
    layers' all-to-all (``ep_s`` seconds per layer, forward and backward) for at most ``paired_microbatches(m,
    v)`` micro-batches."""
    return 2 * sf.pair_hide * nm * ep_s * paired_microbatches(m, v)


def paired_dp_bound(sf: StructureFacts, m: int, z: int, f0: float, b0: float, hidden: float) -> float:
    """The ``Z`` tightening of the other schedules' rows (``tables.schedule_rows``: combined 1F1B, ZB-V,
    DualPipeV), seconds: ``z_bound(f0, b0) - hidden``, 0 when it has no DP term.

    Why it is a lower bound of the pipeline + the DP / ZeRO-3 exposure (``step_time.estimate_step``: step =
    makespan + ``dp_exposed_s(f_B, b_B)`` + optimizer for every schedule, f_B / b_B the busiest rank's unpaired
    forward / backward per micro-batch over all its chunks): ``dp_exposed_s`` is the same function of (f_B, b_B) and
    of the sync of the rank holding the most parameters whatever the schedule, and ``sf`` carries a sync no larger
    than that rank's (``dp_facts``: combined 1F1B's ranks hold the default rows' parameters; for a V schedule, the
    least loaded rank's decoder parameters), in which ``z_bound`` is non-decreasing; the makespan is at least the
    busiest rank's busy time m (f_B + b_B) less what its pairs hide (<= ``hidden``, the most of any rank; 0 for ZB-V).
    ``z_bound``'s derivation (``tables.dp_table``) uses the makespan only through makespan >= m (f_B + b_B), and is
    non-decreasing in (f, b) (slope m - 1 >= 0), so with f0 <= f_B, b0 <= b_B (the smallest of the schedule's own
    per-rank bounds) it stays below the pipeline + DP terms after subtracting ``hidden``."""
    zb = z_bound(sf, m, z, f0, b0)
    return max(0.0, zb - hidden) if zb > 0 else 0.0


def dp_facts(ctx: BoundContext, sf: StructureFacts, schedule: str) -> StructureFacts:
    """The facts whose DP / ZeRO-3 terms bound ``schedule``'s rows: ``sf`` itself for combined 1F1B (Megatron's
    interleaved placement, the default rows' parameters per rank), the least loaded rank's decoder parameters for
    the V schedules (``bound_facts.decoder_sync_facts``)."""
    return sf if schedule == "combined-1f1b" else decoder_sync_facts(ctx, sf)


def other_schedule_cells(ctx: BoundContext, sf: StructureFacts, m: int, vpps) -> dict[tuple[str, str], tuple]:
    """``{(schedule, recompute): (ZeRO stages, vpps)}``: the cells of (structure, micro-batch) where the
    framework's other pipeline schedules run (``space.schedule_options`` at each vpp of ``vpps``, ZeRO stage and
    recompute setting; ``m`` micro-batches). Empty when none may run there (combined 1F1B with pp > 1 and vpp 1
    only, with full recompute, ...): the group bounds then need no ``paired_bound``. Memoized on what
    ``schedule_options`` reads (pp, ep > 1, the split's first stage, m >= 2 pp, the vpps and ZeRO stages)."""
    st = sf.st
    key = ("sched_cells", st.pp, st.ep > 1, st.first is None, m >= 2 * st.pp, tuple(vpps), tuple(sf.zs))
    got = ctx.cache.get(key)
    if got is None:
        cells: dict[tuple[str, str], tuple[set, set]] = {}
        for rc in ctx.space.recompute:
            for v in vpps:
                for z in sf.zs:
                    for sched in schedule_options(ctx.model, st, m, v, z, rc, ctx.framework, ctx.space):
                        if sched is None:
                            continue
                        zs, vs = cells.setdefault((sched, rc), (set(), set()))
                        zs.add(z)
                        vs.add(v)
        got = ctx.cache[key] = {k: (tuple(sorted(zs)), tuple(sorted(vs))) for k, (zs, vs) in cells.items()}
    return got


def paired_bound(ctx: BoundContext, sf: StructureFacts, m: int, fb, ep_s: float, cells: dict,
                 p2p: float = 0.0) -> float:
    """A lower bound (seconds) of the rows of the framework's other pipeline schedules (``tables.schedule_rows``)
    over ``cells`` (``{schedule: (ZeRO stages, vpps)}``, the ones ``other_schedule_cells`` allows; inf when
    empty): every rank is busy at least m x its layers' forward + backward (``fb(nd, nm)``, without the embedding
    and the output layer, which a V schedule moves), less the EP all-to-all an overlapped pair hides
    (``paired_hidden`` at the largest vpp; pairing schedules only) and after ``sends_around``'s point-to-point
    sends (``p2p`` seconds each), plus ``O + D``, and the DP / ZeRO-3 tightening (``paired_dp_bound``, with the
    smallest per-rank forward / backward here and the most hidden of any rank): the smallest
    ``max(busy + D, Z) + O`` over the schedules and their ZeRO stages."""
    out = math.inf
    for sched, (zs, vs) in cells.items():
        pairing = sched in PAIRING_SCHEDULES
        busy, f0, b0, hid = 0.0, math.inf, math.inf, 0.0
        for stage, nd, nm, _ in sf.lay.groups:
            f, b = fb(nd, nm)
            h = paired_hidden(sf, nm, ep_s, m, max(vs)) if pairing else 0.0
            busy = max(busy, m * (f + b) - h + sends_around(stage) * p2p)
            f0, b0, hid = min(f0, f), min(b0, b), max(hid, h)
        for z in zs:
            dsf = dp_facts(ctx, sf, sched)
            zt = paired_dp_bound(dsf, m, z, f0, b0, hid)
            out = min(out, max(busy + d_bound(dsf, m, z), zt) + o_bound(ctx, sf, m, z))
    return out


def _merge_cells(cells: dict, rc: str | None = None) -> dict[str, tuple]:
    """``other_schedule_cells`` per schedule: the ZeRO stages and vpps of recompute ``rc`` (None: of any)."""
    out: dict[str, tuple[set, set]] = {}
    for (sched, r), (zs, vs) in cells.items():
        if rc is None or r == rc:
            a, b = out.setdefault(sched, (set(), set()))
            a.update(zs)
            b.update(vs)
    return {k: (tuple(sorted(a)), tuple(sorted(b))) for k, (a, b) in out.items()}


def group_bound(ctx: BoundContext, sf: StructureFacts, mbs: int, mem_limit: float) -> tuple[float, int]:
    """A lower bound (seconds) of the tight bound ``A + max(P + D, Z, K P + F) + O`` of every candidate of (structure,
    ``mbs``) whose memory bound fits ``mem_limit`` (bytes), and how many candidates may fit (an upper bound).

    Over (recompute, sp, zero) of the default schedule: skipped when the memory bound at vpp 1 exceeds the limit
    (interleaving never holds fewer micro-batches in flight, ``activations.in_flight_microbatches``, so no vpp fits
    either); else
    ``default_schedule_bound`` (``max(P' + D, Z[sp][z], K P' + F)``) + ``O[z]`` with ``P'`` the vpp-1 pipeline
    bound when vpp 1 is the only choice, else the busiest rank's m x (forward + backward), the recompute charged at
    vpp 1 (the fewest recomputed layers per chunk N_lb only grows with the in-flight micro-batches, and interleaving
    recomputes N_lb per chunk), and ``Z``
    with the smallest per-rank forward/backward at vpp 1 (``Z`` is non-decreasing in them). inf when nothing fits.
    Where the framework's other pipeline schedules run (``other_schedule_cells``), the smaller of that and
    ``paired_bound`` over their recompute settings and every sp setting (their memory is not filtered here).
    """
    mb = microbatch_facts(ctx, sf, mbs)
    with_memory_facts(ctx, sf, mb)
    with_comm(ctx, sf)
    pp = sf.st.pp
    if not mb.vpps:
        return math.inf, 0
    only_v1 = mb.vpps == [1]
    slots = sf.lay.groups
    infl1 = [in_flight(ctx, pp, 1, stage, mb.m) for stage, _, _, _ in slots]
    w = [[sf.states[j][z] + ctx.reserve + (mb.logits_b if stage == pp - 1 else 0.0) for z in ZEROS]
         for j, (stage, _, _, _) in enumerate(slots)]
    best, fits = math.inf, 0
    for rc in ctx.space.recompute:
        for sp in sf.sps:
            x = [stored_bytes(ctx, mb, sp, rc, stage, nd, nm, pp) * infl1[j]
                 + working_bytes(ctx, mb, sp, rc, stage, nd, nm, pp)
                 for j, (stage, nd, nm, _) in enumerate(slots)]
            ok = [z for z in sf.zs if max(wj[z] + xj for wj, xj in zip(w, x)) <= mem_limit]
            if not ok:
                continue
            fits += len(ok) * len(mb.vpps)
            fb = rank_fb(ctx, mb, rc, sp, min_recomputed_layers(ctx, sf, mb, rc, sp, 1))
            busy, f0, b0 = 0.0, math.inf, math.inf
            lf, lb = end_extras(ctx, mb.lay[sp], mb.lg, mb.ce)
            for stage, nd, nm, _ in slots:
                f, b = fb(nd, nm)
                if stage == pp - 1:
                    f, b = f + lf, b + lb
                if stage == 0:
                    f, b = f + mb.emb, b + 2 * mb.emb
                busy = max(busy, f + b)
                f0, b0 = min(f0, f), min(b0, b)
            p = pipeline_bound(ctx, sf, mb, fb, 1) if only_v1 else mb.m * busy
            for z in ok:
                best = min(best, default_schedule_bound(sf, mb.m, z, p, f0, b0) + o_bound(ctx, sf, mb.m, z))
    cells = other_schedule_cells(ctx, sf, mb.m, mb.vpps) if sf.other_schedules else {}
    if cells:
        # the other schedules' rows: no memory filter (a V schedule moves the embedding and the output layer), the
        # recompute at its least (one layer per chunk)
        fits = sum(len(mb.vpps) * len(sf.zs) * len(sf.sps) for _ in ctx.space.recompute) * (
            1 + len(sf.other_schedules))
        for rc in ctx.space.recompute:
            by_rc = _merge_cells(cells, rc)
            if not by_rc:
                continue
            for sp in sf.sps:
                ep_s = mb.lay[sp][1][6] if 1 in mb.lay[sp] else 0.0
                best = min(best, paired_bound(ctx, sf, mb.m, rank_fb(ctx, mb, rc, sp, 1), ep_s, by_rc,
                                              p2p_seconds(ctx, sf.st, mb.tok, sp)))
    return best, fits
