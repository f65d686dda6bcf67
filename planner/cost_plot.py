"""``plan3d plan --train-tokens T --plot FILE``: cost against days to train, one point per GPU count (and cluster),
the Pareto frontier marked (no other point is both faster and cheaper). Points come from
``planner.api.cost_sweep``; matplotlib (the ``plot`` extra) is imported only here.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from .cost_search import SweepPoint, pareto_front
from .errors import NoFeasiblePlan, PlanInputError

PLOT_SUFFIXES = (".png", ".svg")


def check_plot_path(path: str | Path) -> Path:
    """``path`` as a Path; raises ``PlanInputError`` unless it ends in .png or .svg (checked before the sweep)."""
    p = Path(path)
    if p.suffix.lower() not in PLOT_SUFFIXES:
        raise PlanInputError(f"--plot {p}: the file must end in {' or '.join(PLOT_SUFFIXES)}")
    return p


def cost_axis(points: list[SweepPoint]) -> tuple[str, list[float]]:
    """The y axis: US dollars when every point has a price, else GPU-hours (label, values)."""
    if points and all(p.cost.usd is not None for p in points):
        return "cost, US dollars", [p.cost.usd for p in points]
    return "GPU-hours (no price for every cluster)", [p.cost.gpu_hours for p in points]


def plot_cost_sweep(points: list[SweepPoint], path: str | Path, title: str = "") -> Path:
    """Draw ``points`` (effective days on a log x axis, cost on y) into ``path`` (.png or .svg), each labelled with
    its GPU count, the Pareto frontier joined and ringed; the prices' dates go in the caption. Raises
    ``PlanInputError`` for an unsupported suffix, matplotlib missing or an unwritable file, ``NoFeasiblePlan`` for
    no points."""
    p = check_plot_path(path)
    if not points:
        raise NoFeasiblePlan(f"--plot {p}: no GPU count up to --gpus has a plan that fits, nothing to draw")
    from .plotting import require_matplotlib
    require_matplotlib("--plot")
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "plan3d"  # deterministic SVG ids: same input, same bytes
    import matplotlib.pyplot as plt

    ylabel, ys = cost_axis(points)
    xs = [pt.cost.effective_days for pt in points]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    clusters = list(dict.fromkeys(pt.cluster for pt in points))
    for name in clusters:
        idx = [i for i, pt in enumerate(points) if pt.cluster == name]
        ax.plot([xs[i] for i in idx], [ys[i] for i in idx], "o-", alpha=0.75, label=name)
        for i in idx:
            ax.annotate(f"{points[i].num_gpus}", (xs[i], ys[i]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    front = pareto_front(list(zip(xs, ys)))
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "k--", linewidth=1, label="Pareto frontier")
    ax.scatter([xs[i] for i in front], [ys[i] for i in front], s=140, facecolors="none", edgecolors="black")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("days to train (interruptions, restarts and checkpoints counted)")
    ax.set_ylabel(ylabel)
    prices = sorted({f"{pt.cluster} \\${pt.cost.usd_per_gpu_hour:.2f}/GPU-h"
                     + (f" ({pt.cost.price_date})" if pt.cost.price_date else "")
                     for pt in points if pt.cost.usd_per_gpu_hour is not None})
    caption = "labels: GPUs" + ("; prices: " + ", ".join(prices) if prices else "")
    ax.set_title("\n".join(textwrap.wrap(title, 90) + textwrap.wrap(caption, 110)), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(p, metadata={"Date": None} if p.suffix.lower() == ".svg" else {"Software": None})
    except OSError as e:
        raise PlanInputError(f"--plot {p}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return p
