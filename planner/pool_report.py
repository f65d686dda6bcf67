"""Text and pictures of a plan over pools (``planner.pools.PoolsDocument``): the plans table, the pool-subset
table ("leave the A100s out?") and the per-stage timeline across pools."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .pools import PoolsDocument
from .uncertainty import step_cell


def _pools_cell(p) -> str:
    return " > ".join(f"{u.pool} {u.num_stages}x" for u in p.pools)


def _layers_cell(p) -> str:
    """Layers per stage, pool by pool: ``[3 6 6 6 | 15 15 15 14]``."""
    out = []
    for u in p.pools:
        out.append(" ".join(str(s.num_layers) for s in p.stages[u.first_stage:u.first_stage + u.num_stages]))
    return "[" + " | ".join(out) + "]"


def plans_table(doc: PoolsDocument) -> Table:
    """Ranked plans: pools in pipeline order with their stage counts, layers per stage, the layout, throughput."""
    i = doc.input
    names = ", ".join(f"{p.num_nodes} x {p.name} ({p.gpu})" for p in i.cluster.pools)
    t = Table(title=f"plan3d: {i.model.name} over pools {names}, GBS {i.job.global_batch_size} x seq "
                    f"{i.job.seq_length}, {i.job.precision}: top {len(doc.plans)}",
              title_justify="left", caption_justify="left",
              caption="pools in pipeline (node-rank) order; layers per stage pool by pool; MFU against the summed "
                      "dense 16-bit peaks of the GPUs used; peak GiB: the stage with the least headroom / its pool's "
                      "capacity")
    for col in ("#", "pools", "layers per stage", "tp", "pp", "dp", "cp", "ep", "mbs", "zero", "sp", "recompute",
                "GPUs", "idle", "peak GiB", "step s", "tokens/s", "MFU", "source"):
        t.add_column(col, justify="right" if col not in ("pools", "layers per stage", "source") else "left")
    for p in doc.plans:
        q = p.parallel
        peak = f"{p.memory.peak_bytes / 2**30:.1f}/{p.memory.capacity_bytes / 2**30:.1f}" if p.memory else "-"
        t.add_row(str(p.rank), _pools_cell(p), _layers_cell(p), str(q.tp), str(q.pp), str(q.dp), str(q.cp), str(q.ep),
                  str(q.micro_batch_size), str(q.zero_stage), "y" if q.sequence_parallel else "n", q.recompute,
                  str(p.launch.world_size), str(p.idle_gpus), peak, step_cell(p.time),
                  f"{p.throughput.tokens_per_s:,.0f}", f"{p.throughput.mfu:.1%}", p.source)
    return t


def subsets_table(doc: PoolsDocument) -> Table:
    """The best plan of every subset of pools, best first, with its throughput relative to the best."""
    best = max((s.tokens_per_s or 0.0) for s in doc.subsets) or 1.0
    t = Table(title="pool subsets: the best plan using exactly these pools", title_justify="left")
    for col in ("pools", "order", "GPUs", "tokens/s", "vs best", "MFU", "source / why none"):
        t.add_column(col, justify="left" if col in ("pools", "order", "source / why none") else "right")
    for s in doc.subsets:
        if s.tokens_per_s is None:
            t.add_row(" + ".join(s.pools), "-", "-", "-", "-", "-", s.reason or "")
            continue
        t.add_row(" + ".join(s.pools), " > ".join(s.order or []), str(s.num_gpus), f"{s.tokens_per_s:,.0f}",
                  f"{s.tokens_per_s / best:.1%}", f"{s.mfu:.1%}", s.source or "")
    return t


def draw_pools_timeline(doc: PoolsDocument, path: str | Path, rank: int = 1) -> Path:
    """The simulated schedule of plan ``rank`` (``planner.timeline.draw_timeline``), one row per stage labelled
    with its pool and layers, the pools shaded as bands."""
    from .errors import PlanInputError
    from .timeline import draw_timeline
    plans = doc.search_plans
    if not 1 <= rank <= len(plans):
        raise PlanInputError(f"--rank {rank}: the document has plans 1..{len(plans)}")
    info = doc.plans[rank - 1]
    labels = [f"{s.pool} stage {s.stage} ({s.num_layers} layers)" for s in info.stages]
    bands = [(u.first_stage, u.first_stage + u.num_stages - 1, f"{u.pool}: {u.gpu} x {u.gpus_used}")
             for u in info.pools]
    i = doc.input
    title = (f"{i.model.name} over {' + '.join(f'{u.gpus_used} {u.gpu}' for u in info.pools)}, layout "
             f"{info.parallel.pipeline_layout or 'even'}, {info.throughput.tokens_per_s:,.0f} tokens/s")
    return draw_timeline(plans[rank - 1].estimate.step, path, title, labels, bands)
