"""Per-stage memory report: a rich table (largest terms first, with capacity and headroom), the JSON form shared with
the plan document (``memory.stages``), and a stacked-bar picture with the capacity line (matplotlib, optional
``plot`` extra, imported only when a picture is asked for).

Units: bytes in JSON; GiB (2**30 bytes) in the table and the picture.
"""
from __future__ import annotations

from pathlib import Path

from cost_models.memory import MemoryEstimate

from .errors import PlanInputError

GiB = 2**30
#: A plan whose peak is within this fraction of capacity is marked at risk (allocator spikes, NCCL growth;
#: field_cases.md MEM cases run out of memory within ~3-5% of the estimate).
AT_RISK_FRACTION = 0.05
PLOT_SUFFIXES = (".png", ".svg")


def status(est: MemoryEstimate, at_risk_fraction: float = AT_RISK_FRACTION) -> str:
    """``OOM`` (peak above capacity), ``at risk`` (within ``at_risk_fraction`` of it) or ``fits``."""
    if not est.fits:
        return "OOM"
    return "at risk" if est.at_risk(at_risk_fraction) else "fits"


def term_order(est: MemoryEstimate) -> list[str]:
    """Term names, largest first on the peak stage (ties by name), so every table and picture agrees."""
    return list(est.peak_stage.terms())


def memory_info(est: MemoryEstimate):
    """The plan document's ``MemoryInfo`` for ``est`` (bytes, rounded to integers; deterministic)."""
    from .document import MemoryInfo, StageMemoryInfo, _r
    pk = est.peak_stage
    stages = [StageMemoryInfo(stage=s.stage, num_layers=s.num_layers, total_bytes=round(s.total),
                              in_flight_microbatches=_r(s.in_flight_microbatches),
                              breakdown={k: round(v) for k, v in s.terms().items()},
                              peak_phase=s.phase, phases={k: round(v) for k, v in s.phases.items()})
              for s in est.stages]
    cap = est.capacity_bytes
    return MemoryInfo(peak_bytes=round(pk.total), capacity_bytes=cap, headroom_bytes=round(cap - pk.total),
                      peak_stage=pk.stage, at_risk=cap * (1 - AT_RISK_FRACTION) < pk.total <= cap,
                      breakdown={k: round(v) for k, v in pk.terms().items()}, stages=stages)


def memory_table(est: MemoryEstimate, title: str):
    """A rich table, one row per pipeline stage (``*`` marks the peak stage): layers, micro-batches in flight, each
    term (columns ordered largest first on the peak stage), the total at the stage's peak phase, that phase,
    headroom to capacity and status. GiB."""
    from rich.table import Table
    cap = est.capacity_bytes
    t = Table(title=title or None, title_justify="left",
              caption=f"GiB per GPU; capacity {cap / GiB:.2f} GiB; at risk within {AT_RISK_FRACTION:.0%} of it",
              caption_justify="left")
    names = term_order(est)
    for col in ("stage", "layers", "in flight", *names, "total", "phase", "headroom", "status"):
        t.add_column(col.replace("_", " "), justify="left" if col in ("phase", "status") else "right",
                     min_width=len(col), no_wrap=True)
    for s in est.stages:
        terms = s.terms()
        st = "OOM" if s.total > cap else "at risk" if s.total > cap * (1 - AT_RISK_FRACTION) else "fits"
        t.add_row(f"{s.stage}{' *' if s.stage == est.peak_stage.stage else ''}", str(s.num_layers),
                  f"{s.in_flight_microbatches:g}", *[f"{terms[n] / GiB:.2f}" for n in names],
                  f"{s.total / GiB:.2f}", s.phase, f"{(cap - s.total) / GiB:.2f}", st)
    return t


def plot_memory(est: MemoryEstimate, path: Path, title: str) -> None:
    """Draw the per-stage stacked breakdown (GiB) with the capacity line into ``path`` (.png or .svg).

    Raises:
        PlanInputError: unsupported suffix, matplotlib missing, or the file cannot be written.
    """
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise PlanInputError(f"--plot {path}: the file must end in {' or '.join(PLOT_SUFFIXES)}")
    try:
        import matplotlib
    except ImportError:
        raise PlanInputError("--plot needs matplotlib: pip install 'plan3d[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "plan3d"  # deterministic SVG ids

    names = term_order(est)
    xs = list(range(len(est.stages)))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(xs) + 3.0), 4.5))
    bottom = [0.0] * len(xs)
    for name in names:
        vals = [s.terms()[name] / GiB for s in est.stages]
        ax.bar(xs, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    cap = est.capacity_bytes / GiB
    ax.axhline(cap, color="black", linestyle="--", linewidth=1.2, label=f"capacity {cap:.1f} GiB")
    ax.axhline(cap * (1 - AT_RISK_FRACTION), color="grey", linestyle=":", linewidth=1.0,
               label=f"at risk above {cap * (1 - AT_RISK_FRACTION):.1f} GiB")
    ax.set_xticks(xs, [f"{s.stage}\n{s.phase}" for s in est.stages])
    ax.set_xlabel("pipeline stage / peak phase")
    ax.set_ylabel("GiB per GPU")
    import textwrap
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    meta = {"Date": None} if path.suffix.lower() == ".svg" else {"Software": None}
    try:
        fig.savefig(path, metadata=meta)
    except OSError as e:
        raise PlanInputError(f"--plot {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
