"""``plan3d sweep``: plan every scenario of a grid on all local cores."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .app import app


@app.command()
def sweep(
    grid: Annotated[Path, typer.Argument(help="grid YAML: lists of models, clusters, gpus, global_batch_sizes, "
                                              "seq_lengths, objectives (planner/sweeps.py)")],
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="directory for sweep.jsonl and sweep.csv (default: JSONL on stdout)")] = None,
    plot: Annotated[bool, typer.Option("--plot", help="also draw sweep.png (throughput and cost against GPUs; "
                                                      "needs --output and the plot extra)")] = False,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="processes (default: all cores)")] = None,
    executor: Annotated[str, typer.Option("--executor", help="process (default) or ray (the ray extra)")] = "process",
) -> None:
    """Plan every scenario of a grid on all local cores; one row per scenario (the top plan, or why none fits)."""
    from ..errors import PlanInputError
    from ..sweeps import load_grid, plot_sweep, sweep as api_sweep, to_csv, to_jsonl
    if plot and output is None:
        raise PlanInputError("--plot writes sweep.png next to the tables: give --output DIR")
    if plot:  # before the scenarios are planned: no matplotlib fails at once
        from ..plotting import require_matplotlib
        require_matplotlib("--plot")
    g = load_grid(grid)
    if sys.stderr.isatty():
        from rich.progress import Progress
        with Progress(transient=True) as bar:
            task = bar.add_task(f"{g.num_scenarios} scenarios", total=g.num_scenarios)
            rows = api_sweep(g, executor=executor, max_workers=workers,
                             progress=lambda done, total: bar.update(task, completed=done))
    else:
        rows = api_sweep(g, executor=executor, max_workers=workers)
    if output is None:
        sys.stdout.write(to_jsonl(rows))
    else:
        try:
            output.mkdir(parents=True, exist_ok=True)
            (output / "sweep.jsonl").write_text(to_jsonl(rows))
            (output / "sweep.csv").write_text(to_csv(rows))
        except OSError as e:
            raise PlanInputError(f"--output {output}: {e.strerror}") from None
        names = ["sweep.jsonl", "sweep.csv"]
        if plot:
            plot_sweep(rows, output / "sweep.png")
            names.append("sweep.png")
        for n in names:
            sys.stdout.write(f"{output / n}\n")
    ok = sum(r.status == "ok" for r in rows)
    sys.stderr.write(f"plan3d: sweep: {len(rows)} scenarios, {ok} planned, {len(rows) - ok} infeasible or "
                     f"invalid (reason in each row)\n")

