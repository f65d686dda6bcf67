"""``plan3d validate``: predictions against the published runs, with the leave-one-group-out figure."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .app import app
from .options import Fmt, FmtOpt, OutOpt
from .output import open_output, write_output


def _finite(ctx: typer.Context, param: typer.CallbackParam, value: float) -> float:
    """Refuse an infinite threshold (``inf`` passes ``min=0`` and would switch the check off without a word)."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value}: must be a finite number")
    return value


@app.command()
def validate(
    dataset: Annotated[Optional[Path], typer.Option(
        "--dataset", help="published-runs YAML (default: the packaged dev rows)")] = None,
    max_mape: Annotated[float, typer.Option("--max-mape", min=0.0, callback=_finite,
                                            help="overall MAPE threshold, percent")] = 7.0,
    max_group_mape: Annotated[float, typer.Option(
        "--max-group-mape", min=0.0, callback=_finite,
        help="MAPE threshold per source group with >= 3 rows, percent")] = 10.0,
    cross_validate: Annotated[bool, typer.Option(
        "--cross-validate", help="also report leave-one-source-group-out MAPE (constants refitted without each "
                                 "group, the groups in parallel processes: ~100 s on a 2-core machine); the "
                                 "thresholds then apply to it too")] = False,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", min=1, help="processes for --cross-validate (default: one per CPU; 1: in this process)")] = None,
    fmt: FmtOpt = Fmt.table, output: OutOpt = None,
) -> None:
    """Run the step-time model over published training runs; exit 1 when a MAPE threshold is exceeded."""
    from ..api import validate as api_validate
    from ..validation import report_json
    if cross_validate:
        from rich.console import Console
        from rich.progress import Progress
        with Progress(console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("cross-validating", total=None)
            rep = api_validate(dataset, cross_validate=True, workers=workers, progress=lambda g, k, n: bar.update(
                task, total=n, completed=k, description=f"refitted without {g}"))
    else:
        rep = api_validate(dataset)
    if fmt == Fmt.json:
        write_output(report_json(rep) + "\n", output)
    else:
        from rich.console import Console
        from rich.table import Table
        t = Table(title="plan3d validate: predicted vs measured (error = predicted throughput / measured - 1)",
                  title_justify="left")
        for col in ("row", "group", "GPUs", "config", "metric", "measured", "predicted", "error",
                    "tok/s/GPU meas", "tok/s/GPU pred", "TFLOP/s meas", "TFLOP/s pred"):
            t.add_column(col, overflow="fold")
        f = lambda x, d=0: "-" if x is None else f"{x:,.{d}f}"  # noqa: E731
        for r in rep.rows:
            if r.skipped:
                t.add_row(r.id, r.group, f"{r.num_gpus or '-'} {r.gpu}", f"skipped: {r.skipped}", *[""] * 8)
                continue
            d = 3 if r.metric == "MFU" else (2 if r.metric == "step s" else 1)
            t.add_row(r.id, r.group, f"{r.num_gpus} {r.gpu}", r.config, r.metric, f(r.measured, d),
                      f(r.predicted, d), f"{100 * r.error:+.1f}%", f(r.measured_tokens_per_s_per_gpu),
                      f(r.predicted_tokens_per_s_per_gpu), f(r.measured_tflops_per_gpu, 1),
                      f(r.predicted_tflops_per_gpu, 1))
        cv = rep.cross_validation
        g = Table(title="MAPE per source group" + (" (in-sample; LOGO: the group predicted by constants fitted "
                                                   "without it)" if cv is not None else ""), title_justify="left")
        for col in ("group", "rows", "MAPE") + (("LOGO MAPE",) if cv is not None else ()):
            g.add_column(col)
        logo = cv.group_table() if cv is not None else {}
        for name, (n, mape) in rep.group_mape().items():
            g.add_row(name, str(n), f"{mape:.2f}%", *([f"{logo[name][2]:.2f}%"] if name in logo else []))
        g.add_row("overall", str(len(rep.evaluated)), f"{rep.mape:.2f}%",
                  *([f"{cv.logo_mape:.2f}%"] if cv is not None else []))
        con = Console(width=250, file=open_output(output) if output is not None else None)
        con.print(t)
        con.print(g)
        skipped = len(rep.rows) - len(rep.evaluated)
        con.print(f"{len(rep.evaluated)} rows evaluated, {skipped} skipped (reason in the table)")
        if rep.infeasible:
            con.print(f"{len(rep.infeasible)} published configurations are predicted infeasible (they all ran):")
            for r in rep.infeasible:
                con.print(f"  {r.id}: {'; '.join(r.violations)}")
    fails = rep.failures(max_mape, max_group_mape)
    if fails:
        sys.stderr.write("plan3d: validate: " + "; ".join(fails) + "\n")
        sys.exit(1)

