"""The ``plan3d`` command line (typer + rich).

Exit codes: 0 success, 1 no feasible plan, 2 bad input. Errors are one line on stderr, never a traceback.
"""
from __future__ import annotations

import math
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from .api import MAX_TOP_K  # light: planner.api imports only planner.errors at module level

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="plan3d: plan DP x PP x TP x CP x EP layouts for large-transformer training.")


class Fmt(str, Enum):
    table = "table"
    json = "json"


class DocumentKind(str, Enum):
    """Documents ``plan3d schema`` describes (``planner.document.DOCUMENT_KINDS``)."""
    plan = "plan"
    pools = "pools"
    comparison = "comparison"
    fallback = "fallback"


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp32 = "fp32"


class RecomputeOpt(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class SolverOpt(str, Enum):
    cpsat = "cpsat"
    enumerate = "enumerate"


class ObjectiveOpt(str, Enum):
    throughput = "throughput"
    headroom = "headroom"
    min_gpus = "min-gpus"
    cost = "cost"


class Framework(str, Enum):
    megatron = "megatron"
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"


class Emit(str, Enum):
    """``--emit`` targets: the frameworks whose rules plan3d models, and Colossal-AI (planned under Megatron-LM's
    rules unless --framework says otherwise)."""
    megatron = "megatron"
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"
    colossalai = "colossalai"


class Launcher(str, Enum):
    scripts = "scripts"
    k8s = "k8s"


LauncherOpt = Annotated[Launcher, typer.Option(
    "--launcher", help="with --emit: scripts (torchrun + Slurm, default) or k8s (a Kubeflow PyTorchJob manifest)")]


def _check_format_emit(fmt: Fmt, emit) -> None:
    """--format json and --emit both choose what is printed: refuse the pair (the plan document's ``launch`` section
    carries the arguments --emit writes) rather than ignore one."""
    if emit is not None and fmt == Fmt.json:
        from .errors import PlanInputError
        raise PlanInputError(f"--format json with --emit {emit.value}: --emit prints the launch, --format json the "
                             f"plan document (whose launch section holds the same arguments); give one of them")


def _rules(framework, emit):
    """The framework whose rules plan and evaluate apply: --framework, else the --emit target when plan3d models
    it, else Megatron-LM (Colossal-AI's TP/SP follow Megatron's)."""
    if framework is not None:
        return framework
    return Framework(emit.value) if emit is not None and emit.value in Framework.__members__ else Framework.megatron


class ScheduleOpt(str, Enum):
    """Pipeline schedules (``cost_models.config.Schedule``; which framework runs which: ``schedule_checks.FRAMEWORK_SCHEDULES``)."""
    f1b = "1f1b"
    interleaved = "interleaved"
    gpipe = "gpipe"
    zb_h1 = "zb-h1"
    zb_v = "zb-v"
    dualpipe = "dualpipe"
    dualpipev = "dualpipev"
    combined_1f1b = "combined-1f1b"


ScheduleOptT = Annotated[Optional[ScheduleOpt], typer.Option(
    "--pipeline-schedule", help="pipeline schedule (default 1f1b, interleaved when --vpp > 1); zb-v and dualpipev "
                                "run two chunks per rank (--vpp 2)")]


class FlopsConv(str, Enum):
    megatron = "megatron"
    palm = "palm"


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="built-in name, our YAML, a HF config.json path, "
                                                              "or a Hugging Face Hub id org/name[@revision]")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="built-in name or YAML path (plan: A,B,C compares "
                                                                   "clusters by time and cost)")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", min=1, help="number of GPUs (a multiple of the node size, or a divisor of it: part of one node)")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", min=1, help="number of nodes")]
GbsOpt = Annotated[int, typer.Option("--global-batch-size", min=1, help="sequences per optimizer step")]
SeqOpt = Annotated[int, typer.Option("--seq-length", min=1, help="tokens per sequence")]
PrecOpt = Annotated[Precision, typer.Option(
    "--precision", help="GEMM precision: bf16, fp16, fp8, or fp32 (single precision, GEMMs on the TF32 tensor cores, "
                        "MFU against the TF32 peak)")]
FmtOpt = Annotated[Fmt, typer.Option("--format", help="table or json")]
OutOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="write the output to this file")]
#: Same default as planner.checks.DEFAULT_MEMORY_HEADROOM (a test keeps them equal; not imported here to keep
#: CLI start-up light), so evaluate/memory agree with what plan accepts.
HEADROOM_DEFAULT = 0.05
HeadroomOpt = Annotated[float, typer.Option("--memory-headroom", min=0.0, max=0.5,
                                            help="fraction of GPU memory kept free (default 0.05)")]
#: Same default as planner.checks.DEFAULT_AT_RISK_MARGIN (a test keeps them equal).
AT_RISK_DEFAULT = 0.10
AtRiskOpt = Annotated[float, typer.Option(
    "--at-risk-margin", min=0.0, max=0.5,
    help="a peak within this fraction of capacity (but inside the headroom) fits and is flagged at risk; plan "
         "ranks such plans last (default 0.10)")]
FullInitOpt = Annotated[bool, typer.Option(
    "--full-model-init/--sharded-init",
    help="each rank first materializes its whole 16-bit model (DeepSpeed without zero.Init): checked as the init "
         "phase")]
ImbalanceOpt = Annotated[Optional[float], typer.Option(
    "--expert-load-imbalance", min=1.0,
    help="dropless MoE: the busiest expert's routed tokens over the mean in one micro-batch (1 = balanced, e.g. "
         "--moe-router-force-load-balancing); sets how much more the busiest EP rank holds (default: 2.21 for 256 "
         "experts, 1.61 for 8; cost_models/moe_imbalance.py)")]
FlopsOpt = Annotated[Optional[FlopsConv], typer.Option(
    "--flops-convention", help="model FLOPs behind TFLOP/s and MFU: megatron (causal attention halved, "
                               "Megatron-LM's logger) or palm (6N + 12LHQT, torchtitan)")]
FrameworkOpt = Annotated[Framework, typer.Option("--framework", help="framework whose rules apply")]
FlashOpt = Annotated[bool, typer.Option("--flash-attention/--no-flash-attention",
                                        help="fused attention (no s x s scores stored or streamed; default on)")]
DropoutOpt = Annotated[bool, typer.Option("--dropout/--no-dropout",
                                          help="dropout layers present (masks stored; default off)")]
