"""Text and picture of a fallback table (``planner.fallback_plans.FallbackDocument``)."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .fallback_plans import FallbackDocument
from .plotting import picture_path, pyplot, save


def _layout(p) -> str:
    q = p.parallel
    return (f"tp {q.tp} pp {q.pp} cp {q.cp} ep {q.ep} dp {q.dp} vpp {q.vpp} mbs {q.micro_batch_size} "
            f"zero {q.zero_stage}" + (f" {q.recompute}" if q.recompute != "none" else ""))


def fallback_table(doc: FallbackDocument) -> Table:
    """One row per count of lost nodes: the keep-layout plan and the best plan (when it beats it)."""
    i, o = doc.input, doc.original
    t = Table(title=f"plan3d fallback: {i.model.name} on {i.cluster.num_gpus} x {i.cluster.gpu} ({i.cluster.name}), "
                    f"GBS {i.job.global_batch_size} x seq {i.job.seq_length}; original {_layout(o)}: "
                    f"{o.throughput.tokens_per_s:,.0f} tokens/s",
              title_justify="left", caption_justify="left",
              caption=f"retained = tokens/s over the original's; keep layout: same TP/PP/CP/EP/VPP and stage layout, "
                      f"only DP (and the micro-batch count, ZeRO shards) changes, no resharding (it needs at least "
                      f"{doc.min_gpus_keep_layout} GPU{'s' if doc.min_gpus_keep_layout != 1 else ''}); best: any "
                      f"layout, needs resharding ({doc.framework})")
    for col in ("lost", "healthy GPUs", "keep layout: dp", "GPUs", "idle", "retained", "best layout", "GPUs ",
                "idle ", "retained ", "restart with"):
        t.add_column(col, justify="left" if col in ("best layout", "restart with") else "right")
    for f in doc.fallbacks:
        k, b = f.keep_layout, f.best
        keep = [str(k.parallel.dp), str(k.launch.world_size), str(k.idle_gpus), f"{k.throughput_retained:.1%}"] \
            if k else ["-", "-", "-", (f.keep_layout_reason or "")[:40]]
        best = [_layout(b), str(b.launch.world_size), str(b.idle_gpus), f"{b.throughput_retained:.1%}"] \
            if b else ["- (keep layout is best)" if k else "-", "", "", ""]
        t.add_row(str(f.lost_nodes), str(f.healthy_gpus), *keep, *best,
                  f"{f.choice} ({f.throughput_retained:.1%})" if f.choice else "nothing fits")
    return t


def plot_fallback(doc: FallbackDocument, path: str | Path) -> Path:
    """Retained throughput against lost nodes: keep-layout, best, and the chosen plan (``.png`` or ``.svg``)."""
    p, fmt = picture_path("--plot", path)
    plt = pyplot(f"--plot {p}")
    ks = [f.lost_nodes for f in doc.fallbacks]
    keep = [f.keep_layout.throughput_retained if f.keep_layout else float("nan") for f in doc.fallbacks]
    chosen = [f.throughput_retained if f.throughput_retained is not None else float("nan") for f in doc.fallbacks]
    gpus = [1 - f.healthy_gpus / doc.input.cluster.num_gpus for f in doc.fallbacks]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(ks, chosen, "o-", color="#55A868", label="restart plan (best layout if it beats keep layout)")
    ax.plot(ks, keep, "s--", color="#4C72B0", label="keep layout (only DP changes)")
    ax.plot(ks, [1 - g for g in gpus], ":", color="#999999", label="healthy GPUs / all")
    ax.set_xlabel("lost nodes")
    ax.set_ylabel("throughput retained")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(ks)
    i = doc.input
    ax.set_title(f"{i.model.name} on {i.cluster.num_gpus} x {i.cluster.gpu}, GBS {i.job.global_batch_size}: "
                 f"fallback after node loss", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return save(fig, p, fmt, "--plot")
