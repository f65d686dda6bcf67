"""plan3d's Python API: the typed functions the ``plan3d`` command line is a thin layer over.

    >>> import planner
    >>> doc = planner.plan("llama3.1-70b", "dgx-h100", gpus=64, global_batch_size=512, seq_length=8192)
    >>> best = doc.plans[0]
    >>> best.parallel.tp, best.parallel.pp, best.throughput.mfu
    >>> doc.model_dump_json() == open("plans.json").read()   # plan3d plan ... --format json --output plans.json

Every function takes the model and the cluster as a built-in name, a file path (our YAML, or a Hugging Face
``config.json`` for the model), a Hugging Face Hub id for the model (``"meta-llama/Llama-3.1-8B"``: its
``config.json`` from the Hub cache, else the Hub; ``model_zoo.hub``) or an already-built ``ModelSpec`` /
``ClusterSpec``, and the job and layout as
keyword options named as on the command line (``--global-batch-size`` is ``global_batch_size``). The return
values are the objects whose JSON the CLI prints: ``plan`` and ``evaluate`` return a ``PlanDocument`` (pydantic;
``model_dump_json()`` is byte-identical to ``--format json``), ``memory`` a ``MemoryReport`` (its ``document`` is
that of ``plan3d memory --format json``), ``explain`` an ``ExplainReport`` and ``validate`` a
``ValidationReport``.

Errors are typed, the ones the CLI maps to exit codes: ``PlanInputError``, ``ModelSpecError`` and
``ClusterSpecError`` (bad input; exit 2), ``NoFeasiblePlan`` (nothing fits, or the configuration cannot run;
exit 1). Each message is one line naming the field and the allowed values, or the binding constraint.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .errors import NoFeasiblePlan, PlanInputError
# the options, their checks and their resolution into inputs (planner/api_options.py)
from .api_options import (COST_KEYS, CostOptions, DEFAULT_AT_RISK_MARGIN, DEFAULT_HEADROOM, DEFAULT_WITHIN,
                          EvaluateOptions, FLOPS_CONVENTIONS, FRAMEWORKS, Inputs, JOB_KEYS, JobOptions, LAYOUT_KEYS,
                          LayoutOptions, MAX_TOP_K, OBJECTIVES, PLAN_KEYS, PRECISIONS, PlanOptions, RECOMPUTE_CHOICES,
                          SCHEDULE_CHOICES, SOLVERS, at_risk_option, check_bool, check_choice, check_keys,
                          headroom_option, job_kwargs, load_inputs, option_flag, parallel_config)

if TYPE_CHECKING:  # heavy imports stay lazy: the CLI's start-up only pays for what a command uses
    from typing import Unpack

    from cluster_specs.spec import ClusterSpec
    from cost_models.config import ParallelConfig
    from cost_models.memory import MemoryEstimate
    from model_zoo.spec import ModelSpec

    from .comparison import ComparisonDocument
    from .cost_search import SweepPoint
    from .checks import Violation
    from .document import PlanDocument
    from .explanation import Explanation
    from .validation import ValidationReport

    #: a built-in name, a file path, or a built model / cluster
    ModelLike = str | os.PathLike[str] | ModelSpec
    ClusterLike = str | os.PathLike[str] | ClusterSpec


#: the API: its functions and reports, and the options' vocabulary (``planner.api_options``)
__all__ = ["plan", "compare", "cost_sweep", "evaluate", "memory", "explain", "validate", "check_launchable",
           "launchable_pins", "MemoryReport", "ExplainReport", "SearchStats", "Inputs", "load_inputs",
           "parallel_config", "JobOptions", "LayoutOptions", "CostOptions", "EvaluateOptions", "PlanOptions",
           "PRECISIONS", "FRAMEWORKS", "FLOPS_CONVENTIONS", "RECOMPUTE_CHOICES", "SCHEDULE_CHOICES", "SOLVERS", "OBJECTIVES", "DEFAULT_HEADROOM",
           "DEFAULT_AT_RISK_MARGIN", "DEFAULT_WITHIN", "MAX_TOP_K"]


@dataclass(frozen=True)
class SearchStats:
    """How the search went: candidates examined, feasible ones (an upper bound when ``exact`` is False: CP-SAT
    stopped re-scoring once no other candidate could enter the top K)."""

    num_candidates: int
    num_feasible: int
    exact: bool
    #: one line when the search stopped at its time budget (what was not tried), else None
    note: str | None = None


def _cost_options(options: dict[str, Any]):
    """``planner.cost.CostOptions`` of the cost keys in ``options`` (None without ``train_tokens``)."""
    from .cost import cost_options
    return cost_options(options.get("train_tokens"), gpu_hour_price=options.get("gpu_hour_price"),
                        async_checkpoint=check_bool("async_checkpoint", options.get("async_checkpoint", False)),
                        interruptions_per_gpu_hour=options.get("interruption_rate"),
                        restart_s=options.get("restart_s"), pue=options.get("pue"))


def _check_price_names(cost, clusters: list[str]) -> None:
    """``--gpu-hour-price NAME=USD`` names only the clusters being planned (``planner.cost.check_price_names``)."""
    from .cost import check_price_names
    check_price_names(None if cost is None else cost.gpu_hour_price, clusters)


def _per_cluster_options(options: dict[str, Any], specs: list) -> list[dict[str, Any]]:
    """``options`` for each cluster of ``specs`` (``compare``, ``cost_sweep``): ``--gpu-hour-price``'s NAME=USD
    entries checked against all of them, then each cluster planned with its own entry only (so each one-cluster
    plan's own check holds)."""
    from .cost import check_price_names, parse_price
    price = parse_price(options.get("gpu_hour_price"))
    if not isinstance(price, dict):
        return [options] * len(specs)
    check_price_names(price, [c.name for c in specs])
    return [{**options, "gpu_hour_price": {k: v for k, v in price.items() if k == c.name}} for c in specs]


def _layout_problem(model, cluster, options: dict[str, Any], where: str):
    """Resolve the options of a one-layout function into (inputs, par, headroom, framework, convention)."""
    check_keys(options, JOB_KEYS | LAYOUT_KEYS, where)
    inputs = load_inputs(model, cluster, **job_kwargs(options))
    par = parallel_config(inputs, **{k: options[k] for k in LAYOUT_KEYS if k in options})
    conv = check_choice("flops_convention", options.get("flops_convention") or "megatron", FLOPS_CONVENTIONS)
    return inputs, par, headroom_option(options.get("memory_headroom")), inputs.job.framework, conv


@dataclass(frozen=True)
class _PlanSetup:
    """``plan``'s options, checked and resolved (shared with ``compare`` and ``cost_sweep``)."""

    inputs: Inputs
    objective: str
    solver: str
    convention: str
    headroom: float
    top_k: int
    within: float | None
    target_step_s: float | None
    target_tokens_per_day: float | None
    deadline_days: float | None
    cost: Any  # planner.cost.CostOptions | None
    space: Any  # planner.space.SearchSpace
    budget: Any  # planner.progress.Budget: wall seconds for repeated planning
    progress: Callable[[str], None]  # told each step of repeated planning (a status line)
    at_risk_margin: float = DEFAULT_AT_RISK_MARGIN
    gbs_tolerance: float | None = None

    def problem(self):
        """The deadline searches' ``planner.cost_search.Problem`` on this setup's cluster."""
        from .cost_search import Problem
        i = self.inputs
        return Problem(i.model, i.cluster, i.job, self.space, self.headroom, i.job.framework, self.solver,
                       self.convention, self.cost, budget=self.budget, progress=self.progress,
                       at_risk_margin=self.at_risk_margin)


def _job_inputs(model: ModelLike | None, cluster: ClusterLike | None, options: dict[str, Any]) -> Inputs:
    """``load_inputs`` of the job options among ``plan``'s ``options`` (``job_kwargs``; None and the rest ignored)."""
    return load_inputs(model, cluster, **{k: v for k, v in job_kwargs(options).items() if v is not None})


def check_launchable(emit: str, model: ModelLike | None = None, cluster: ClusterLike | None = None,
                     **options: Any) -> None:
    """Refuse, before any search, a job the ``emit`` target (``planner.emit.FRAMEWORKS``) cannot launch whatever
    the layout: a model feature or a job option it has no setting for (``planner.emit.job_refusal``), e.g.
    ``precision="fp8"`` on torchtitan. ``options`` are ``plan``'s job options (the rest are ignored).

    Raises:
        NoFeasiblePlan: the job cannot run on ``emit``; the message names the option and whether Megatron-LM runs it.
        PlanInputError / ModelSpecError / ClusterSpecError: as ``load_inputs``.
    """
    from .emit import job_refusal
    inputs = _job_inputs(model, cluster, options)
    why = job_refusal(emit, inputs.model, inputs.job)
    if why is not None:
        alt = "; change that option, or --emit megatron, which runs it" if emit != "megatron" and job_refusal(
            "megatron", inputs.model, inputs.job) is None else ""
        raise NoFeasiblePlan(f"--emit {emit}: {why}; no parallel layout changes that{alt}")


#: The layout a plan must have for ``ds_config.json`` alone to carry it (``planner.emit.deepspeed.
#: check_ds_config_alone``: the JSON sets data parallelism, ZeRO, batch, precision and pipeline stages; tensor,
#: context and expert parallelism, sequence parallelism and recompute belong to the script that builds the model).
#: Recompute is one of the granularities it carries: none, or every layer (its ``activation_checkpointing`` section;
#: the script checkpoints each layer), not Megatron's selective modules.
DS_CONFIG_ALONE_PINS: dict[str, Any] = {"tp": 1, "cp": 1, "ep": 1, "recompute": ("none", "full")}


def recompute_choices(value: Any) -> tuple[str, ...] | None:
    """``plan``'s ``recompute`` option as the tuple of granularities to search (one, or several given as a tuple or
    list); None when not given.

    Raises:
        PlanInputError: an empty tuple, or a granularity outside ``RECOMPUTE_CHOICES``.
    """
    if value is None:
        return None
    rc = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not rc:
        raise PlanInputError(f"--recompute: give at least one of {', '.join(RECOMPUTE_CHOICES)}")
    for r in rc:
        check_choice("recompute", r, RECOMPUTE_CHOICES)
    return rc


def pins_text(pins: dict[str, Any]) -> str:
    """``{"tp": 1, "recompute": ("none", "full")}`` -> ``"tp 1, recompute none or full"``."""
    return ", ".join(f"{k} {' or '.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in pins.items())


def launchable_pins(emit: str, model: ModelLike | None = None, cluster: ClusterLike | None = None,
                    **options: Any) -> tuple[dict[str, Any], str | None]:
    """The ``plan`` pins (option -> value) without which no plan of the job can run on ``emit``, and a one-line
    note saying why; ({}, None) when the target needs none. ``emit="deepspeed"`` for a model that no
    Megatron-DeepSpeed launch can build (``planner.emit.megatron_deepspeed_refusal``, e.g. Llama 3's RoPE scaling):
    ``ds_config.json`` is then emitted alone, so the search keeps ``DS_CONFIG_ALONE_PINS``. ``options`` are
    ``plan``'s options.

    Raises:
        NoFeasiblePlan: an option pins one of those knobs to another value (the message names it and why).
        PlanInputError / ModelSpecError / ClusterSpecError: as ``load_inputs``.
    """
    if emit != "deepspeed":
        return {}, None
    from .emit import megatron_deepspeed_refusal
    inputs = _job_inputs(model, cluster, options)
    why = megatron_deepspeed_refusal(inputs.model, inputs.job)
    if why is None:
        return {}, None
    fw = options.get("framework")  # None: plan under the emit target's rules, as plan3d plan --emit does
    if fw is not None and fw != "deepspeed":
        raise NoFeasiblePlan(f"--emit deepspeed with --framework {fw}: no Megatron-DeepSpeed launch can build this "
                             f"model ({why}), so ds_config.json is emitted alone and the plans must follow "
                             f"DeepSpeed's own rules; drop --framework, or --emit {fw}")
    given = {k: options.get(k) for k in DS_CONFIG_ALONE_PINS}
    given["recompute"] = recompute_choices(given["recompute"])
    for k, v in DS_CONFIG_ALONE_PINS.items():
        g = given[k]
        if g is not None and not set(g if isinstance(g, tuple) else (g,)) <= set(v if isinstance(v, tuple) else (v,)):
            raise NoFeasiblePlan(f"--emit deepspeed: {option_flag(k)} {','.join(g) if isinstance(g, tuple) else g}: "
                                 f"ds_config.json alone does not set it (the training script does), and no "
                                 f"Megatron-DeepSpeed launch can build this model ({why}); drop the option, or "
                                 f"--emit megatron")
    pins = {k: v for k, v in DS_CONFIG_ALONE_PINS.items() if given[k] is None}
    note = (f"--emit deepspeed: no Megatron-DeepSpeed launch can build this model ({why}), so ds_config.json is "
            f"emitted alone and the plans keep to what it carries: {pins_text({**given, **pins})} (data "
            f"parallelism, ZeRO, pipeline stages and batch vary)")
    return pins, note


def _check_pinned_split(num_layers: int, o: dict[str, Any]) -> None:
    """A pinned first / last stage size with a pinned pp must be one the search has (``space.stage_splits``: end
    stages at most ``END_STAGE_LIGHTER`` layers lighter than the middle ones); else a one-line ``PlanInputError``
    naming the sizes it has (evaluate takes any split)."""
    pp = o.get("pp")
    if pp is None or pp < 2:
        return
    from .space import END_STAGE_LIGHTER, stage_splits
    splits = stage_splits(num_layers, pp)
    even = num_layers // pp
    for k, pos in (("first_stage_layers", 0), ("last_stage_layers", 1)):
        v = o.get(k)
        sizes = sorted({(s[pos] or even) for s in splits})
        if v is not None and v not in sizes:
            raise PlanInputError(f"{option_flag(k)} {v}: with --pp {pp} and {num_layers} layers plan searches "
                                 f"{', '.join(map(str, sizes))} (end stages at most {END_STAGE_LIGHTER} layers "
                                 f"lighter than the middle ones); plan3d evaluate takes any split")


def _plan_setup(model, cluster, options: dict[str, Any]) -> _PlanSetup:
    """Check ``plan``'s options and resolve the inputs (raises the input errors ``plan`` documents)."""
    check_keys(options, PLAN_KEYS, "plan")
    o = dict(options)
    objective = check_choice("objective", o.get("objective", "throughput"), OBJECTIVES)
    solver = check_choice("solver", o.get("solver", "cpsat"), SOLVERS)
    conv = check_choice("flops_convention", o.get("flops_convention") or "megatron", FLOPS_CONVENTIONS)
    step_t, tok_t, within = o.get("target_step_s"), o.get("target_tokens_per_day"), o.get("within")
    for field, v in (("target_step_s", step_t), ("target_tokens_per_day", tok_t)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise PlanInputError(f"{option_flag(field)} {v!r}: must be a positive finite number")
    if within is not None and objective != "headroom":
        raise PlanInputError("--within applies to --objective headroom only")
    if within is not None and (isinstance(within, bool) or not isinstance(within, (int, float))
                               or not 0.0 <= within <= 1.0):
        raise PlanInputError(f"--within {within!r}: must be a fraction in [0, 1] (the throughput loss allowed)")
    # the pins, as the CLI's option ranges check them (the search divides by them)
    for k in ("tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "first_stage_layers", "last_stage_layers"):
        v = o.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise PlanInputError(f"{option_flag(k)} {v!r}: must be a positive integer")
    z = o.get("zero_stage")
    if z is not None and (isinstance(z, bool) or not isinstance(z, int) or not 0 <= z <= 3):
        raise PlanInputError(f"--zero-stage {z!r}: must be 0, 1, 2 or 3")
    cost = _cost_options(o)
    deadline = o.get("deadline_days")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not 0 < deadline < float("inf"):
            raise PlanInputError(f"--deadline-days {deadline!r}: must be a positive number of days")
        if objective not in ("cost", "min-gpus"):
            raise PlanInputError("--deadline-days needs --objective cost or --objective min-gpus")
        if cost is None:
            raise PlanInputError("--deadline-days needs --train-tokens (the days depend on how many tokens)")
    if objective == "cost" and deadline is None:
        raise PlanInputError("--objective cost needs --deadline-days and --train-tokens (cheapest plan that "
                             "finishes by the deadline)")
    if objective == "min-gpus" and sum(v is not None for v in (step_t, tok_t, deadline)) != 1:
        raise PlanInputError("--objective min-gpus needs exactly one of --target-step-s, --target-tokens-per-day, "
                             "--deadline-days")
    if objective != "min-gpus" and (step_t is not None or tok_t is not None):
        raise PlanInputError("--target-step-s / --target-tokens-per-day need --objective min-gpus")
    tol = o.get("global_batch_size_tolerance")
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 <= tol < 1.0:
            raise PlanInputError(f"--global-batch-size-tolerance {tol!r}: must be a fraction in [0, 1)")
        if objective not in ("throughput", "headroom"):
            raise PlanInputError("--global-batch-size-tolerance applies to --objective throughput or headroom")
    top_k = o.get("top_k", 5)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise PlanInputError(f"--top-k {top_k!r}: must be an integer from 1 to {MAX_TOP_K} (each listed plan is timed "
                             "in full; a wider look at the space is plan3d sweep's job)")
    inputs = load_inputs(model, cluster, **job_kwargs(o))
    _check_price_names(cost, [inputs.cluster.name])
    _check_pinned_split(inputs.model.num_layers, o)
    headroom = headroom_option(o.get("memory_headroom"))
    recompute = recompute_choices(o.get("recompute"))
    if o.get("pipeline_schedule") is not None:
        check_choice("pipeline_schedule", o["pipeline_schedule"], SCHEDULE_CHOICES)
        from .space import SEARCH_SCHEDULES
        searched = ("1f1b", "interleaved", *SEARCH_SCHEDULES[inputs.job.framework])
        if o["pipeline_schedule"] not in searched:
            raise PlanInputError(f"--pipeline-schedule {o['pipeline_schedule']}: {inputs.job.framework} plans search "
                                 f"{', '.join(searched)} (evaluate takes any schedule)")
    from .space import SearchSpace
    one = lambda x: None if x is None else (x,)  # noqa: E731
    sp_kw: dict[str, Any] = {k: one(o.get(k)) for k in ("tp", "pp", "cp", "ep", "vpp", "first_stage_layers",
                                                         "last_stage_layers")}
    for k in ("micro_batch_size", "zero_stage", "pipeline_schedule"):
        if o.get(k) is not None:
            sp_kw[k] = (o[k],)
    if recompute is not None:
        sp_kw["recompute"] = recompute
    from .progress import DEFAULT_BUDGET_S, Budget, no_progress
    seconds = o.get("time_budget_s", DEFAULT_BUDGET_S)
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not 0 < seconds < float("inf")):
        raise PlanInputError(f"--time-budget {seconds!r}: must be a positive number of seconds")
    return _PlanSetup(inputs, objective, solver, conv, headroom, top_k, within, step_t, tok_t,
                      None if deadline is None else float(deadline), cost, SearchSpace(**sp_kw), Budget(seconds),
                      o.get("progress") or no_progress, at_risk_option(o.get("at_risk_margin")),
                      None if tol is None else float(tol))


def plan(model: ModelLike | None = None, cluster: ClusterLike | None = None,
         **options: Unpack[PlanOptions]) -> PlanDocument:
    """Search the parallel layouts of a job and return the best plans (best first) as the plan document.

    ``options``: the job (``gpus`` or ``nodes``, ``global_batch_size`` 1024, ``seq_length`` 4096, ``precision``
    bf16, ``flash_attention`` True, ``dropout`` False, ``framework`` megatron, ``memory_headroom`` 0.05,
    ``flops_convention`` megatron, ``software_date`` None: today's kernels), the search (``top_k`` 5, ``solver``
    cpsat|enumerate, ``objective`` throughput|headroom|min-gpus|cost with ``within`` / ``target_step_s`` /
    ``target_tokens_per_day`` / ``deadline_days``), pins (``tp``, ``pp``, ``cp``, ``ep``, ``vpp``,
    ``micro_batch_size``, ``zero_stage``, ``recompute``: one granularity or a tuple of them to search,
    ``first_stage_layers`` / ``last_stage_layers``: the decoder layers of the end stages) and the cost options
    (``train_tokens``, ...: ``CostOptions``; each plan then has a ``cost``).
    With ``gpus`` an upper bound, ``objective`` min-gpus finds the fewest GPUs that meet the target or deadline and
    ``cost`` the fewest GPU-hours that finish by ``deadline_days`` (planner/cost_search.py).
    ``global_batch_size_tolerance`` F (a fraction in [0, 1); objectives throughput and headroom): when the
    requested global batch does not plan, plan the nearest one within F of it that does
    (``planner.near_miss.choose_batch``); ``input.job.requested_global_batch_size`` then holds the request and
    ``global_batch_size`` the batch planned.
    The document's ``search_stats`` tells how many candidates were examined and found feasible.

    Raises ``NoFeasiblePlan`` (nothing fits: the message names the binding constraint, by how much, and the
    nearest changes that fit; or no plan meets the deadline, and by how much) and the input errors of
    ``load_inputs``.
    """
    st = _plan_setup(model, cluster, options)
    from .cost import attach_costs
    from .document import build_document
    m, c, n, job = st.inputs.model, st.inputs.cluster, st.inputs.num_gpus, st.inputs.job
    fw, space, headroom, top_k = job.framework, st.space, st.headroom, st.top_k
    margin = at_risk_option(options.get("at_risk_margin"))
    if st.deadline_days is not None:
        from .cost_search import cheapest_by_deadline, fewest_gpus_by_deadline
        by_deadline = cheapest_by_deadline if st.objective == "cost" else fewest_gpus_by_deadline
        res, n = by_deadline(st.problem(), n, top_k, st.deadline_days)
    elif st.objective == "min-gpus":
        from .search import fewest_gpus
        res, n = fewest_gpus(m, c, job, n, top_k, space, headroom, fw, st.solver, st.target_step_s,
                             st.target_tokens_per_day, st.convention, at_risk_margin=margin, budget=st.budget,
                             progress=st.progress)
    else:
        from .search import run_search
        res = run_search(m, c, job, n, top_k, space, headroom, fw, st.solver, st.objective,
                         DEFAULT_WITHIN if st.within is None else st.within, st.convention, margin,
                         progress=st.progress)
        if not res.plans and st.gbs_tolerance:
            from .near_miss import choose_batch
            gbs = choose_batch(m, c, job, n, st.gbs_tolerance, space, headroom, fw, st.solver, st.convention,
                               margin, st.budget, st.progress)
            if gbs is not None:
                job = job.model_copy(update={"global_batch_size": gbs})
                res = run_search(m, c, job, n, top_k, space, headroom, fw, st.solver, st.objective,
                                 DEFAULT_WITHIN if st.within is None else st.within, st.convention, margin,
                                 progress=st.progress)
    if not res.plans:
        from .explanation import why_infeasible
        raise NoFeasiblePlan(why_infeasible(m, c, job, n, res, space, headroom, fw, st.target_step_s,
                                            st.target_tokens_per_day, margin, st.budget, st.progress,
                                            st.gbs_tolerance))
    asked = st.inputs.job.global_batch_size if st.gbs_tolerance is not None else None
    doc = build_document(m, c, job, n, res.plans, margin, asked)
    attach_costs(doc, res.plans, m, c, job, n, st.cost)
    doc._search_stats = SearchStats(res.num_candidates, res.num_feasible, res.num_feasible_exact, res.note)
    return doc


def _resolve_clusters(clusters) -> list:
    """Built ``ClusterSpec`` objects of ``clusters`` (names, paths, specs, or a ``--cluster`` string with commas)."""
    from cluster_specs import DEFAULT_CLUSTER, load_cluster
    from cluster_specs.spec import ClusterSpec

    from .comparison import parse_cluster_option
    if clusters is None:
        clusters = [DEFAULT_CLUSTER]
    if isinstance(clusters, (ClusterSpec, os.PathLike)):
        clusters = [clusters]
    if isinstance(clusters, str):
        choice = parse_cluster_option(clusters)
        if choice.kind == "pools":
            raise PlanInputError(f"--cluster {clusters!r}: NAME:NODES pools make one mixed-GPU cluster, planned by "
                                 f"planner.plan_pools; give NAME,NAME,... to compare clusters")
        clusters = list(choice.names)
    if not clusters:
        raise PlanInputError("--cluster: give at least one cluster to compare")
    specs = [c if isinstance(c, ClusterSpec) else load_cluster(os.fspath(c)) for c in clusters]
    names = [c.name for c in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        # the rows, the prices (--gpu-hour-price NAME=) and the ranking go by name: two specs of one name are one row
        raise PlanInputError(f"--cluster: {', '.join(twice)} named twice (a cluster file keeps the name of the one it "
                             f"was copied from?); give each compared cluster its own name")
    return specs


def compare(model: ModelLike | None = None, clusters: str | list[ClusterLike] | None = None,
            **options: Unpack[PlanOptions]) -> ComparisonDocument:
    """Plan the same job on several clusters (``"dgx-h100,dgx-h200"`` or a list) and rank them by the best plan's
    effective days and dollars to train ``train_tokens`` (required). Options as ``plan``: ``gpus`` is shared (with
    the min-gpus and cost objectives it is each cluster's upper bound). A cluster with no plan (nothing fits, the
    deadline is missed, its GPUs lack the precision) gets its reason in the row. Raises ``PlanInputError`` without
    ``train_tokens`` and, when every cluster fails on an input error, the first of them."""
    from cluster_specs import ClusterSpecError
    from model_zoo import DEFAULT_MODEL, load_model
    from model_zoo.spec import ModelSpec

    from .comparison import build_comparison
    if options.get("train_tokens") is None:
        raise PlanInputError("--cluster with several clusters ranks them by time and cost to train: give "
                             "--train-tokens")
    specs = _resolve_clusters(clusters)
    m = model if isinstance(model, ModelSpec) else load_model(os.fspath(model) if model is not None else DEFAULT_MODEL)
    results, input_errors = [], []
    for c, opts in zip(specs, _per_cluster_options(options, specs)):
        try:
            results.append((c.name, plan(m, c, **opts), None))
        except (PlanInputError, ClusterSpecError) as e:
            input_errors.append(e)
            results.append((c.name, None, str(e)))
        except NoFeasiblePlan as e:
            results.append((c.name, None, str(e)))
    if len(input_errors) == len(specs):
        raise input_errors[0]
    deadline = options.get("deadline_days")
    return build_comparison(m.name, options.get("objective", "throughput"), float(options["train_tokens"]),
                            None if deadline is None else float(deadline), results)


def cost_sweep(model: ModelLike | None = None, clusters: ClusterLike | list[ClusterLike] | None = None,
               **options: Unpack[PlanOptions]) -> list[SweepPoint]:
    """The fastest plan at each GPU count (one node, doubling, up to ``gpus``) on each cluster, with its whole-run
    cost (``train_tokens`` required): the points ``plan3d plan --plot`` draws (planner/cost_plot.py). Options as
    ``plan`` (the objective and deadline are not used: every count is swept)."""
    if options.get("train_tokens") is None:
        raise PlanInputError("--plot draws cost against days: give --train-tokens")
    sweep_opts = {k: v for k, v in options.items() if k not in ("objective", "deadline_days", "within",
                                                                 "target_step_s", "target_tokens_per_day")}
    from .cost_search import cost_sweep as sweep
    points: list[SweepPoint] = []
    specs = _resolve_clusters(clusters)
    for c, opts in zip(specs, _per_cluster_options(sweep_opts, specs)):
        st = _plan_setup(model, c, opts)
        points += sweep(st.problem(), st.inputs.num_gpus)
    return points


def _evaluation(inputs: Inputs, par: ParallelConfig, headroom: float, framework: str, convention: str):
    from .evaluation import evaluate as run_eval
    return run_eval(inputs.model, inputs.cluster, inputs.job, par, inputs.num_gpus, headroom, framework, convention)


def evaluate(model: ModelLike | None = None, cluster: ClusterLike | None = None,
             **options: Unpack[EvaluateOptions]) -> PlanDocument:
    """Evaluate one given configuration, feasible or not: the plan document with one plan, whose ``feasible``
    flag and ``violations`` say whether it fits and which rule it breaks. Options as ``plan``'s job options plus
    the layout (``tp``, ``pp``, ``cp``, ``ep``, ``etp``, ``vpp``, ``micro_batch_size``, ``zero_stage``,
    ``recompute``, ``recompute_num_layers``, ``sequence_parallel``, ``first_stage_layers``, ``last_stage_layers``;
    Megatron-LM's defaults where left out) and the cost options (``train_tokens``, ...: ``CostOptions``).
    Raises only input errors (``PlanInputError`` and the loaders')."""
    from .cost import attach_costs
    from .document import build_document
    o = dict(options)
    check_keys(o, JOB_KEYS | LAYOUT_KEYS | COST_KEYS, "evaluate")
    cost = _cost_options(o)
    inputs, par, headroom, fw, conv = _layout_problem(
        model, cluster, {k: v for k, v in o.items() if k not in COST_KEYS}, "evaluate")
    _check_price_names(cost, [inputs.cluster.name])
    ev = _evaluation(inputs, par, headroom, fw, conv)
    doc = build_document(inputs.model, inputs.cluster, inputs.job, inputs.num_gpus, [ev],
                         at_risk_option(o.get("at_risk_margin")))
    return attach_costs(doc, [ev], inputs.model, inputs.cluster, inputs.job, inputs.num_gpus, cost)


@dataclass(frozen=True)
class MemoryReport:
    """``memory``'s answer: the per-stage estimate (bytes), its memory verdict (``status``: ``fits`` / ``at risk`` /
    ``over headroom`` / ``OOM``: ``planner.checks.memory_verdict``, the verdict ``evaluate`` and ``explain`` give
    too), the layout's other broken rules (``violations``: ``planner.checks.check_config``'s, as ``evaluate``
    reports them, e.g. ``heads_tp``), and the plan document (``plan3d memory --format json``) whose
    ``plans[0].memory.stages`` carry the breakdown and ``plans[0].violations`` every broken rule."""

    inputs: Inputs
    parallel: ParallelConfig
    estimate: MemoryEstimate
    status: str
    document: PlanDocument
    memory_headroom: float = DEFAULT_HEADROOM
    at_risk_margin: float = DEFAULT_AT_RISK_MARGIN
    violations: tuple[Violation, ...] = ()

    @property
    def verdict(self) -> str:
        """The line ``plan3d memory`` prints: ``invalid layout: NAME (why); ...`` when the layout breaks a rule
        other than memory (it cannot run, whatever its memory), else the memory verdict ``status``."""
        return f"invalid layout: {_rules_broken(self.violations)}" if self.violations else self.status

    @property
    def title(self) -> str:
        """One-line description of the configuration (the table's title)."""
        m, c, n, job, par = self.inputs.model, self.inputs.cluster, self.inputs.num_gpus, self.inputs.job, self.parallel
        return (f"plan3d memory: {m.name} on {n} x {c.gpu.name} ({c.name}), {job.framework}, tp {par.tp} pp {par.pp} "
                f"dp {par.dp} cp {par.cp} ep {par.ep} vpp {par.vpp}, mbs {par.micro_batch_size}, zero "
                f"{par.zero_stage}, recompute {par.recompute}, seq {job.seq_length}")

    def raise_if_infeasible(self) -> None:
        """Raise ``NoFeasiblePlan`` when the layout breaks a rule (naming each, as ``explain`` exits 1 for it) or
        does not fit the headroom (``raise_if_oom``): ``plan3d memory``'s exit 1."""
        if self.violations:
            raise NoFeasiblePlan(f"configuration infeasible: {_rules_broken(self.violations)}")
        self.raise_if_oom()

    def raise_if_oom(self) -> None:
        """Raise ``NoFeasiblePlan`` naming the peak stage when the estimate does not fit the headroom (verdict
        ``OOM`` or ``over headroom``: infeasible, as ``evaluate`` and ``explain`` say; ``plan3d memory``'s exit 1).
        An ``at risk`` verdict fits and does not raise."""
        pk, cap, gib = self.estimate.peak_stage, self.estimate.capacity_bytes, 2**30
        if self.status == "OOM":
            raise NoFeasiblePlan(f"out of memory: stage {pk.stage} peaks at {pk.total / gib:.1f} GiB in {pk.phase} "
                                 f"> {cap / gib:.1f} GiB capacity")
        if self.status == "over headroom":
            h = self.memory_headroom
            raise NoFeasiblePlan(f"over the memory headroom: stage {pk.stage} peaks at {pk.total / gib:.1f} GiB in "
                                 f"{pk.phase} > {cap * (1 - h) / gib:.1f} GiB usable ({cap / gib:.1f} GiB capacity "
                                 f"less {h:.0%} headroom); --memory-headroom lowers the limit")


def memory(model: ModelLike | None = None, cluster: ClusterLike | None = None,
           **options: Unpack[LayoutOptions]) -> MemoryReport:
    """Per-stage memory breakdown of one given configuration (options as ``evaluate``; ``capacity_factor`` pads a
    MoE model's expert buffers). Does not raise for a layout that does not fit or breaks a rule: ``status`` says
    ``OOM``, ``violations`` lists the rules and ``raise_if_infeasible`` raises. Raises ``NoFeasiblePlan`` naming
    the broken rules when the layout has no memory estimate at all (a rule the cost models need, e.g. the layer
    split ``layers_pp``), and the input errors of ``evaluate``."""
    from .document import build_document
    from .memory_report import status
    o = dict(options)
    inputs, par, headroom, fw, conv = _layout_problem(model, cluster, o, "memory")
    margin = at_risk_option(o.get("at_risk_margin"))
    ev = _evaluation(inputs, par, headroom, fw, conv)
    rules = tuple(v for v in ev.violations if v.name != "memory")  # memory's own rule is the verdict (status)
    if ev.memory is None:
        raise NoFeasiblePlan(f"configuration infeasible: {_rules_broken(rules) or 'no memory estimate'}")
    doc = build_document(inputs.model, inputs.cluster, inputs.job, inputs.num_gpus, [ev], margin)
    return MemoryReport(inputs, par, ev.memory, status(ev.memory, headroom, margin), doc, headroom, margin, rules)


def _rules_broken(violations) -> str:
    """``NAME (message); ...`` of broken rules (``planner.checks.Violation``), as one line."""
    return "; ".join(f"{v.name} ({v.message})" for v in violations)


@dataclass(frozen=True)
class ExplainReport:
    """``explain``'s answer: every constraint of one configuration with its slack (``explanation.constraints``),
    the binding one (``explanation.binding``) and the evaluation (memory, step time)."""

    inputs: Inputs
    parallel: ParallelConfig
    explanation: Explanation
    memory_headroom: float
    at_risk_margin: float = DEFAULT_AT_RISK_MARGIN

    @property
    def feasible(self) -> bool:
        return self.explanation.evaluation.feasible

    @property
    def memory_verdict(self) -> str | None:
        """``planner.checks.memory_verdict`` of the configuration (None when it has no memory estimate)."""
        mem = self.explanation.evaluation.memory
        if mem is None:
            return None
        from .checks import memory_verdict
        return memory_verdict(mem, self.memory_headroom, self.at_risk_margin)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``plan3d explain --format json``)."""
        from .document import _r, parallel_info
        from .explanation import explanation_rows
        st = self.explanation.evaluation.step
        i = self.inputs
        # the layout as the plan document writes it (pipeline_schedule, etp = tp for dense layers), times rounded
        # as there (6 significant digits)
        return {"model": i.model.name, "cluster": i.cluster.name, "num_gpus": i.num_gpus,
                "parallel": parallel_info(self.parallel, i.job).model_dump(mode="json"), "feasible": self.feasible,
                "memory_headroom": self.memory_headroom, "framework": i.job.framework,
                "at_risk_margin": self.at_risk_margin, "memory_verdict": self.memory_verdict,
                "constraints": explanation_rows(self.explanation),
                "step_s": _r(st.step_s) if st else None, "tokens_per_s": _r(st.tokens_per_s) if st else None}

    def raise_if_infeasible(self) -> None:
        """Raise ``NoFeasiblePlan`` naming the binding constraint, its slack and, for memory, the changes on this
        layout that fit (``plan3d explain``'s exit 1)."""
        if self.feasible:
            return
        from .explanation import format_slack, relief_on_layout
        b = self.explanation.binding
        relief = ""
        if b.unit == "bytes" and self.explanation.evaluation.memory is not None:
            i = self.inputs
            tries = relief_on_layout(i.model, i.cluster, i.job, self.parallel, i.num_gpus, self.memory_headroom,
                                     i.job.framework, point_to_plan=True)
            relief = (". Changes: " + "; ".join(tries)) if tries else ""
        raise NoFeasiblePlan(f"configuration infeasible: {b.name} binds ({b.detail}; slack {format_slack(b)})"
                             f"{relief}")


def explain(model: ModelLike | None = None, cluster: ClusterLike | None = None,
            **options: Unpack[LayoutOptions]) -> ExplainReport:
    """Every constraint of one given configuration with its slack (options as ``evaluate``). Does not raise for
    an infeasible configuration: ``raise_if_infeasible`` does."""
    from .explanation import explain_config
    inputs, par, headroom, fw, _ = _layout_problem(model, cluster, dict(options), "explain")
    ex = explain_config(inputs.model, inputs.cluster, inputs.job, par, inputs.num_gpus, headroom, fw)
    return ExplainReport(inputs, par, ex, headroom, at_risk_option(options.get("at_risk_margin")))


def validate(dataset: str | os.PathLike[str] | None = None, cross_validate: bool = False,
             progress: Any = None, workers: int | None = None) -> ValidationReport:
    """Run the step-time model over published, measured training runs (default: the packaged dev rows) and
    return the per-row and per-group errors (``ValidationReport.mape``, ``group_mape()``, ``failures(...)``).
    ``cross_validate``: also refit the model's constants without each source group and predict the group with them
    (``ValidationReport.cross_validation``, ``planner.calibration.cross_validate``: the folds run in ``workers``
    processes, default one per CPU; about 100 s on a 2-core machine, 170 s in one process), ``progress(group, done,
    total)`` called as each fold finishes. Raises ``PlanInputError`` for an unreadable dataset, one with no evaluable
    row, or ``workers`` below 1."""
    from .validation import load_rows, run_validation
    if workers is not None and workers < 1:
        raise PlanInputError(f"--workers: {workers}; allowed: an integer >= 1 (processes for the cross-validation)")
    rep = run_validation(dataset)
    if not rep.evaluated:
        reasons = sorted({r.skipped for r in rep.rows if r.skipped})
        raise PlanInputError(f"--dataset: no row could be evaluated ({len(rep.rows)} rows"
                             + (f"; skipped: {'; '.join(reasons[:3])}" if reasons else "") + ")")
    if cross_validate:
        from .calibration import cross_validate as run_cross_validation
        rep.cross_validation = run_cross_validation(load_rows(dataset), fold_progress=progress, workers=workers)
    return rep
