"""Sweeps: many planning questions at once (``plan3d sweep GRID.yaml``, ``planner.sweep(grid)``).

A grid is the cross product of lists: ``models`` x ``clusters`` x ``gpus`` x ``global_batch_sizes`` x
``seq_lengths`` x ``objectives`` (in that nesting order, the last varying fastest), plus settings shared by every
scenario (``precision``, ``framework``, ``solver``, ``memory_headroom``, ``target_step_s`` /
``target_tokens_per_day`` for ``min-gpus``). Example (YAML)::

    models: [llama3.1-8b, llama3.1-70b]
    clusters: [dgx-h100, dgx-b200]
    gpus: [64, 128, 256]
    global_batch_sizes: [512]
    seq_lengths: [4096, 8192]
    objectives: [throughput]        # optional, default [throughput]

Each scenario is one ``planner.plan(..., top_k=1)``; its row holds the top plan's key figures (layout, step time,
tokens/s, MFU, peak memory) or, when nothing fits or the input is impossible for that scenario, the one-line
reason. The scenarios run on a ``concurrent.futures.ProcessPoolExecutor`` (all local cores by default) or on Ray
(``executor="ray"``, the ``ray`` extra); rows come back in grid order whatever order the workers finish in, and
every plan is deterministic, so the same grid gives byte-identical JSONL and CSV.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster_specs import ClusterSpecError
from model_zoo import ModelSpecError

from .errors import NoFeasiblePlan, PlanInputError

EXECUTORS = ("process", "ray")


class Grid(BaseModel):
    """A sweep grid: lists whose cross product is the scenarios, and settings shared by all of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[str] = Field(min_length=1, description="built-in names, model files or Hub ids")
    clusters: list[str] = Field(min_length=1, description="built-in names or cluster YAML files")
    gpus: list[int] = Field(min_length=1, description="GPU counts (whole nodes of each cluster)")
    global_batch_sizes: list[int] = Field([1024], min_length=1, description="sequences per optimizer step")
    seq_lengths: list[int] = Field([4096], min_length=1, description="tokens per sequence")
    objectives: list[Literal["throughput", "headroom", "min-gpus"]] = Field(["throughput"], min_length=1)
    precision: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    framework: Literal["megatron", "deepspeed", "torchtitan"] = "megatron"
    solver: Literal["cpsat", "enumerate"] = "cpsat"
    memory_headroom: float = Field(0.05, ge=0.0, le=0.5)
    target_step_s: float | None = Field(None, gt=0)
    target_tokens_per_day: float | None = Field(None, gt=0)

    @field_validator("models", "clusters", "gpus", "global_batch_sizes", "seq_lengths", "objectives",
                     mode="before")
    @classmethod
    def _listify(cls, v):
        return [v] if isinstance(v, (str, int)) and not isinstance(v, bool) else v

    @field_validator("gpus", "global_batch_sizes", "seq_lengths", mode="before")
    @classmethod
    def _no_booleans(cls, v):
        # YAML's true / false would otherwise pass as 1 / 0 ("seq_lengths: [true]" planned sequence length 1)
        if isinstance(v, list) and any(isinstance(x, bool) for x in v):
            raise ValueError(f"must be positive integers, got {v}")
        return v

    @field_validator("models", "clusters")
    @classmethod
    def _named(cls, v: list[str]) -> list[str]:
        if any(not x.strip() for x in v):
            raise ValueError("names must not be empty")
        return v

    @field_validator("gpus", "global_batch_sizes", "seq_lengths")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        bad = [x for x in v if x < 1]
        if bad:
            raise ValueError(f"must be positive integers, got {bad}")
        return v

    @model_validator(mode="after")
    def _targets(self) -> "Grid":
        has = (self.target_step_s is not None) + (self.target_tokens_per_day is not None)
        if "min-gpus" in self.objectives and has != 1:
            raise ValueError("objective min-gpus needs exactly one of target_step_s, target_tokens_per_day")
        if "min-gpus" not in self.objectives and has:
            raise ValueError("target_step_s / target_tokens_per_day apply to objective min-gpus only")
        return self

    @property
    def num_scenarios(self) -> int:
        return (len(self.models) * len(self.clusters) * len(self.gpus) * len(self.global_batch_sizes)
                * len(self.seq_lengths) * len(self.objectives))


class Scenario(BaseModel):
    """One point of the grid (``index`` = its position in grid order)."""

    model_config = ConfigDict(frozen=True)

    index: int
    model: str
    cluster: str
    gpus: int
    global_batch_size: int
    seq_length: int
    objective: str


class SweepRow(Scenario):
    """One scenario's answer: ``status`` ``ok`` (the top plan's figures), ``infeasible`` (nothing fits: ``reason``
    names the binding constraint) or ``error`` (the scenario's input is impossible, e.g. a GPU count that is not
    whole nodes: ``reason``). Units: seconds, tokens/s, bytes; ``mfu`` a fraction;
    ``gpu_hours_per_billion_tokens`` = GPUs x step_s / tokens per step x 1e9 / 3600 (the cost proxy the plot
    draws; multiply by a price per GPU-hour for money)."""

    status: Literal["ok", "infeasible", "error"]
    num_gpus: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    vpp: int | None = None
    micro_batch_size: int | None = None
    zero_stage: int | None = None
    recompute: str | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    peak_bytes: int | None = None
    gpu_hours_per_billion_tokens: float | None = None
    reason: str | None = None