# --- whole-run cost (planner/cost.py) ---
TrainTokensOpt = Annotated[Optional[float], typer.Option(
    "--train-tokens", help="tokens to train (e.g. 15.6e12): each plan gets its days, GPU-hours, goodput, energy "
                           "and dollars")]
PriceOpt = Annotated[Optional[str], typer.Option(
    "--gpu-hour-price", help="USD per GPU-hour (2.5), or NAME=USD pairs per cluster (dgx-h100=2.5,dgx-h200=3.1); "
                             "default: the cluster's own dated price")]
AsyncCkptOpt = Annotated[bool, typer.Option(
    "--async-checkpoint/--no-async-checkpoint", help="asynchronous checkpoints (Megatron --async-save, torch DCP "
                                                     "async_save): the write runs behind compute (default off)")]
RateOpt = Annotated[Optional[float], typer.Option(
    "--interruption-rate", help="unexpected job interruptions per GPU-hour (default: the cluster's, Meta's Llama 3 "
                                "figure 1.97e-5)")]
RestartOpt = Annotated[Optional[float], typer.Option(
    "--restart-s", help="seconds from an interruption to training again (default: the cluster's, 388 s)")]
PueOpt = Annotated[Optional[float], typer.Option("--pue", help="power usage effectiveness (default: the cluster's)")]


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as e:
        from .errors import PlanInputError
        raise PlanInputError(f"--output {output}: {e.strerror}") from None


class _OutputFile:
    """``--output`` opened for writing: an OSError while opening, writing, flushing or closing it (a full disk,
    ``/proc/version``) is the one-line ``--output PATH: reason`` error."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = self._do(lambda: path.open("w"))

    def _do(self, f):
        try:
            return f()
        except OSError as e:
            from .errors import PlanInputError
            raise PlanInputError(f"--output {self.path}: {e.strerror}") from None

    def write(self, text: str) -> int:
        return self._do(lambda: self.fh.write(text))

    def flush(self) -> None:
        self._do(self.fh.flush)

    def close(self) -> None:
        self._do(self.fh.close)

    def isatty(self) -> bool:
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_output(output: Path) -> _OutputFile:
    """``output`` opened for writing; an OSError becomes the one-line ``--output PATH: reason`` error."""
    return _OutputFile(output)


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def _plans_table(doc, title: str, at_risk_margin: float = AT_RISK_DEFAULT):
    from rich.table import Table
    caption = (f"peak GiB: most loaded stage / GPU capacity (GiB = 2^30 bytes); ! = at risk (within "
               f"{at_risk_margin:.0%} of capacity), OOM = over it; full N/chunk = the first N layers of each model chunk recomputed (Megatron --recompute-method block)")
    thr = next((p.throughput for p in doc.plans if p.throughput), None)
    if thr is not None:
        kind = "TF32" if thr.mfu_peak_dtype == "tf32" else "16-bit"
        caption += (f"; MFU = model FLOPs ({thr.flops_convention} count) / dense {kind} peak "
                    f"{thr.peak_flops_per_gpu / 1e12:.0f} TFLOP/s per GPU")
    cf = doc.input.job.moe_expert_capacity_factor
    if cf is not None:
        caption += f"; MoE routing: drop-and-pad to capacity factor {cf:g} (no host sync on the token counts)"
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    from .cost_report import money
    costed = any(p.cost is not None for p in doc.plans)
    # knobs that only some plans vary get their column when they do, so that no two rows read the same: the expert
    # tensor parallel size of a MoE model, a pipeline schedule other than 1F1B / interleaved 1F1B
    moe = doc.input.model.moe_experts is not None
    sched = any(p.parallel.pipeline_schedule not in ("1f1b", "interleaved") for p in doc.plans)
    cols = ["#", "tp", "pp", "split", "dp", "cp", "ep", *(["etp"] if moe else []), "vpp", "mbs", "zero", "sp",
            "recompute", *(["schedule"] if sched else []), "peak GiB", "step s", "tokens/s", "TFLOP/s/GPU", "MFU", "ok"]
    for col in cols + (["days", "GPU-hours", "$"] if costed else []):
        t.add_column(col, justify="right")
    if costed:
        t.caption += "; days: with interruptions, restarts and checkpoints (plan 1 in detail below)"
    for p in doc.plans:
        extra = []
        if costed:
            c = p.cost
            extra = ["-", "-", "-"] if c is None else [f"{c.effective_days:.4g}", f"{c.gpu_hours:,.0f}", money(c.usd)]
        q = p.parallel
        peak = f"{_gib(p.memory.peak_bytes)}/{_gib(p.memory.capacity_bytes)}" if p.memory else "-"
        if p.memory and p.memory.at_risk:
            peak += " !"
        elif p.memory and p.memory.peak_bytes > p.memory.capacity_bytes:
            peak += " OOM"
        t.add_row(str(p.rank), str(q.tp), str(q.pp), _split_str(q), str(q.dp), str(q.cp), str(q.ep),
                  *([str(q.etp)] if moe else []), str(q.vpp),
                  str(q.micro_batch_size), str(q.zero_stage), "y" if q.sequence_parallel else "n",
                  q.recompute if q.recompute_num_layers is None else f"full {q.recompute_num_layers}/chunk",
                  *([q.pipeline_schedule] if sched else []),
                  peak, _step_cell(p.time),
                  f"{p.throughput.tokens_per_s:,.0f}" if p.throughput else "-",
                  f"{p.throughput.tflops_per_gpu:.0f}" if p.throughput else "-",
                  f"{p.throughput.mfu:.1%}" if p.throughput else "-",
                  "yes" if p.feasible else "NO", *extra)
    return t


def _step_cell(tim) -> str:
    """Step seconds with the half-width of its uncertainty interval (time.step_s_high), e.g. ``24.176 ±14%``."""
    if tim is None:
        return "-"
    if not tim.step_s_high or not tim.step_s:
        return f"{tim.step_s:.3f}"
    return f"{tim.step_s:.3f} ±{100 * (tim.step_s_high / tim.step_s - 1):.0f}%"


def _tie_note(doc) -> str | None:
    """The line under ``plan``'s table when the top plans lie within each other's uncertainty interval."""
    from .uncertainty import tied_with_best
    plans = [(p.time.step_s, p.time.step_s_low, p.time.step_s_high) for p in doc.plans
             if p.feasible and p.time is not None and p.time.step_s_low is not None]
    n = tied_with_best(plans)
    if n < 2:
        return None
    return (f"plans 1-{n} are effectively tied: their step times lie within each other's ± interval (the "
            f"cross-validated error of 80% of published runs like these)")


def _split_str(q) -> str:
    """The table's layer split: first/last stage layers of an uneven split, "acct" for the account-for-embedding/
    loss split, "-" for an even one."""
    if q.first_stage_layers is not None or q.last_stage_layers is not None:
        return f"{q.first_stage_layers or '-'}/{q.last_stage_layers or '-'}"
    return "acct" if q.account_for_embedding_in_pipeline_split else "-"


def _emit(doc, emit: Emit, output: Path | None, rank: int, framework: str | None = None,
          launcher: Launcher = Launcher.scripts) -> None:
    """``--emit``: without ``--output`` print the plan's main config to stdout (Megatron command line, DeepSpeed
    JSON, torchtitan TOML); with ``--output DIR`` write every file of planner.emit.emit_files into DIR.
    An infeasible configuration (``evaluate``) is refused (exit 1): every emitted config passes the checker.
    A plan ranked under another framework's rules (an explicit ``--framework``) is emitted with a note."""
    from .emit import EmitError, EmitUnsupported, emit_files
    from .errors import NoFeasiblePlan, PlanInputError
    plan = next((p for p in doc.plans if p.rank == rank), None)
    if plan is not None and not plan.feasible:
        raise NoFeasiblePlan(f"plan #{rank} is infeasible, nothing emitted: {'; '.join(plan.violations)}")
    try:
        files = emit_files(doc, emit.value, rank, launcher.value)
    except EmitUnsupported as e:  # a valid plan the target framework cannot run: like an infeasible plan
        ok = [p.rank for p in doc.plans if p.feasible and emit.value not in p.launch.unsupported]
        hint = f"; plan #{ok[0]} can run on {emit.value} (--rank {ok[0]})" if ok else (
            f"; none of the top {len(doc.plans)} plans can: raise --top-k, or pin the knob named above "
            f"(--tp --pp --cp --ep --zero-stage --recompute)" if len(doc.plans) > 1 else "")
        raise NoFeasiblePlan(f"{e}{hint}") from None
    except EmitError as e:  # no such rank
        raise PlanInputError(str(e)) from None
    if framework is not None and framework != emit.value and emit.value not in Framework.__members__:
        sys.stderr.write(f"plan3d: note: memory and time were computed under {framework} rules (plan3d has no "
                         f"{emit.value} cost rules); the emitted arguments express the same layout\n")
    elif framework is not None and framework != emit.value:
        sys.stderr.write(f"plan3d: note: memory and time were computed under {framework} rules; {emit.value} "
                         f"runs the layout its own way (plan with --framework {emit.value} to rank under its "
                         f"rules)\n")
    if output is None:
        if launcher == Launcher.k8s:
            text = files["pytorchjob.yaml"]
        elif emit == Emit.colossalai:
            text = files["colossalai_plugin.py"]
        elif emit == Emit.megatron:
            args = next(p for p in doc.plans if p.rank == rank).launch.megatron
            text = " \\\n  ".join(["pretrain_gpt.py"] + _pair_args(args)) + "\n"
        else:
            text = files["ds_config.json" if emit == Emit.deepspeed else "torchtitan.toml"]
        sys.stdout.write(text)
        if "megatron_deepspeed_unsupported.txt" in files:
            why = next(p for p in doc.plans if p.rank == rank).launch.unsupported["megatron_deepspeed"]
            sys.stderr.write(f"plan3d: note: ds_config.json only; no Megatron-DeepSpeed launch: {why}\n")
        return
    if output.suffix.lower() in (".json", ".toml", ".txt", ".yaml", ".yml", ".sh") and not output.is_dir():
        raise PlanInputError(f"--output {output}: with --emit, --output is a directory for the files "
                             f"({', '.join(files)}); leave out --output to print the main config")
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = output / name
            path.write_text(text)
            if name.endswith((".sh", ".sbatch")):
                path.chmod(0o755)
    except OSError as e:
        raise PlanInputError(f"--output {output}: {e.strerror}") from None
    for name in files:
        sys.stdout.write(f"{output / name}\n")


