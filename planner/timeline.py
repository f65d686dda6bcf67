"""Draw the simulated pipeline schedule of one configuration (``plan3d explain ... --timeline FILE.svg|png``).

One row per pipeline rank, time on the x axis: forward (F), backward (B, including recompute and the exposed
TP/CP/EP communication of the layer), weight-gradient (W: ZB-H1, ZB-V, DualPipe, DualPipeV), idle (bubble), and the
exposed data-parallel communication and optimizer step after the pipeline drains. A forward and a backward that run
as one overlapped pair (DualPipe, DualPipeV, Megatron's combined 1F1B) are outlined in black. Ops come from ``cost_models.pipeline.simulate`` with
the per-stage times of ``cost_models.step_time.estimate_step``. matplotlib is imported lazily (only here).
"""
from __future__ import annotations

from pathlib import Path

from cost_models.pipeline import simulate
from cost_models.step_time import StepEstimate

from .plotting import picture_path, pyplot, save

#: Above this many ops the drawing would be unreadable (and slow): only the first micro-batches are drawn.
MAX_DRAWN_MICROBATCHES = 64

_COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#8172B2", "dp": "#C44E52", "opt": "#CCB974"}


def draw_timeline(step: StepEstimate, path: str | Path, title: str = "", row_labels: list[str] | None = None,
                  bands: list[tuple[int, int, str]] | None = None) -> Path:
    """Write the schedule picture of ``step`` to ``path`` (``.svg`` or ``.png``); returns the path. ``row_labels``:
    one label per stage (default ``stage r``); ``bands``: (first stage, last stage, label) ranges shaded alternately
    behind the rows (the pools of a mixed cluster)."""
    p, fmt = picture_path("--timeline", path)
    pp = step.pp
    vpp = len(step.stage_forward_s) // pp
    m = min(step.num_microbatches, MAX_DRAWN_MICROBATCHES)
    sim = simulate(step.schedule, pp, m, step.stage_forward_s, step.stage_backward_s, vpp=vpp, p2p_s=step.p2p_s,
                   record=True, wgt_s=step.stage_wgrad_s or None, hide_f_s=step.stage_hide_forward_s or None,
                   hide_b_s=step.stage_hide_backward_s or None)
    plt = pyplot(f"--timeline {p}")
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12, 0.45 * pp + 1.8))
    for k, (lo, hi, label) in enumerate(bands or []):
        ax.axhspan(lo - 0.5, hi + 0.5, color="#F2F2F2" if k % 2 == 0 else "#E0E8F0", zorder=0)
        ax.text(1.005, 1 - (lo + hi + 1) / 2 / pp, label, transform=ax.transAxes, rotation=90, va="center",
                ha="left", fontsize=7, color="#555555")
    for op in sim.ops:
        paired = getattr(op, "paired", False)  # half of an overlapped forward-backward pair: black outline
        ax.barh(op.rank, op.end - op.start, left=op.start, height=0.8, color=_COLORS[op.kind],
                edgecolor="black" if paired else "white", linewidth=0.6 if paired else 0.3)
    end = sim.makespan
    dp = step.exposed_comm_s.get("dp", 0.0)
    for r in range(pp):
        if dp > 0:
            ax.barh(r, dp, left=end, height=0.8, color=_COLORS["dp"])
        ax.barh(r, step.optimizer_s, left=end + dp, height=0.8, color=_COLORS["opt"])
    ax.set_yticks(range(pp), row_labels or [f"stage {r}" for r in range(pp)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds" + (f" (first {m} of {step.num_microbatches} micro-batches)"
                               if m < step.num_microbatches else ""))
    bub = sim.bubble_fraction
    ax.set_title((title + "\n" if title else "") +
                 f"{step.schedule}, {pp} stages x {vpp} chunks, {m} micro-batches: bubble {bub:.1%} (white), "
                 f"step {step.step_s:.3f} s", fontsize=9)
    ax.legend(handles=[Patch(color=_COLORS["F"], label="forward"),
                       Patch(color=_COLORS["B"], label="backward (+recompute, exposed TP/CP/EP)"),
                       Patch(color=_COLORS["W"], label="weight gradient (ZB, DualPipe)"),
                       Patch(color=_COLORS["dp"], label="exposed DP communication"),
                       Patch(color=_COLORS["opt"], label="optimizer step")],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, fontsize=8, frameon=False)
    fig.tight_layout()
    return save(fig, p, fmt, "--timeline")

