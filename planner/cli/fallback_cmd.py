"""``plan3d fallback``: the plans to fall back to after losing nodes."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .app import app
from .options import (AT_RISK_DEFAULT, AtRiskOpt, DispatcherOpt, DispatcherSmsOpt, FlopsOpt, Fmt, FmtOpt,
                      Fp8RecipeOpt, Framework, GpusOpt, HEADROOM_DEFAULT, HeadroomOpt, NodesOpt, OutOpt, Precision,
                      SoftwareDateOpt, enum_value)
from .output import write_output


@app.command()
def fallback(
    max_lost_nodes: Annotated[int, typer.Option("--max-lost-nodes", min=1, help="plan for losing 1..K nodes")],
    plan_file: Annotated[Optional[Path], typer.Option(
        "--plan", help="plan document (plan3d plan --format json); without it the job options are planned first")] = None,
    rank: Annotated[int, typer.Option("--rank", min=1, help="which plan of --plan is running (1 = best)")] = 1,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="as plan (default: --plan's model)")] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", "-c", help="as plan (default: --plan's)")] = None,
    gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: Annotated[Optional[int], typer.Option("--global-batch-size", min=1)] = None,
    seq_length: Annotated[Optional[int], typer.Option("--seq-length", min=1)] = None,
    precision: Annotated[Optional[Precision], typer.Option("--precision")] = None,
    flash_attention: Annotated[Optional[bool], typer.Option("--flash-attention/--no-flash-attention")] = None,
    dropout: Annotated[Optional[bool], typer.Option("--dropout/--no-dropout")] = None,
    software_date: SoftwareDateOpt = None,
    moe_flex_dispatcher_backend: DispatcherOpt = None, moe_flex_dispatcher_num_sms: DispatcherSmsOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    framework: Annotated[Optional[Framework], typer.Option(
        "--framework", help="rules and resharding path (default megatron)")] = None,
    memory_headroom: HeadroomOpt = HEADROOM_DEFAULT, at_risk_margin: AtRiskOpt = AT_RISK_DEFAULT,
    flops_convention: FlopsOpt = None, fmt: FmtOpt = Fmt.table, output: OutOpt = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="draw retained throughput against lost nodes to FILE.png|svg")] = None,
) -> None:
    """Fallback plans after losing 1..K nodes: the best plan keeping the checkpoint's layout and the best of any
    layout (with its resharding path), the throughput each retains and the GPUs it leaves idle."""
    from ..fallback_plans import fallback as api_fallback
    if plot is not None:  # before the fallback searches: a wrong suffix or no matplotlib fails at once
        from ..plotting import picture_path, require_matplotlib
        picture_path("--plot", plot)
        require_matplotlib("--plot")
    job = {k: v for k, v in dict(gpus=gpus, nodes=nodes, global_batch_size=global_batch_size, seq_length=seq_length,
                                 precision=enum_value(precision), flash_attention=flash_attention, dropout=dropout,
                                 framework=enum_value(framework), software_date=software_date,
                                 moe_flex_dispatcher_backend=moe_flex_dispatcher_backend,
                                 moe_flex_dispatcher_num_sms=moe_flex_dispatcher_num_sms, fp8_recipe=fp8_recipe).items()
           if v is not None}
    doc = api_fallback(model, cluster, plan=plan_file, max_lost_nodes=max_lost_nodes, rank=rank,
                       memory_headroom=memory_headroom, at_risk_margin=at_risk_margin,
                       flops_convention=enum_value(flops_convention), **job)
    if plot is not None:
        from ..fallback_report import plot_fallback
        plot_fallback(doc, plot)
    if fmt == Fmt.json:
        write_output(doc.model_dump_json(), output)
        return
    import io

    from rich.console import Console

    from ..fallback_report import fallback_table
    buf = io.StringIO() if output is not None else None
    con = Console(file=buf, width=220) if buf is not None else Console(width=max(220, Console().width))
    con.print(fallback_table(doc))
    if buf is not None:
        write_output(buf.getvalue(), output)