def _render(doc, fmt: Fmt, output: Path | None, emit: Emit | None, title: str, rank: int = 1,
            framework: str | None = None, at_risk_margin: float = AT_RISK_DEFAULT,
            launcher: Launcher = Launcher.scripts) -> None:
    from .document import to_json
    if emit is not None:
        _emit(doc, emit, output, rank, framework, launcher)
        return
    if launcher != Launcher.scripts:
        from .errors import PlanInputError
        raise PlanInputError(f"--launcher {launcher.value} applies to --emit: give --emit "
                             f"{'|'.join(e.value for e in Emit)}")
    if fmt == Fmt.json:
        _write(to_json(doc), output)
        return
    from rich.console import Console

    from .cost_report import cost_lines
    width = 190 if any(p.cost is not None for p in doc.plans) else 160  # room for days, GPU-hours and $
    if output is not None:
        import io
        buf = io.StringIO()
        con = Console(file=buf, width=width)
        con.print(_plans_table(doc, title, at_risk_margin))
        for line in cost_lines(doc):
            con.print(line, highlight=False)
        note = _tie_note(doc)
        if note is not None:
            con.print(note)
        _write(buf.getvalue(), output)  # one-line error naming the path and the OS reason
        return
    console = Console(width=max(width, Console().width))
    console.print(_plans_table(doc, title, at_risk_margin))
    for p in doc.plans:
        for v in p.violations:
            console.print(f"  plan {p.rank}: {v}")
    note = _tie_note(doc)
    if note is not None:
        console.print(note)
    for line in cost_lines(doc):
        console.print(line, highlight=False)


def _pair_args(args: list[str]) -> list[str]:
    """One shell-quoted ``--flag value`` per item: the emitters' own ``pair_args`` (the same code path as the
    files written with ``--output``), so the printed command is valid shell."""
    from .emit.megatron import pair_args
    return pair_args(args)