#: CSV / JSONL column order
COLUMNS = tuple(SweepRow.model_fields)


def load_grid(source: str | os.PathLike[str] | dict[str, Any] | Grid) -> Grid:
    """A ``Grid`` from a YAML file, a dict or a Grid. Raises ``PlanInputError`` naming the field and the allowed
    values."""
    if isinstance(source, Grid):
        return source
    if not isinstance(source, dict):
        import yaml

        from model_zoo.input_guard import parse, read_text
        try:  # size, UTF-8, nesting and alias expansion checked like every input file (issue 14)
            source = parse(read_text(Path(source), 2**20, PlanInputError, "grid"), "yaml", f"grid {source}",
                           PlanInputError)
        except yaml.YAMLError as e:
            raise PlanInputError(f"{source}: malformed YAML: {' '.join(str(e).split())[:200]}") from None
        if not isinstance(source, dict):
            raise PlanInputError("grid: top level must be a mapping (models, clusters, gpus, ...)")
    try:
        return Grid(**source)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if not loc:  # a rule across fields
            raise PlanInputError(f"grid: {msg}") from None
        got = f" (got {err.get('input')!r})" if "got " not in msg else ""  # a validator's message may name it
        raise PlanInputError(f"grid: {loc}: {msg}{got}") from None


def scenarios(grid: Grid) -> list[Scenario]:
    """The grid's scenarios in grid order (models outermost, objectives innermost)."""
    prod = itertools.product(grid.models, grid.clusters, grid.gpus, grid.global_batch_sizes, grid.seq_lengths,
                             grid.objectives)
    return [Scenario(index=i, model=m, cluster=c, gpus=g, global_batch_size=b, seq_length=s, objective=o)
            for i, (m, c, g, b, s, o) in enumerate(prod)]


def run_scenario(sc: Scenario, grid: Grid, model=None, cluster=None) -> SweepRow:
    """Plan one scenario (top plan only) into its row. ``model`` / ``cluster``: the already-loaded specs (the
    parent loads each once, so a Hub id is fetched once and workers never touch the network)."""
    from .api import plan
    targets = {}
    if sc.objective == "min-gpus":
        targets = {"target_step_s": grid.target_step_s, "target_tokens_per_day": grid.target_tokens_per_day}
    try:
        doc = plan(model if model is not None else sc.model, cluster if cluster is not None else sc.cluster,
                   gpus=sc.gpus, global_batch_size=sc.global_batch_size, seq_length=sc.seq_length,
                   precision=grid.precision, framework=grid.framework, solver=grid.solver,
                   memory_headroom=grid.memory_headroom, objective=sc.objective, top_k=1, **targets)
    except NoFeasiblePlan as e:
        return SweepRow(**sc.model_dump(), status="infeasible", reason=str(e))
    except (PlanInputError, ModelSpecError, ClusterSpecError) as e:  # this scenario's input is impossible
        return SweepRow(**sc.model_dump(), status="error", reason=str(e))
    p, n = doc.plans[0], doc.input.cluster.num_gpus
    q, thr = p.parallel, p.throughput
    tokens_per_step = doc.input.job.tokens_per_step
    return SweepRow(**sc.model_dump(), status="ok", num_gpus=n, tp=q.tp, pp=q.pp, dp=q.dp, cp=q.cp, ep=q.ep,
                    vpp=q.vpp, micro_batch_size=q.micro_batch_size, zero_stage=q.zero_stage, recompute=q.recompute,
                    step_s=p.time.step_s, tokens_per_s=thr.tokens_per_s, tokens_per_s_per_gpu=thr.tokens_per_s_per_gpu,
                    mfu=thr.mfu, peak_bytes=p.memory.peak_bytes,
                    gpu_hours_per_billion_tokens=float(f"{n * p.time.step_s / tokens_per_step * 1e9 / 3600:.6g}"))


def _run_one(args: tuple[Scenario, Grid, Any, Any]) -> SweepRow:
    return run_scenario(*args)


