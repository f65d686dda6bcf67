"""What the commands print or write: ``--output`` files, the ranked-plans table (with uncertainty and tie
notes), ``--emit`` launch configs, cluster comparisons and the cost-sweep picture."""
from __future__ import annotations

import sys
from pathlib import Path

from .options import AT_RISK_DEFAULT, Emit, Fmt, Framework, Launcher


def write_output(text: str, output: Path | None) -> None:
    """``text`` to stdout, or to ``--output``; an OSError is the one-line ``--output PATH: reason`` error."""
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as e:
        from ..errors import PlanInputError
        raise PlanInputError(f"--output {output}: {e.strerror}") from None


class OutputFile:
    """``--output`` opened for writing: an OSError while opening, writing, flushing or closing it (a full disk,
    ``/proc/version``) is the one-line ``--output PATH: reason`` error."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = self._do(lambda: path.open("w"))

    def _do(self, f):
        try:
            return f()
        except OSError as e:
            from ..errors import PlanInputError
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


def open_output(output: Path) -> OutputFile:
    """``output`` opened for writing; an OSError becomes the one-line ``--output PATH: reason`` error."""
    return OutputFile(output)


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def _plans_table(doc, title: str, at_risk_margin: float = AT_RISK_DEFAULT):
    from rich.table import Table

    from ..uncertainty import step_cell  # imported when a table is drawn: it pulls in the cost models
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
    from ..cost_report import days, money
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
            extra = ["-", "-", "-"] if c is None else [days(c.effective_days), f"{c.gpu_hours:,.0f}", money(c.usd)]
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
                  peak, step_cell(p.time),
                  f"{p.throughput.tokens_per_s:,.0f}" if p.throughput else "-",
                  f"{p.throughput.tflops_per_gpu:.0f}" if p.throughput else "-",
                  f"{p.throughput.mfu:.1%}" if p.throughput else "-",
                  "yes" if p.feasible else "NO", *extra)
    return t


def _split_str(q) -> str:
    """The table's layer split: first/last stage layers of an uneven split, "acct" for the account-for-embedding/
    loss split, a layout's decoder layers per chunk run-length encoded ("10x6,2x5": Megatron-DeepSpeed's own split of
    70 layers over 12 stages; "layout" when that is longer than 12 characters), "-" for an even one."""
    if getattr(q, "pipeline_layout", None):
        from cost_models.layout import parse_pipeline_layout
        runs: list[list[int]] = []
        for n in (c.count("t") for c in parse_pipeline_layout(q.pipeline_layout)):
            if runs and runs[-1][1] == n:
                runs[-1][0] += 1
            else:
                runs.append([1, n])
        text = ",".join(f"{k}x{n}" if k > 1 else str(n) for k, n in runs)
        return text if len(text) <= 12 else "layout"
    if q.first_stage_layers is not None or q.last_stage_layers is not None:
        return f"{q.first_stage_layers or '-'}/{q.last_stage_layers or '-'}"
    return "acct" if q.account_for_embedding_in_pipeline_split else "-"


def emit_launch(doc, emit: Emit, output: Path | None, rank: int, framework: str | None = None,
                launcher: Launcher = Launcher.scripts) -> None:
    """``--emit``: without ``--output`` print the plan's main config to stdout (Megatron command line, DeepSpeed
    JSON, torchtitan TOML); with ``--output DIR`` write every file of planner.emit.emit_files into DIR.
    An infeasible configuration (``evaluate``) is refused (exit 1): every emitted config passes the checker.
    A plan ranked under another framework's rules (an explicit ``--framework``) is emitted with a note."""
    from ..emit import EmitError, EmitUnsupported, emit_files
    from ..errors import NoFeasiblePlan, PlanInputError
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
            from ..emit import RECOMPUTE_IN_SCRIPT
            launch = next(p for p in doc.plans if p.rank == rank).launch
            sys.stderr.write(f"plan3d: note: ds_config.json only; no Megatron-DeepSpeed launch: "
                             f"{launch.unsupported['megatron_deepspeed']}\n")
            if "activation_checkpointing" in launch.deepspeed:
                sys.stderr.write(f"plan3d: note: {RECOMPUTE_IN_SCRIPT}\n")
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


def render_plans(doc, fmt: Fmt, output: Path | None, emit: Emit | None, title: str, rank: int = 1,
                 framework: str | None = None, at_risk_margin: float = AT_RISK_DEFAULT,
                 launcher: Launcher = Launcher.scripts) -> None:
    """A plan document as ``--emit``'s launch config (``emit_launch``), JSON, or the ranked table with each plan's
    violations, the tie note and the cost lines (to ``--output`` when given)."""
    from ..document import to_json
    if emit is not None:
        emit_launch(doc, emit, output, rank, framework, launcher)
        return
    if launcher != Launcher.scripts:
        from ..errors import PlanInputError
        raise PlanInputError(f"--launcher {launcher.value} applies to --emit: give --emit "
                             f"{'|'.join(e.value for e in Emit)}")
    if fmt == Fmt.json:
        write_output(to_json(doc), output)
        return
    from rich.console import Console

    from ..cost_report import cost_lines
    from ..uncertainty import tie_note
    width = 190 if any(p.cost is not None for p in doc.plans) else 160  # room for days, GPU-hours and $
    if output is not None:
        import io
        buf = io.StringIO()
        con = Console(file=buf, width=width)
        con.print(_plans_table(doc, title, at_risk_margin))
        for line in cost_lines(doc):
            con.print(line, highlight=False)
        note = tie_note(doc.plans)
        if note is not None:
            con.print(note)
        write_output(buf.getvalue(), output)  # one-line error naming the path and the OS reason
        return
    console = Console(width=max(width, Console().width))
    console.print(_plans_table(doc, title, at_risk_margin))
    for p in doc.plans:
        for v in p.violations:
            console.print(f"  plan {p.rank}: {v}")
    note = tie_note(doc.plans)
    if note is not None:
        console.print(note)
    for line in cost_lines(doc):
        console.print(line, highlight=False)


def _pair_args(args: list[str]) -> list[str]:
    """One shell-quoted ``--flag value`` per item: the emitters' own ``pair_args`` (the same code path as the
    files written with ``--output``), so the printed command is valid shell."""
    from ..emit.megatron import pair_args
    return pair_args(args)



def draw_cost_sweep(points, path: Path, model_name: str, train_tokens: float) -> None:
    """``--plot``: cost against days over GPU counts (``planner.cost_plot.plot_cost_sweep``) to ``path``."""
    from ..cost_plot import plot_cost_sweep
    plot_cost_sweep(points, path, f"plan3d: {model_name}, {train_tokens:.4g} tokens: cost against days over GPU "
                                  f"counts, best plan at each")


def render_comparison(cmp, fmt: Fmt, output: Path | None) -> None:
    """A multi-cluster comparison: JSON (``ComparisonDocument``) or the ranked table and the reasons of clusters
    without a plan."""
    if fmt == Fmt.json:
        write_output(cmp.model_dump_json(), output)
        return
    import io

    from rich.console import Console

    from ..cost_report import comparison_notes, comparison_table
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
        write_output(buf.getvalue(), output)