@app.command()
def plan(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = 4096, precision: PrecOpt = Precision.bf16,
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
    capacity_factor: CapacityOpt = None,
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
    from .api import compare as api_compare
    from .api import cost_sweep
    from .api import plan as api_plan
    from .comparison import parse_cluster_option
    from .errors import PlanInputError
    from .progress import progress_line

    from cluster_specs.pools import is_pools_file
    _check_format_emit(fmt, emit)
    choice = parse_cluster_option(cluster)
    if choice.kind == "pools" or (choice.kind == "single" and cluster is not None and is_pools_file(cluster)):
        given = [f for f, v in (("--gpus", gpus), ("--nodes", nodes), ("--pp", pin_pp), ("--vpp", pin_vpp),
                                ("--target-step-s", target_step_s), ("--within", within),
                                ("--target-tokens-per-day", target_tokens_per_day), ("--train-tokens", train_tokens),
                                ("--deadline-days", deadline_days), ("--plot", plot)) if v is not None]
        routing = [f for f, v in (("--expert-load-imbalance", expert_load_imbalance),
                                  ("--capacity-factor", capacity_factor)) if v is not None]
        if routing:
            raise PlanInputError(f"{', '.join(routing)}: not available over pools (--cluster NAME:NODES,...): the pool "
                                 f"planner costs dropless MoE routing at its default expert imbalance; drop "
                                 f"{', '.join(routing)} or plan one cluster")
        if given or objective != ObjectiveOpt.throughput or solver != SolverOpt.cpsat:
            what = ', '.join(given) or '--objective/--solver'
            raise PlanInputError(f"{what}: not available over pools (--cluster NAME:NODES,...): a plan over pools "
                                 f"takes its GPUs from the pools' node counts, chooses pp and the layout itself and "
                                 f"maximises throughput; drop {what}")
        if framework is not None and framework != Framework.megatron or emit not in (None, Emit.megatron):
            raise PlanInputError("--framework/--emit: a plan over pools is a Megatron-LM --pipeline-model-parallel-"
                                 "layout; use megatron")
        if timeline is not None:  # before the pools search: a wrong suffix or no matplotlib fails at once
            from .plotting import picture_path, require_matplotlib
            picture_path("--timeline", timeline)
            require_matplotlib("--timeline")
        _plan_pools(model, cluster, dict(
            global_batch_size=global_batch_size, seq_length=seq_length, precision=precision.value,
            flash_attention=flash_attention, dropout=dropout, memory_headroom=memory_headroom,
            at_risk_margin=at_risk_margin, flops_convention=_value(flops_convention), top_k=max(top_k, rank),
            tp=pin_tp, cp=pin_cp, ep=pin_ep, micro_batch_size=pin_mbs, zero_stage=pin_zero,
            recompute=_value(pin_rc)), fmt, output, emit, rank, timeline, launcher)
        return
    if timeline is not None:
        raise PlanInputError("--timeline on plan draws a plan over pools; for one cluster use plan3d explain "
                             "... --timeline FILE")
    if rank != 1 and emit is None:
        raise PlanInputError(f"--rank {rank} selects the plan --emit writes: give --emit "
                             f"{'|'.join(e.value for e in Emit)}")
    framework = _rules(framework, emit)  # an explicit --framework wins; else the rules of the --emit target
    if launcher != Launcher.scripts and emit is None:
        raise PlanInputError(f"--launcher {launcher.value} applies to --emit: give --emit "
                             f"{'|'.join(e.value for e in Emit)}")
    if plot is not None:  # checked before the search: a wrong suffix, no matplotlib or no token count fails at once
        from .cost_plot import check_plot_path
        from .plotting import require_matplotlib
        check_plot_path(plot)
        require_matplotlib("--plot")
        if train_tokens is None:
            raise PlanInputError("--plot draws cost against days: give --train-tokens")
    opts = dict(gpus=gpus, nodes=nodes, global_batch_size=global_batch_size,
                seq_length=seq_length, precision=precision.value, flash_attention=flash_attention,
                dropout=dropout, framework=framework.value, memory_headroom=memory_headroom,
                flops_convention=_value(flops_convention), top_k=max(top_k, rank if emit is not None else 1),
                solver=solver.value, objective=objective.value, within=within, target_step_s=target_step_s,
                target_tokens_per_day=target_tokens_per_day, tp=pin_tp, pp=pin_pp, cp=pin_cp, ep=pin_ep,
                vpp=pin_vpp, micro_batch_size=pin_mbs, zero_stage=pin_zero, recompute=_value(pin_rc),
                first_stage_layers=pin_first, last_stage_layers=pin_last, pipeline_schedule=_value(pin_schedule),
                train_tokens=train_tokens, gpu_hour_price=gpu_hour_price, async_checkpoint=async_checkpoint,
                interruption_rate=interruption_rate, restart_s=restart_s, pue=pue, deadline_days=deadline_days,
                at_risk_margin=at_risk_margin, expert_load_imbalance=expert_load_imbalance,
                capacity_factor=capacity_factor, time_budget_s=time_budget)
    if choice.kind != "single":
        if emit is not None:
            raise PlanInputError("--emit writes one plan: give one --cluster")
        if gbs_tolerance is not None:
            raise PlanInputError("--global-batch-size-tolerance plans one cluster: give one --cluster")
        cmp = api_compare(model, cluster, **opts)
        if plot is not None:
            _plot(cost_sweep(model, cluster, **opts), plot, cmp.model, train_tokens)
        _render_comparison(cmp, fmt, output)
        if all(r.document is None for r in cmp.rows):  # as with one cluster: nothing fits is exit 1
            from .errors import NoFeasiblePlan
            raise NoFeasiblePlan(f"no plan on any of the {len(cmp.rows)} clusters (each cluster's reason is in "
                                 f"its row)")
        return
    if emit is not None:  # before the search: a job the target cannot launch under any layout
        from .api import check_launchable
        check_launchable(emit.value, model, cluster, **opts)
    with progress_line("plan3d plan") as progress:  # a status line on stderr while it is a terminal
        doc = api_plan(model, cluster, **opts, global_batch_size_tolerance=gbs_tolerance, progress=progress)
    if plot is not None:
        _plot(cost_sweep(model, cluster, **opts), plot, doc.input.model.name, train_tokens)
    i, stats = doc.input, doc.search_stats
    if stats.note:
        sys.stderr.write(f"plan3d: note: {stats.note}\n")
    asked = i.job.requested_global_batch_size
    gbs = f"{i.job.global_batch_size}" + (f" (requested {asked}, tolerance {gbs_tolerance:g})"
                                          if asked is not None and asked != i.job.global_batch_size else "")
    _render(doc, fmt, output, emit,
            f"plan3d: {i.model.name} on {i.cluster.num_gpus} x {i.cluster.gpu} ({i.cluster.name}), GBS "
            f"{gbs} x seq {i.job.seq_length}, {i.job.precision}: top {len(doc.plans)} of "
            f"{'' if stats.exact else 'at most '}{stats.num_feasible} feasible ({stats.num_candidates} examined)",
            rank, framework.value, at_risk_margin, launcher)


def _plan_pools(model, cluster, opts: dict, fmt: Fmt, output: Path | None, emit: Emit | None, rank: int,
                timeline: Path | None, launcher: Launcher = Launcher.scripts) -> None:
    """``plan --cluster NAME:NODES,...``: the plans over the pools (planner.pools.plan_pools), as a table (plans and
    pool subsets), JSON or the Megatron launch of plan #rank; ``--timeline`` draws plan #rank's schedule."""
    from .pools import plan_pools
    doc = plan_pools(model, cluster, **opts)
    if timeline is not None:
        from .pool_report import draw_pools_timeline
        draw_pools_timeline(doc, timeline, rank)
    if emit is not None:
        _emit(doc, emit, output, rank, "megatron", launcher)
    elif fmt == Fmt.json:
        _write(doc.model_dump_json(), output)
    else:
        import io

        from rich.console import Console

        from .pool_report import plans_table, subsets_table
        buf = io.StringIO() if output is not None else None
        con = Console(file=buf, width=200) if buf is not None else Console(width=max(200, Console().width))
        con.print(plans_table(doc))
        con.print(subsets_table(doc))
        if buf is not None:
            _write(buf.getvalue(), output)


def _plot(points, path: Path, model_name: str, train_tokens: float) -> None:
    from .cost_plot import plot_cost_sweep
    plot_cost_sweep(points, path, f"plan3d: {model_name}, {train_tokens:.4g} tokens: cost against days over GPU "
                                  f"counts, best plan at each")


def _render_comparison(cmp, fmt: Fmt, output: Path | None) -> None:
    """A multi-cluster comparison: JSON (``ComparisonDocument``) or the ranked table and the reasons of clusters
    without a plan."""
    if fmt == Fmt.json:
        _write(cmp.model_dump_json(), output)
        return
    import io

    from rich.console import Console

    from .cost_report import comparison_notes, comparison_table
    dl = f", deadline {cmp.deadline_days:g} days" if cmp.deadline_days is not None else ""
    title = (f"plan3d: {cmp.model}, {cmp.train_tokens:.4g} tokens on {len(cmp.rows)} clusters, objective "
             f"{cmp.objective}{dl}: best plan of each, ranked by time and by cost")
    buf = io.StringIO() if output is not None else None
    con = Console(file=buf, width=200) if buf is not None else Console(width=max(200, Console().width))
    con.print(comparison_table(cmp, title))
    notes = comparison_notes(cmp)
    if notes:
        con.print("clusters without a plan:")
        for line in notes:
            con.print(line, highlight=False)
    if buf is not None:
        _write(buf.getvalue(), output)


def _value(opt):
    """The string value of an optional enum option (None stays None)."""
    return None if opt is None else opt.value


TpOpt = Annotated[int, typer.Option("--tp", min=1, help="tensor parallel size")]
PpOpt = Annotated[int, typer.Option("--pp", min=1, help="pipeline parallel size")]
CpOpt = Annotated[int, typer.Option("--cp", min=1, help="context parallel size")]
EpOpt = Annotated[int, typer.Option("--ep", min=1, help="expert parallel size")]
EtpOpt = Annotated[Optional[int], typer.Option("--etp", min=1, help="expert tensor parallel (default: tp)")]
VppOpt = Annotated[int, typer.Option("--vpp", min=1, help="model chunks per pipeline rank")]
MbsOpt = Annotated[int, typer.Option("--micro-batch-size", min=1)]
ZeroOpt = Annotated[int, typer.Option("--zero-stage", min=0, max=3, help="1 = Megatron distributed optimizer")]
RecomputeLayoutOpt = Annotated[RecomputeOpt, typer.Option("--recompute")]
RecomputeLayersOpt = Annotated[Optional[int], typer.Option("--recompute-num-layers", min=1)]
SpOpt = Annotated[bool, typer.Option("--sequence-parallel/--no-sequence-parallel")]
FirstOpt = Annotated[Optional[int], typer.Option("--first-stage-layers", min=1)]
LastOpt = Annotated[Optional[int], typer.Option("--last-stage-layers", min=1)]
LayoutStrOpt = Annotated[Optional[str], typer.Option(
    "--pipeline-model-parallel-layout", help="Megatron per-stage layout, e.g. 'Et*7|t*9|t*9|t*7L' (E embedding, t "
                                             "decoder layer, m MTP layer, L loss; chunk i on pipeline rank i % pp)")]
RecomputeModulesOpt = Annotated[Optional[str], typer.Option(
    "--recompute-modules", help="selective recompute modules, comma-separated (Megatron --recompute-modules): "
                                "core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts")]
OffloadModulesOpt = Annotated[Optional[str], typer.Option(
    "--offload-modules", help="activation offloading to host memory, comma-separated (Megatron "
                              "--fine-grained-activation-offloading --offload-modules): attn_norm, qkv_linear, core_attn, "
                              "attn_proj, mlp_norm, expert_fc1, moe_act, fused_group_mlp")]
OffloadOpt = Annotated[float, typer.Option(
    "--optimizer-cpu-offload", min=0.0, max=1.0,
    help="share of the optimizer states in host memory (Megatron --optimizer-offload-fraction; DeepSpeed "
         "offload_optimizer, 1.0)")]
ParamOffloadOpt = Annotated[bool, typer.Option(
    "--param-cpu-offload/--no-param-cpu-offload", help="DeepSpeed ZeRO-3 offload_param: parameters in host memory")]
RecomputeMethodOpt = Annotated[str, typer.Option(
    "--recompute-method", help="with --recompute-num-layers N: block (the first N layers of each chunk recomputed) or "
                               "uniform (groups of N layers checkpointed, every layer recomputed)")]
MomentDtypeOpt = Annotated[str, typer.Option(help="Adam moment dtype (precision-aware optimizer): fp32, fp16, bf16, fp8")]
CapacityOpt = Annotated[Optional[float], typer.Option(
    "--capacity-factor", min=1.0,
    help="MoE drop-and-pad routing (Megatron --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity): "
         "each expert's input padded to this multiple of the balanced share; no host sync on the token counts "
         "(default: dropless)")]
MasterDtypeOpt = Annotated[str, typer.Option(
    "--main-params-dtype", help="master-weight dtype: fp32, fp16 (Megatron --main-params-dtype), bf16 "
                                "(Megatron-FSDP --megatron-fsdp-main-params-dtype)")]


def _layout(model, cluster, gpus, nodes, global_batch_size, seq_length, precision, flash_attention, dropout,
            framework, memory_headroom, tp, pp, cp, ep, etp, vpp, micro_batch_size, zero_stage, recompute,
            recompute_num_layers, sequence_parallel, first_stage_layers, last_stage_layers,
            flops_convention=None, at_risk_margin=AT_RISK_DEFAULT, full_model_init=False,
            expert_load_imbalance=None, capacity_factor=None, **knobs) -> dict:
    """The options of a one-layout command as the API's keyword arguments (``planner.api.LayoutOptions``)."""
    return dict(model=model, cluster=cluster, gpus=gpus, nodes=nodes, global_batch_size=global_batch_size,
                seq_length=seq_length, precision=precision.value, flash_attention=flash_attention, dropout=dropout,
                framework=framework.value, memory_headroom=memory_headroom, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp,
                vpp=vpp, micro_batch_size=micro_batch_size, zero_stage=zero_stage, recompute=recompute.value,
                recompute_num_layers=recompute_num_layers, sequence_parallel=sequence_parallel,
                first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                flops_convention=_value(flops_convention), at_risk_margin=at_risk_margin,
                full_model_init=full_model_init, expert_load_imbalance=expert_load_imbalance,
                capacity_factor=capacity_factor, **_knobs(**knobs))


def _knobs(pipeline_layout=None, recompute_modules=None, recompute_method="block", optimizer_cpu_offload=0.0,
           offload_modules=None,
           param_cpu_offload=False, exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32", main_params_dtype="fp32",
           pipeline_schedule=None) -> dict:
    """The memory knobs of a one-layout command as API keyword arguments (``planner.api.parallel_config``)."""
    def split(text):
        return tuple(m.strip() for m in text.split(",") if m.strip()) if text else None
    mods = split(recompute_modules)
    return dict(pipeline_layout=pipeline_layout, recompute_modules=mods, recompute_method=recompute_method,
                offload_modules=split(offload_modules),
                optimizer_cpu_offload=optimizer_cpu_offload,
                param_cpu_offload=param_cpu_offload, exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype,
                main_params_dtype=main_params_dtype, pipeline_schedule=_value(pipeline_schedule))


@app.command()
def evaluate(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = 4096, precision: PrecOpt = Precision.bf16,
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
    capacity_factor: CapacityOpt = None,
    train_tokens: TrainTokensOpt = None, gpu_hour_price: PriceOpt = None, async_checkpoint: AsyncCkptOpt = False,
    interruption_rate: RateOpt = None, restart_s: RestartOpt = None, pue: PueOpt = None,
) -> None:
    """Evaluate one given configuration (feasible or not). Options left out take Megatron-LM's defaults.

    dp is derived: GPUs / (tp * pp * cp). When pp does not divide the layers and no split is given, the end
    stages get fewer layers (Megatron's --decoder-first/last-pipeline-num-layers).
    """
    from .api import evaluate as api_evaluate
    _check_format_emit(fmt, emit)
    framework = _rules(framework, emit)
    doc = api_evaluate(**_layout(
        model, cluster, gpus, nodes, global_batch_size, seq_length, precision, flash_attention, dropout, framework,
        memory_headroom, tp, pp, cp, ep, etp, vpp, micro_batch_size, zero_stage, recompute, recompute_num_layers,
        sequence_parallel, first_stage_layers, last_stage_layers, flops_convention, at_risk_margin, full_model_init,
        pipeline_layout=pipeline_layout, recompute_modules=recompute_modules, recompute_method=recompute_method,
        offload_modules=offload_modules,
        optimizer_cpu_offload=optimizer_cpu_offload, param_cpu_offload=param_cpu_offload, exp_avg_dtype=exp_avg_dtype,
        exp_avg_sq_dtype=exp_avg_sq_dtype, main_params_dtype=main_params_dtype, pipeline_schedule=pipeline_schedule,
        expert_load_imbalance=expert_load_imbalance, capacity_factor=capacity_factor),
        train_tokens=train_tokens, gpu_hour_price=gpu_hour_price, async_checkpoint=async_checkpoint,
        interruption_rate=interruption_rate, restart_s=restart_s, pue=pue)
    i = doc.input
    _render(doc, fmt, output, emit, f"plan3d evaluate: {i.model.name} on {i.cluster.num_gpus} x {i.cluster.gpu} "
                                    f"({i.cluster.name})", framework=framework.value, at_risk_margin=at_risk_margin,
            launcher=launcher)


@app.command()
def memory(
    model: ModelOpt = None, cluster: ClusterOpt = None, gpus: GpusOpt = None, nodes: NodesOpt = None,
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = 4096, precision: PrecOpt = Precision.bf16,
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
) -> None:
    """Per-stage memory breakdown of one configuration (largest terms first, the total of each phase: init,
    forward, backward, optimizer; the backend buffers named).

    Same options as evaluate, and the same verdict: exit 1 when the peak stage is over the headroom or the layout
    breaks a rule (infeasible, as in evaluate and explain; the verdict line names the rule), exit 0 when it fits or
    is at risk; the report is printed either way.
    """
    from .api import memory as api_memory
    from .document import to_json
    from .memory_report import memory_table, plot_memory
    rep = api_memory(**_layout(
        model, cluster, gpus, nodes, global_batch_size, seq_length, precision, flash_attention, dropout, framework,
        memory_headroom, tp, pp, cp, ep, etp, vpp, micro_batch_size, zero_stage, recompute, recompute_num_layers,
        sequence_parallel, first_stage_layers, last_stage_layers, None, at_risk_margin, full_model_init, pipeline_layout=pipeline_layout, recompute_modules=recompute_modules, recompute_method=recompute_method,
        offload_modules=offload_modules,
        optimizer_cpu_offload=optimizer_cpu_offload, param_cpu_offload=param_cpu_offload, exp_avg_dtype=exp_avg_dtype,
        exp_avg_sq_dtype=exp_avg_sq_dtype, main_params_dtype=main_params_dtype, pipeline_schedule=pipeline_schedule,
        expert_load_imbalance=expert_load_imbalance, capacity_factor=capacity_factor))
    if plot is not None:
        plot_memory(rep.estimate, plot, rep.title, at_risk_margin, memory_headroom)
    if fmt == Fmt.json:
        _write(to_json(rep.document), output)
    else:
        from rich.console import Console
        if output is not None:
            with _open_output(output) as fh:
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
    global_batch_size: GbsOpt = 1024, seq_length: SeqOpt = 4096, precision: PrecOpt = Precision.bf16,
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
    capacity_factor: CapacityOpt = None,
) -> None:
    """List every constraint of one given configuration with its slack (same options as ``evaluate``).

    Exit code 0 when the configuration is feasible, 1 when a constraint is violated.
    """
    from .api import explain as api_explain
    from .explanation import format_slack
    rep = api_explain(**_layout(
        model, cluster, gpus, nodes, global_batch_size, seq_length, precision, flash_attention, dropout, framework,
        memory_headroom, tp, pp, cp, ep, etp, vpp, micro_batch_size, zero_stage, recompute, recompute_num_layers,
        sequence_parallel, first_stage_layers, last_stage_layers, None, at_risk_margin, full_model_init, pipeline_layout=pipeline_layout, recompute_modules=recompute_modules, recompute_method=recompute_method,
        offload_modules=offload_modules,
        optimizer_cpu_offload=optimizer_cpu_offload, param_cpu_offload=param_cpu_offload, exp_avg_dtype=exp_avg_dtype,
        exp_avg_sq_dtype=exp_avg_sq_dtype, main_params_dtype=main_params_dtype, pipeline_schedule=pipeline_schedule,
        expert_load_imbalance=expert_load_imbalance, capacity_factor=capacity_factor))
    ex, par, i = rep.explanation, rep.parallel, rep.inputs
    where = f"{i.model.name} on {i.num_gpus} x {i.cluster.gpu.name} ({i.cluster.name})"
    if timeline is not None:
        from .timeline import draw_timeline
        if ex.evaluation.step is None:
            from .errors import PlanInputError
            raise PlanInputError(f"--timeline {timeline}: the configuration has no step estimate (invalid layout)")
        draw_timeline(ex.evaluation.step, timeline, where)
    if fmt == Fmt.json:
        from .document import dumps_finite
        _write(dumps_finite(rep.to_dict(), "explain report", indent=2, sort_keys=True) + "\n", output)
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
            with _open_output(output) as fh:
                Console(file=fh, width=200).print(t)
        else:
            con = Console(width=max(160, Console().width))
            con.print(t)
            if st is not None:
                con.print(f"step {st.step_s:.3f} s, {st.tokens_per_s:,.0f} tokens/s, MFU {st.mfu:.1%}")
            if rep.memory_verdict is not None:
                con.print(f"memory verdict: {rep.memory_verdict}", highlight=False)
    rep.raise_if_infeasible()


