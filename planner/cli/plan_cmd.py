"""``plan3d plan``: search the layouts of one job on one cluster, several clusters (compared by time and
cost) or pools of different GPUs."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..api_options import MAX_TOP_K  # light: planner.api_options imports only planner.errors at module level
from ..errors import NoFeasiblePlan
from .app import app
from .options import (AT_RISK_DEFAULT, AsyncCkptOpt, AtRiskOpt, CapacityOpt, ClusterOpt, DispatcherOpt,
                      DispatcherSmsOpt, DropoutOpt, Emit, FlashOpt, Fp8RecipeOpt,
                      FlopsOpt, Fmt, FmtOpt, Framework, GbsOpt, GpusOpt, HEADROOM_DEFAULT, HeadroomOpt, ImbalanceOpt,
                      Launcher, LauncherOpt, ModelOpt, NodesOpt, ObjectiveOpt, OutOpt, PrecOpt, Precision, PriceOpt,
                      PueOpt, RateOpt, RecomputeOpt, RestartOpt, ScheduleOptT, SeqOpt, SoftwareDateOpt, SolverOpt,
                      TrainTokensOpt, check_format_emit, enum_value, rules_framework)
from .output import draw_cost_sweep, emit_launch, render_comparison, render_plans, write_output


@app.command()
def plan(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = None, precision: PrecOpt = Precision.bf16,
    flash_attention: FlashOpt = True, dropout: DropoutOpt = False,
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=MAX_TOP_K,
                                       help=f"number of plans to return (1-{MAX_TOP_K})")] = 5,
    memory_headroom: HeadroomOpt = HEADROOM_DEFAULT,
    framework: Annotated[Optional[Framework], typer.Option(
        "--framework", help="framework whose rules apply (default: the --emit target, else megatron)")] = None,
    fmt: FmtOpt = Fmt.table, output: OutOpt = None,
    emit: Annotated[Optional[Emit], typer.Option(
        "--emit", help="the launch config of the top plan (or --rank N): printed, or with --output DIR, written "
                       "as files (args, config, torchrun and Slurm scripts)")] = None,
    rank: Annotated[int, typer.Option("--rank", min=1, max=MAX_TOP_K, help="which plan --emit writes (1 = best)")] = 1,
    launcher: LauncherOpt = Launcher.scripts,
    solver: Annotated[SolverOpt, typer.Option("--solver", help="cpsat (default) or enumerate (brute force, the "
                                                               "oracle)")] = SolverOpt.cpsat,
    objective: Annotated[ObjectiveOpt, typer.Option(
        "--objective", help="throughput (default); headroom: most memory headroom within --within of the best "
                            "throughput; min-gpus: fewest GPUs (up to --gpus) meeting --target-step-s, "
                            "--target-tokens-per-day or --deadline-days; cost: fewest GPU-hours (up to --gpus) "
                            "that train --train-tokens by --deadline-days")] = ObjectiveOpt.throughput,
    within: Annotated[Optional[float], typer.Option("--within", min=0.0, max=1.0,
                                          help="--objective headroom: allowed throughput loss (fraction, default 0.05)")] = None,
    target_step_s: Annotated[Optional[float], typer.Option("--target-step-s", min=0.0,
                                                           help="--objective min-gpus: step time target (s)")] = None,
    target_tokens_per_day: Annotated[Optional[float], typer.Option(
        "--target-tokens-per-day", min=0.0, help="--objective min-gpus: throughput target (tokens/day)")] = None,
    pin_tp: Annotated[Optional[int], typer.Option("--tp", min=1, help="pin tensor parallel size")] = None,
    pin_pp: Annotated[Optional[int], typer.Option("--pp", min=1, help="pin pipeline parallel size")] = None,
    pin_cp: Annotated[Optional[int], typer.Option("--cp", min=1, help="pin context parallel size")] = None,
    pin_ep: Annotated[Optional[int], typer.Option("--ep", min=1, help="pin expert parallel size")] = None,
    pin_vpp: Annotated[Optional[int], typer.Option("--vpp", min=1, help="pin virtual pipeline size")] = None,
    pin_mbs: Annotated[Optional[int], typer.Option("--micro-batch-size", min=1, help="pin micro-batch size")] = None,
    pin_zero: Annotated[Optional[int], typer.Option("--zero-stage", min=0, max=3, help="pin ZeRO stage")] = None,
    pin_rc: Annotated[Optional[RecomputeOpt], typer.Option("--recompute", help="pin recompute")] = None,
    pin_first: Annotated[Optional[int], typer.Option(
        "--first-stage-layers", min=1, help="pin the decoder layers of the first pipeline stage")] = None,
    pin_last: Annotated[Optional[int], typer.Option(
        "--last-stage-layers", min=1, help="pin the decoder layers of the last pipeline stage")] = None,
    pin_schedule: ScheduleOptT = None,
    flops_convention: FlopsOpt = None, at_risk_margin: AtRiskOpt = AT_RISK_DEFAULT,
    expert_load_imbalance: ImbalanceOpt = None,
    capacity_factor: CapacityOpt = None, software_date: SoftwareDateOpt = None,
    moe_flex_dispatcher_backend: DispatcherOpt = None, moe_flex_dispatcher_num_sms: DispatcherSmsOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    train_tokens: TrainTokensOpt = None, gpu_hour_price: PriceOpt = None, async_checkpoint: AsyncCkptOpt = False,
    interruption_rate: RateOpt = None, restart_s: RestartOpt = None, pue: PueOpt = None,
    deadline_days: Annotated[Optional[float], typer.Option(
        "--deadline-days", help="--objective cost: cheapest plan that trains --train-tokens in this many days; "
                                "--objective min-gpus: fewest GPUs that do")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="draw cost against days over GPU counts (and clusters) to FILE.png|svg, the Pareto frontier "
                       "marked (needs --train-tokens)")] = None,
    gbs_tolerance: Annotated[Optional[float], typer.Option(
        "--global-batch-size-tolerance", min=0.0, max=0.99,
        help="when no layout plans the requested global batch, plan the nearest one within this fraction of it "
             "(reported in the title and as input.job.requested_global_batch_size)")] = None,
    timeline: Annotated[Optional[Path], typer.Option(
        "--timeline", help="pools (--cluster NAME:NODES,...): draw plan #--rank's schedule across the pools to "
                           "FILE.svg|png")] = None,
    time_budget: Annotated[float, typer.Option(
        "--time-budget", min=0.0, help="wall seconds for repeated planning (--objective min-gpus / cost, the search "
                                       "for the nearest feasible change or batch, --plot's sweep): it stops, saying so, when "
                                       "they are spent (default 60)")] = 60.0,
) -> None:
    """Search the parallel layouts and print the best plans (default: llama3.1-8b on one dgx-h100 node).

    --cluster A,B,C plans the same job on each cluster and ranks them by time and by cost (needs --train-tokens).
    --cluster NAME:NODES,NAME:NODES (or a YAML with pools:) plans one job over pools of different GPUs.
    """
    from ..api import compare as api_compare
    from ..api import cost_sweep
    from ..api import plan as api_plan
    from ..comparison import parse_cluster_option
    from ..errors import PlanInputError
    from ..progress import progress_line

    from cluster_specs.pools import is_pools_file
    check_format_emit(fmt, emit)
    choice = parse_cluster_option(cluster)
    if choice.kind == "pools" or (choice.kind == "single" and cluster is not None and is_pools_file(cluster)):
        given = [f for f, v in (("--gpus", gpus), ("--nodes", nodes), ("--pp", pin_pp), ("--vpp", pin_vpp),
                                ("--target-step-s", target_step_s), ("--within", within),
                                ("--target-tokens-per-day", target_tokens_per_day), ("--train-tokens", train_tokens),
                                ("--deadline-days", deadline_days), ("--plot", plot)) if v is not None]
        for flags, why in (((("--expert-load-imbalance", expert_load_imbalance), ("--capacity-factor", capacity_factor)),
                            "costs dropless MoE routing at its default expert imbalance"),
                           ((("--moe-flex-dispatcher-backend", moe_flex_dispatcher_backend),
                             ("--moe-flex-dispatcher-num-sms", moe_flex_dispatcher_num_sms)),
                            "times plan3d's default dispatcher (DeepEP across NVLink domains, the NCCL all-to-all "
                            "inside one)"),
                           ((("--software-date", software_date),), "times today's kernels"),
                           ((("--fp8-recipe", fp8_recipe),),
                            "runs the pools' shared default FP8 recipe (cost_models.fp8_recipe.shared_fp8_recipe)")):
            named = ", ".join(f for f, v in flags if v is not None)
            if named:
                raise PlanInputError(f"{named}: not available over pools (--cluster NAME:NODES,...): the pool planner "
                                     f"{why}; drop {named} or plan one cluster")
        if given or objective != ObjectiveOpt.throughput or solver != SolverOpt.cpsat:
            what = ', '.join(given) or '--objective/--solver'
            raise PlanInputError(f"{what}: not available over pools (--cluster NAME:NODES,...): a plan over pools "
                                 f"takes its GPUs from the pools' node counts, chooses pp and the layout itself and "
                                 f"maximises throughput; drop {what}")
        if framework is not None and framework != Framework.megatron or emit not in (None, Emit.megatron):
            raise PlanInputError("--framework/--emit: a plan over pools is a Megatron-LM --pipeline-model-parallel-"
                                 "layout; use megatron")
        if timeline is not None:  # before the pools search: a wrong suffix or no matplotlib fails at once
            from ..plotting import picture_path, require_matplotlib
            picture_path("--timeline", timeline)
            require_matplotlib("--timeline")
        _plan_pools(model, cluster, dict(
            global_batch_size=global_batch_size, seq_length=seq_length, precision=precision.value,
            flash_attention=flash_attention, dropout=dropout, memory_headroom=memory_headroom,
            at_risk_margin=at_risk_margin, flops_convention=enum_value(flops_convention), top_k=max(top_k, rank),
            tp=pin_tp, cp=pin_cp, ep=pin_ep, micro_batch_size=pin_mbs, zero_stage=pin_zero,
            recompute=enum_value(pin_rc)), fmt, output, emit, rank, timeline, launcher)
        return
    if timeline is not None:
        raise PlanInputError("--timeline on plan draws a plan over pools; for one cluster use plan3d explain "
                             "... --timeline FILE")
    if rank != 1 and emit is None:
        raise PlanInputError(f"--rank {rank} selects the plan --emit writes: give --emit "
                             f"{'|'.join(e.value for e in Emit)}")
    framework = rules_framework(framework, emit)  # an explicit --framework wins; else the rules of the --emit target
    if launcher != Launcher.scripts and emit is None:
        raise PlanInputError(f"--launcher {launcher.value} applies to --emit: give --emit "
                             f"{'|'.join(e.value for e in Emit)}")
    if plot is not None:  # checked before the search: a wrong suffix, no matplotlib or no token count fails at once
        from ..cost_plot import check_plot_path
        from ..plotting import require_matplotlib
        check_plot_path(plot)
        require_matplotlib("--plot")
        if train_tokens is None:
            raise PlanInputError("--plot draws cost against days: give --train-tokens")
    opts = dict(gpus=gpus, nodes=nodes, global_batch_size=global_batch_size,
                seq_length=seq_length, precision=precision.value, flash_attention=flash_attention,
                dropout=dropout, framework=framework.value, memory_headroom=memory_headroom,
                flops_convention=enum_value(flops_convention), top_k=max(top_k, rank if emit is not None else 1),
                solver=solver.value, objective=objective.value, within=within, target_step_s=target_step_s,
                target_tokens_per_day=target_tokens_per_day, tp=pin_tp, pp=pin_pp, cp=pin_cp, ep=pin_ep,
                vpp=pin_vpp, micro_batch_size=pin_mbs, zero_stage=pin_zero, recompute=enum_value(pin_rc),
                first_stage_layers=pin_first, last_stage_layers=pin_last, pipeline_schedule=enum_value(pin_schedule),
                train_tokens=train_tokens, gpu_hour_price=gpu_hour_price, async_checkpoint=async_checkpoint,
                interruption_rate=interruption_rate, restart_s=restart_s, pue=pue, deadline_days=deadline_days,
                at_risk_margin=at_risk_margin, expert_load_imbalance=expert_load_imbalance,
                capacity_factor=capacity_factor, software_date=software_date,
                moe_flex_dispatcher_backend=moe_flex_dispatcher_backend,
                moe_flex_dispatcher_num_sms=moe_flex_dispatcher_num_sms, fp8_recipe=fp8_recipe,
                time_budget_s=time_budget)
    if choice.kind != "single":
        if emit is not None:
            raise PlanInputError("--emit writes one plan: give one --cluster")
        if gbs_tolerance is not None:
            raise PlanInputError("--global-batch-size-tolerance plans one cluster: give one --cluster")
        cmp = api_compare(model, cluster, **opts)
        if plot is not None:
            draw_cost_sweep(cost_sweep(model, cluster, **opts), plot, cmp.model, train_tokens)
        render_comparison(cmp, fmt, output)
        if all(r.document is None for r in cmp.rows):  # as with one cluster: nothing fits is exit 1
            raise NoFeasiblePlan(f"no plan on any of the {len(cmp.rows)} clusters (each cluster's reason is in "
                                 f"its row)")
        return
    pins: dict = {}
    if emit is not None:  # before the search: a job the target cannot launch under any layout
        from ..api import check_launchable, launchable_pins
        check_launchable(emit.value, model, cluster, **opts)
        pins, note = launchable_pins(emit.value, model, cluster, **opts)  # ... or only with some knobs fixed
        if note is not None:
            opts.update(pins)
            sys.stderr.write(f"plan3d: note: {note}\n")
    try:
        with progress_line("plan3d plan") as progress:  # a status line on stderr while it is a terminal
            doc = api_plan(model, cluster, **opts, global_batch_size_tolerance=gbs_tolerance, progress=progress)
    except NoFeasiblePlan as e:
        if emit is None or not pins:
            raise
        from ..api import pins_text
        raise NoFeasiblePlan(f"{e} (searched with the pins --emit {emit.value} needs: {pins_text(pins)}; --emit "
                             f"megatron plans without them)") from None
    if plot is not None:
        draw_cost_sweep(cost_sweep(model, cluster, **opts), plot, doc.input.model.name, train_tokens)
    i, stats = doc.input, doc.search_stats
    if stats.note:
        sys.stderr.write(f"plan3d: note: {stats.note}\n")
    asked = i.job.requested_global_batch_size
    gbs = f"{i.job.global_batch_size}" + (f" (requested {asked}, tolerance {gbs_tolerance:g})"
                                          if asked is not None and asked != i.job.global_batch_size else "")
    render_plans(doc, fmt, output, emit,
                 f"plan3d: {i.model.name} on {i.cluster.num_gpus} x {i.cluster.gpu} ({i.cluster.name}), GBS "
                 f"{gbs} x seq {i.job.seq_length}, {i.job.precision}: top {len(doc.plans)} of "
                 f"{'' if stats.exact else 'at most '}{stats.num_feasible} feasible ({stats.num_candidates} examined)",
                 rank, framework.value, at_risk_margin, launcher)


def _plan_pools(model, cluster, opts: dict, fmt: Fmt, output: Path | None, emit: Emit | None, rank: int,
                timeline: Path | None, launcher: Launcher = Launcher.scripts) -> None:
    """``plan --cluster NAME:NODES,...``: the plans over the pools (planner.pools.plan_pools), as a table (plans and
    pool subsets), JSON or the Megatron launch of plan #rank; ``--timeline`` draws plan #rank's schedule."""
    from ..pools import plan_pools
    doc = plan_pools(model, cluster, **opts)
    if timeline is not None:
        from ..pool_report import draw_pools_timeline
        draw_pools_timeline(doc, timeline, rank)
    if emit is not None:
        emit_launch(doc, emit, output, rank, "megatron", launcher)
    elif fmt == Fmt.json:
        write_output(doc.model_dump_json(), output)
    else:
        import io

        from rich.console import Console

        from ..pool_report import plans_table, subsets_table
        from ..uncertainty import tie_note
        buf = io.StringIO() if output is not None else None
        con = Console(file=buf, width=200) if buf is not None else Console(width=max(200, Console().width))
        con.print(plans_table(doc))
        note = tie_note(doc.plans)
        if note is not None:
            con.print(note)
        con.print(subsets_table(doc))
        if buf is not None:
            write_output(buf.getvalue(), output)

