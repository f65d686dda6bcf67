"""The one-layout commands: ``evaluate`` (step time, memory and verdict), ``memory`` (per-stage breakdown)
and ``explain`` (every constraint with its slack)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .app import app
from .options import (AT_RISK_DEFAULT, AsyncCkptOpt, AtRiskOpt, CapacityOpt, ClusterOpt, CpOpt, DispatcherOpt,
                      DispatcherSmsOpt, DropoutOpt, Emit, Fp8RecipeOpt,
                      EpOpt, EtpOpt, FirstOpt, FlashOpt, FlopsOpt, Fmt, FmtOpt, Framework, FrameworkOpt, FullInitOpt,
                      GbsOpt, GpusOpt, HEADROOM_DEFAULT, HeadroomOpt, ImbalanceOpt, LastOpt, Launcher, LauncherOpt,
                      LayoutStrOpt, MasterDtypeOpt, MbsOpt, ModelOpt, MomentDtypeOpt, NodesOpt, OffloadModulesOpt,
                      OffloadOpt, OutOpt, ParamOffloadOpt, PpOpt, PrecOpt, Precision, PriceOpt, PueOpt, RateOpt,
                      RecomputeLayersOpt, RecomputeLayoutOpt, RecomputeMethodOpt, RecomputeModulesOpt, RecomputeOpt,
                      RestartOpt, ScheduleOptT, SeqOpt, SoftwareDateOpt, SpOpt, TpOpt, TrainTokensOpt, VppOpt,
                      ZeroOpt, check_format_emit, layout_kwargs, rules_framework)
from .output import open_output, render_plans, write_output


@app.command()
def evaluate(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = None, precision: PrecOpt = Precision.bf16,
    flash_attention: FlashOpt = True, dropout: DropoutOpt = False,
    tp: TpOpt = 1, pp: PpOpt = 1, cp: CpOpt = 1, ep: EpOpt = 1, etp: EtpOpt = None, vpp: VppOpt = 1,
    micro_batch_size: MbsOpt = 1, zero_stage: ZeroOpt = 0, recompute: RecomputeLayoutOpt = RecomputeOpt.none,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = False,
    first_stage_layers: FirstOpt = None, last_stage_layers: LastOpt = None,
    pipeline_schedule: ScheduleOptT = None,
    memory_headroom: HeadroomOpt = HEADROOM_DEFAULT,
    framework: Annotated[Optional[Framework], typer.Option(
        "--framework", help="framework whose rules apply (default: the --emit target, else megatron)")] = None,
    fmt: FmtOpt = Fmt.table, output: OutOpt = None,
    emit: Annotated[Optional[Emit], typer.Option(
        "--emit", help="print (or with --output DIR write) this framework's launch config of the configuration; "
                       "refused when the configuration is infeasible")] = None,
    launcher: LauncherOpt = Launcher.scripts,
    flops_convention: FlopsOpt = None, at_risk_margin: AtRiskOpt = AT_RISK_DEFAULT,
    full_model_init: FullInitOpt = False,
    pipeline_layout: LayoutStrOpt = None, recompute_modules: RecomputeModulesOpt = None,
    offload_modules: OffloadModulesOpt = None,
    recompute_method: RecomputeMethodOpt = "block",
    optimizer_cpu_offload: OffloadOpt = 0.0, param_cpu_offload: ParamOffloadOpt = False,
    exp_avg_dtype: MomentDtypeOpt = "fp32", exp_avg_sq_dtype: MomentDtypeOpt = "fp32",
    main_params_dtype: MasterDtypeOpt = "fp32", expert_load_imbalance: ImbalanceOpt = None,
    capacity_factor: CapacityOpt = None, software_date: SoftwareDateOpt = None,
    moe_flex_dispatcher_backend: DispatcherOpt = None, moe_flex_dispatcher_num_sms: DispatcherSmsOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    train_tokens: TrainTokensOpt = None, gpu_hour_price: PriceOpt = None, async_checkpoint: AsyncCkptOpt = False,
    interruption_rate: RateOpt = None, restart_s: RestartOpt = None, pue: PueOpt = None,
) -> None:
    """Evaluate one given configuration (feasible or not). Options left out take Megatron-LM's defaults.

    dp is derived: GPUs / (tp * pp * cp). When pp does not divide the layers and no split is given, the end
    stages get fewer layers (Megatron's --decoder-first/last-pipeline-num-layers).
    """
    given = dict(locals())  # the parameters: layout_kwargs picks the API's options
    from ..api import evaluate as api_evaluate
    check_format_emit(fmt, emit)
    framework = rules_framework(framework, emit)
    doc = api_evaluate(**layout_kwargs({**given, "framework": framework}),
        train_tokens=train_tokens, gpu_hour_price=gpu_hour_price, async_checkpoint=async_checkpoint,
        interruption_rate=interruption_rate, restart_s=restart_s, pue=pue)
    i = doc.input
    render_plans(doc, fmt, output, emit,
                 f"plan3d evaluate: {i.model.name} on {i.cluster.num_gpus} x {i.cluster.gpu} ({i.cluster.name})",
                 framework=framework.value, at_risk_margin=at_risk_margin, launcher=launcher)


@app.command()
def memory(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = None, precision: PrecOpt = Precision.bf16,
    flash_attention: FlashOpt = True, dropout: DropoutOpt = False,
    tp: TpOpt = 1, pp: PpOpt = 1, cp: CpOpt = 1, ep: EpOpt = 1, etp: EtpOpt = None, vpp: VppOpt = 1,
    micro_batch_size: MbsOpt = 1, zero_stage: ZeroOpt = 0, recompute: RecomputeLayoutOpt = RecomputeOpt.none,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = False,
    first_stage_layers: FirstOpt = None, last_stage_layers: LastOpt = None,
    pipeline_schedule: ScheduleOptT = None,
    memory_headroom: HeadroomOpt = HEADROOM_DEFAULT, framework: FrameworkOpt = Framework.megatron,
    fmt: FmtOpt = Fmt.table, output: OutOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="draw the per-stage breakdown to FILE.png|svg")] = None,
    capacity_factor: CapacityOpt = None,
    at_risk_margin: AtRiskOpt = AT_RISK_DEFAULT, full_model_init: FullInitOpt = False,
    pipeline_layout: LayoutStrOpt = None, recompute_modules: RecomputeModulesOpt = None,
    offload_modules: OffloadModulesOpt = None,
    recompute_method: RecomputeMethodOpt = "block",
    optimizer_cpu_offload: OffloadOpt = 0.0, param_cpu_offload: ParamOffloadOpt = False,
    exp_avg_dtype: MomentDtypeOpt = "fp32", exp_avg_sq_dtype: MomentDtypeOpt = "fp32",
    main_params_dtype: MasterDtypeOpt = "fp32", expert_load_imbalance: ImbalanceOpt = None,
    software_date: SoftwareDateOpt = None,
    moe_flex_dispatcher_backend: DispatcherOpt = None, moe_flex_dispatcher_num_sms: DispatcherSmsOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
) -> None:
    """Per-stage memory breakdown of one configuration (largest terms first, the total of each phase: init,
    forward, backward, optimizer; the backend buffers named).

    Same options as evaluate, and the same verdict: exit 1 when the peak stage is over the headroom or the layout
    breaks a rule (infeasible, as in evaluate and explain; the verdict line names the rule), exit 0 when it fits or
    is at risk; the report is printed either way.
    """
    given = dict(locals())  # the parameters: layout_kwargs picks the API's options
    from ..api import memory as api_memory
    from ..document import to_json
    from ..memory_report import memory_table, plot_memory
    rep = api_memory(**layout_kwargs(given))
    if plot is not None:
        plot_memory(rep.estimate, plot, rep.title, at_risk_margin, memory_headroom)
    if fmt == Fmt.json:
        write_output(to_json(rep.document), output)
    else:
        from rich.console import Console
        if output is not None:
            with open_output(output) as fh:
                con = Console(file=fh, width=200)
                con.print(rep.title, highlight=False)
                con.print(memory_table(rep.estimate, "", rep.memory_headroom, rep.at_risk_margin))
                con.print(f"verdict: {rep.verdict}", highlight=False)
        else:
            con = Console(width=max(240, Console().width))
            con.print(rep.title, highlight=False)
            con.print(memory_table(rep.estimate, "", rep.memory_headroom, rep.at_risk_margin))
            con.print(f"verdict: {rep.verdict}", highlight=False)
    rep.raise_if_infeasible()


@app.command()
def explain(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = None, precision: PrecOpt = Precision.bf16,
    flash_attention: FlashOpt = True, dropout: DropoutOpt = False,
    tp: TpOpt = 1, pp: PpOpt = 1, cp: CpOpt = 1, ep: EpOpt = 1, etp: EtpOpt = None, vpp: VppOpt = 1,
    micro_batch_size: MbsOpt = 1, zero_stage: ZeroOpt = 0, recompute: RecomputeLayoutOpt = RecomputeOpt.none,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = False,
    first_stage_layers: FirstOpt = None, last_stage_layers: LastOpt = None,
    pipeline_schedule: ScheduleOptT = None,
    memory_headroom: HeadroomOpt = HEADROOM_DEFAULT, framework: FrameworkOpt = Framework.megatron,
    fmt: FmtOpt = Fmt.table, output: OutOpt = None,
    timeline: Annotated[Optional[Path], typer.Option(
        "--timeline", help="draw the simulated pipeline schedule to FILE.svg or FILE.png")] = None,
    at_risk_margin: AtRiskOpt = AT_RISK_DEFAULT, full_model_init: FullInitOpt = False,
    pipeline_layout: LayoutStrOpt = None, recompute_modules: RecomputeModulesOpt = None,
    offload_modules: OffloadModulesOpt = None,
    recompute_method: RecomputeMethodOpt = "block",
    optimizer_cpu_offload: OffloadOpt = 0.0, param_cpu_offload: ParamOffloadOpt = False,
    exp_avg_dtype: MomentDtypeOpt = "fp32", exp_avg_sq_dtype: MomentDtypeOpt = "fp32",
    main_params_dtype: MasterDtypeOpt = "fp32", expert_load_imbalance: ImbalanceOpt = None,
    capacity_factor: CapacityOpt = None, software_date: SoftwareDateOpt = None,
    moe_flex_dispatcher_backend: DispatcherOpt = None, moe_flex_dispatcher_num_sms: DispatcherSmsOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
) -> None:
    """List every constraint of one given configuration with its slack (same options as ``evaluate``).

    Exit code 0 when the configuration is feasible, 1 when a constraint is violated.
    """
    given = dict(locals())  # the parameters: layout_kwargs picks the API's options
    from ..api import explain as api_explain
    from ..explanation import format_slack
    rep = api_explain(**layout_kwargs(given))
    ex, par, i = rep.explanation, rep.parallel, rep.inputs
    where = f"{i.model.name} on {i.num_gpus} x {i.cluster.gpu.name} ({i.cluster.name})"
    if timeline is not None:
        from ..timeline import draw_timeline
        if ex.evaluation.step is None:
            from ..errors import PlanInputError
            raise PlanInputError(f"--timeline {timeline}: the configuration has no step estimate (invalid layout)")
        draw_timeline(ex.evaluation.step, timeline, where)
    if fmt == Fmt.json:
        from ..document import dumps_finite
        write_output(dumps_finite(rep.to_dict(), "explain report", indent=2, sort_keys=True) + "\n", output)
    else:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=f"plan3d explain: {where}, tp {par.tp} pp {par.pp} "
                        f"dp {par.dp} cp {par.cp} ep {par.ep} vpp {par.vpp} mbs {par.micro_batch_size} zero "
                        f"{par.zero_stage} recompute {par.recompute} sp {'y' if par.sequence_parallel else 'n'}",
                  title_justify="left")
        for col in ("constraint", "ok", "slack", "detail"):
            t.add_column(col)
        for k in ex.constraints:
            t.add_row(k.name, "yes" if k.ok else "NO", format_slack(k), k.detail)
        st = ex.evaluation.step
        if output is not None:
            with open_output(output) as fh:
                Console(file=fh, width=200).print(t)
        else:
            con = Console(width=max(160, Console().width))
            con.print(t)
            if st is not None:
                con.print(f"step {st.step_s:.3f} s, {st.tokens_per_s:,.0f} tokens/s, MFU {st.mfu:.1%}")
            if rep.memory_verdict is not None:
                con.print(f"memory verdict: {rep.memory_verdict}", highlight=False)
    rep.raise_if_infeasible()