@app.command()
def validate(
    dataset: Annotated[Optional[Path], typer.Option(
        "--dataset", help="published-runs YAML (default: the packaged dev rows)")] = None,
    max_mape: Annotated[float, typer.Option("--max-mape", min=0.0, help="overall MAPE threshold, percent")] = 7.0,
    max_group_mape: Annotated[float, typer.Option(
        "--max-group-mape", min=0.0, help="MAPE threshold per source group with >= 3 rows, percent")] = 10.0,
    cross_validate: Annotated[bool, typer.Option(
        "--cross-validate", help="also report leave-one-source-group-out MAPE (constants refitted without each "
                                 "group; one process, ~70 s on a 2-core machine); the thresholds then apply to it "
                                 "too")] = False,
    fmt: FmtOpt = Fmt.table, output: OutOpt = None,
) -> None:
    """Run the step-time model over published training runs; exit 1 when a MAPE threshold is exceeded."""
    from .api import validate as api_validate
    from .validation import report_json
    if cross_validate:
        from rich.console import Console
        from rich.progress import Progress
        with Progress(console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("cross-validating", total=None)
            rep = api_validate(dataset, cross_validate=True, progress=lambda g, k, n: bar.update(
                task, total=n, completed=k, description=f"refitting without {g}"))
    else:
        rep = api_validate(dataset)
    if fmt == Fmt.json:
        _write(report_json(rep) + "\n", output)
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
        con = Console(width=250, file=_open_output(output) if output is not None else None)
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
    framework: Annotated[Optional[Framework], typer.Option(
        "--framework", help="rules and resharding path (default megatron)")] = None,
    memory_headroom: HeadroomOpt = HEADROOM_DEFAULT, at_risk_margin: AtRiskOpt = AT_RISK_DEFAULT,
    flops_convention: FlopsOpt = None, fmt: FmtOpt = Fmt.table, output: OutOpt = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="draw retained throughput against lost nodes to FILE.png|svg")] = None,
) -> None:
    """Fallback plans after losing 1..K nodes: the best plan keeping the checkpoint's layout and the best of any
    layout (with its resharding path), the throughput each retains and the GPUs it leaves idle."""
    from .fallback_plans import fallback as api_fallback
    if plot is not None:  # before the fallback searches: a wrong suffix or no matplotlib fails at once
        from .plotting import picture_path, require_matplotlib
        picture_path("--plot", plot)
        require_matplotlib("--plot")
    job = {k: v for k, v in dict(gpus=gpus, nodes=nodes, global_batch_size=global_batch_size, seq_length=seq_length,
                                 precision=_value(precision), flash_attention=flash_attention, dropout=dropout,
                                 framework=_value(framework)).items() if v is not None}
    doc = api_fallback(model, cluster, plan=plan_file, max_lost_nodes=max_lost_nodes, rank=rank,
                       memory_headroom=memory_headroom, at_risk_margin=at_risk_margin,
                       flops_convention=_value(flops_convention), **job)
    if plot is not None:
        from .fallback_report import plot_fallback
        plot_fallback(doc, plot)
    if fmt == Fmt.json:
        _write(doc.model_dump_json(), output)
        return
    import io

    from rich.console import Console

    from .fallback_report import fallback_table
    buf = io.StringIO() if output is not None else None
    con = Console(file=buf, width=220) if buf is not None else Console(width=max(220, Console().width))
    con.print(fallback_table(doc))
    if buf is not None:
        _write(buf.getvalue(), output)


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
    from .errors import PlanInputError
    from .sweeps import load_grid, plot_sweep, sweep as api_sweep, to_csv, to_jsonl
    if plot and output is None:
        raise PlanInputError("--plot writes sweep.png next to the tables: give --output DIR")
    if plot:  # before the scenarios are planned: no matplotlib fails at once
        from .plotting import require_matplotlib
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