def _specs(grid: Grid) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each model and cluster of the grid loaded once (input errors raise here, before any worker starts)."""
    from cluster_specs import load_cluster
    from model_zoo import load_model
    return ({m: load_model(m) for m in dict.fromkeys(grid.models)},
            {c: load_cluster(c) for c in dict.fromkeys(grid.clusters)})


def sweep(grid: str | os.PathLike[str] | dict[str, Any] | Grid, *, executor: str = "process",
          max_workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> list[SweepRow]:
    """Plan every scenario of ``grid`` and return one ``SweepRow`` per scenario, in grid order.

    ``executor``: ``process`` (``ProcessPoolExecutor`` with ``max_workers`` processes, default all local cores;
    ``max_workers=1`` runs in this process) or ``ray`` (a Ray cluster: ``ray.init()`` connects to ``RAY_ADDRESS``
    or starts a local one; needs the ``ray`` extra). ``progress(done, total)`` is called as scenarios finish.
    Raises ``PlanInputError`` (bad grid, unknown executor, ray missing) and the loaders' errors for a model or
    cluster no scenario could use.
    """
    g = load_grid(grid)
    if executor not in EXECUTORS:
        raise PlanInputError(f"--executor {executor}: must be one of {', '.join(EXECUTORS)}")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                    or max_workers < 1):
        raise PlanInputError(f"--workers {max_workers!r}: must be a positive integer")
    models, clusters = _specs(g)
    todo = [(sc, g, models[sc.model], clusters[sc.cluster]) for sc in scenarios(g)]
    total = len(todo)
    report = progress or (lambda done, total: None)
    if executor == "ray":
        return _sweep_ray(todo, report)
    workers = max_workers or os.cpu_count() or 1
    if workers == 1 or total == 1:
        rows = []
        for args in todo:
            rows.append(run_scenario(*args))
            report(len(rows), total)
        return rows
    # one scenario per task: scenario costs differ by 10x (a 405B model on 1,024 GPUs vs an 8B on 64), so larger
    # batches leave a worker idle at the end; the specs pickle in microseconds
    out: list[SweepRow] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for row in pool.map(_run_one, todo):  # map keeps grid order
            out.append(row)
            report(len(out), total)
    return out


def _sweep_ray(todo, report) -> list[SweepRow]:
    try:
        import ray
    except ImportError:
        raise PlanInputError("--executor ray needs Ray: pip install 'plan3d[ray]' (or use --executor process)") \
            from None
    ray.init(ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(run_scenario)
    refs = [remote.remote(*args) for args in todo]
    rows: list[SweepRow] = []
    for ref in refs:  # in grid order
        rows.append(ray.get(ref))
        report(len(rows), len(refs))
    return rows


# ---------------------------------------------------------------------------------------------- output
def to_jsonl(rows: list[SweepRow]) -> str:
    """One JSON object per line, keys in ``COLUMNS`` order."""
    return "".join(json.dumps(r.model_dump(mode="json"), allow_nan=False) + "\n" for r in rows)


def to_csv(rows: list[SweepRow]) -> str:
    """CSV with a header row (``COLUMNS``); empty cells for fields a row does not have."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.model_dump(mode="json").items()})
    return buf.getvalue()


def plot_sweep(rows: list[SweepRow], path: str | os.PathLike[str]) -> None:
    """Tokens/s and GPU-hours per 1e9 tokens against GPUs to PNG/SVG/PDF (matplotlib, the ``plot`` extra): one
    line per scenario series, colour = model, line style = cluster, marker = the other varied settings (batch,
    sequence length, objective). Infeasible and invalid scenarios are left out (the title counts them)."""
    from .plotting import require_matplotlib
    require_matplotlib("--plot")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r.status == "ok"]
    models = list(dict.fromkeys(r.model for r in rows))
    clusters = list(dict.fromkeys(r.cluster for r in rows))
    varied = [f for f in ("global_batch_size", "seq_length", "objective") if len({getattr(r, f) for r in rows}) > 1]
    others = list(dict.fromkeys(tuple(getattr(r, f) for f in varied) for r in rows))
    colors = plt.get_cmap("tab10" if len(models) <= 10 else "tab20").colors
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D", "v", "P", "X", "*"]
    short = {"global_batch_size": "gbs", "seq_length": "seq", "objective": ""}
    series: dict[tuple, list[SweepRow]] = {}
    for r in ok:
        series.setdefault((r.model, r.cluster, tuple(getattr(r, f) for f in varied)), []).append(r)
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.5))
    for (model, cluster, other), pts in series.items():
        pts = sorted(pts, key=lambda r: r.num_gpus)
        label = f"{model} / {cluster}" + "".join(f" {short[f]} {v}".replace("  ", " ") for f, v in zip(varied, other))
        kw = dict(color=colors[models.index(model) % len(colors)], linestyle=styles[clusters.index(cluster) % 4],
                  marker=markers[others.index(other) % len(markers)], label=label)
        x = [r.num_gpus for r in pts]
        a.plot(x, [r.tokens_per_s for r in pts], **kw)
        b.plot(x, [r.gpu_hours_per_billion_tokens for r in pts], **kw)
    for ax, ylabel in ((a, "tokens/s (whole job)"), (b, "GPU-hours per 1e9 tokens")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    a.set_title("throughput of the best plan")
    b.set_title("cost (GPU time per token)")
    fig.suptitle(f"plan3d sweep: {len(rows)} scenarios, {len(rows) - len(ok)} infeasible or invalid (not drawn)")
    handles, labels = a.get_legend_handles_labels()
    ncol = min(4, max(1, len(labels)))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
    fig.tight_layout(rect=(0, min(0.5, 0.04 * (1 + (len(labels) - 1) // ncol)), 1, 0.95))
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        raise PlanInputError(f"--plot {path}: {e}") from None
    finally:
        plt.close(fig)