ShowOpt = Annotated[Optional[str], typer.Option("--show", help="print this entry as YAML, or JSON with --format json (a "
                                                                "template for your own)")]


def _show_yaml(data: dict, fmt: Fmt = Fmt.table) -> None:
    """One built-in entry: YAML, or JSON with ``--format json`` (both read back by --model / --cluster)."""
    if fmt == Fmt.json:
        import json
        sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")
        return
    import yaml
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=110))


@app.command()
def models(fmt: FmtOpt = Fmt.table, show: ShowOpt = None) -> None:
    """List the built-in models; --show NAME prints one as YAML (the format --model accepts)."""
    from model_zoo import get_model, list_models
    if show is not None:
        _show_yaml(get_model(show).model_dump(mode="json", exclude_defaults=True), fmt)
        return
    rows = []
    for name in list_models():
        s = get_model(name)
        rows.append({"name": name, "num_parameters": s.num_parameters(),
                     "num_active_parameters": s.num_active_parameters(), "num_layers": s.num_layers,
                     "hidden_size": s.hidden_size, "num_attention_heads": s.num_attention_heads,
                     "num_kv_heads": s.num_kv_heads, "experts": s.moe.num_experts if s.moe else None,
                     "source": s.source})
    if fmt == Fmt.json:
        import json
        sys.stdout.write(json.dumps(rows, indent=2, allow_nan=False) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title="plan3d built-in models")
    for col in ("name", "params", "active", "layers", "hidden", "heads", "kv", "experts", "source"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], f"{r['num_parameters'] / 1e9:.2f}B", f"{r['num_active_parameters'] / 1e9:.2f}B",
                  str(r["num_layers"]), str(r["hidden_size"]), str(r["num_attention_heads"]),
                  str(r["num_kv_heads"]), str(r["experts"] or "-"), r["source"][:60])
    Console(width=200).print(t)


@app.command()
def clusters(fmt: FmtOpt = Fmt.table, show: ShowOpt = None) -> None:
    """List the built-in clusters; --show NAME prints one as YAML (the format --cluster accepts)."""
    from cluster_specs import get_cluster, list_clusters
    if show is not None:
        _show_yaml(get_cluster(show).model_dump(mode="json"), fmt)
        return
    rows = []
    for name in list_clusters():
        c = get_cluster(name)
        rows.append({"name": name, "gpu": c.gpu.name, "memory_bytes": c.gpu.memory_bytes,
                     "gpus_per_node": c.node.gpus_per_node, "nvlink_domain_size": c.node.nvlink_domain_size,
                     "peak_bf16_flops": c.gpu.peak_flops.get("bf16"), "peak_fp8_flops": c.gpu.peak_flops.get("fp8"),
                     "nvlink_bytes_per_s": c.node.nvlink_bandwidth_bytes_per_s,
                     "nic_bytes_per_s": c.network.nic_bandwidth_bytes_per_s, "description": c.description})
    if fmt == Fmt.json:
        import json
        sys.stdout.write(json.dumps(rows, indent=2, allow_nan=False) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title="plan3d built-in clusters")
    for col in ("name", "GPU", "GiB", "GPUs/node", "NVLink domain", "bf16 TFLOP/s", "fp8 TFLOP/s",
                "NVLink GB/s/dir", "NIC GB/s/dir"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["gpu"], f"{r['memory_bytes'] / 2**30:.1f}", str(r["gpus_per_node"]),
                  str(r["nvlink_domain_size"]), f"{(r['peak_bf16_flops'] or 0) / 1e12:.0f}",
                  f"{(r['peak_fp8_flops'] or 0) / 1e12:.0f}" if r["peak_fp8_flops"] else "-",
                  f"{r['nvlink_bytes_per_s'] / 1e9:.0f}", f"{r['nic_bytes_per_s'] / 1e9:.3g}")
    Console(width=200).print(t)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("plan3d")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
            v = "unknown"
        sys.stdout.write(f"plan3d {v}\n")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """plan3d: plan DP x PP x TP x CP x EP layouts for large-transformer training."""


@app.command()
def schema(document: Annotated[DocumentKind, typer.Option(
        "--document", help="plan (plan / evaluate --format json), pools (--cluster NAME:NODES,...), comparison "
                           "(--cluster A,B), fallback")] = DocumentKind.plan) -> None:
    """Print the JSON Schema of a document plan3d writes (default: the plan document, ``plan --format json``)."""
    import json

    from .document import json_schema
    sys.stdout.write(json.dumps(json_schema(document.value), indent=2, allow_nan=False) + "\n")


def _nan_message(e) -> str | None:
    """A bounded number option given NaN fails every bound, so click names a bound ("less than or equal to 0.5");
    name the problem instead (None when the value is not NaN)."""
    param = getattr(e, "param", None)
    for flag in getattr(param, "opts", None) or ():
        for i, arg in enumerate(sys.argv):
            value = arg.partition("=")[2] if arg.startswith(f"{flag}=") else (
                sys.argv[i + 1] if arg == flag and i + 1 < len(sys.argv) else None)
            try:
                if value is not None and math.isnan(float(value)):
                    return f"{flag} {value}: must be a finite number"
            except ValueError:
                continue
    return None


def _one_line(text: object) -> str:
    """``text`` on one line (usage errors and loader messages can hold newlines)."""
    return " ".join(str(text).split())


def main() -> None:
    """Console-script entry point: run the app, turning every expected error into one line and an exit code.

    An exception nobody expected is a bug: one line naming it and where it was raised, exit 3 (``PLAN3D_DEBUG=1``
    re-raises it with the traceback)."""
    import os

    from typer.exceptions import Abort, Exit, TyperException

    from cluster_specs import ClusterSpecError
    from model_zoo import ModelSpecError

    from .errors import NoFeasiblePlan, PlanInputError
    try:
        app(standalone_mode=False, prog_name="plan3d")
    except (PlanInputError, ModelSpecError, ClusterSpecError) as e:
        sys.stderr.write(f"plan3d: error: {_one_line(e)}\n")
        sys.exit(2)
    except NoFeasiblePlan as e:
        sys.stderr.write(f"plan3d: {_one_line(e)}\n")
        sys.exit(1)
    except Abort:
        sys.stderr.write("plan3d: aborted\n")
        sys.exit(130)
    except TyperException as e:  # usage errors: unknown option, bad value, out of range
        if type(e).__name__ == "NoArgsIsHelpError":  # typer vendors click: match the class by name  # bare ``plan3d``: the help text, as ``plan3d --help`` prints it
            sys.stderr.write(e.format_message() + "\n")
        else:
            sys.stderr.write(f"plan3d: error: {_nan_message(e) or _one_line(e.format_message())}\n")
        sys.exit(2)
    except Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # a bug: one line, never a traceback (tests/fuzz counts these)
        if os.environ.get("PLAN3D_DEBUG"):
            raise
        from .errors import internal_error_line
        sys.stderr.write(internal_error_line(e) + "\n")
        sys.exit(3)


if __name__ == "__main__":  # pragma: no cover
    main()
