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

import math
import numbers
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, TypedDict

from .errors import NoFeasiblePlan, PlanInputError

if TYPE_CHECKING:  # heavy imports stay lazy: the CLI's start-up only pays for what a command uses
    from typing import Unpack

    from cluster_specs.spec import ClusterSpec
    from cost_models.config import ParallelConfig, TrainingJob
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

#: Allowed values of the enumerated options (the CLI's choices; the API checks them itself).
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")
FLOPS_CONVENTIONS = ("megatron", "palm")
RECOMPUTE_CHOICES = ("none", "selective", "full")
#: Pipeline schedules (``cost_models.config.Schedule``; which framework runs which: ``schedule_checks.FRAMEWORK_SCHEDULES``).
SCHEDULE_CHOICES = ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-v", "dualpipe", "dualpipev", "combined-1f1b")
SOLVERS = ("cpsat", "enumerate")
OBJECTIVES = ("throughput", "headroom", "min-gpus", "cost")
#: Default fraction of GPU memory kept free (planner.checks.DEFAULT_MEMORY_HEADROOM; the CLI repeats the value to
#: keep its start-up light and a test keeps the two equal).
DEFAULT_HEADROOM = 0.05
#: Default at-risk margin (planner.checks.DEFAULT_AT_RISK_MARGIN, repeated for the same reason).
DEFAULT_AT_RISK_MARGIN = 0.10
#: Default allowed throughput loss of ``objective="headroom"`` (fraction of the best step time).
DEFAULT_WITHIN = 0.05
#: Most plans one ``plan`` call lists. Each listed plan is timed in full by the scalar model, so the call's time
#: grows with it (Llama-3.1-8B default job on 8 H100s: top-k 1,000 in ~3 s of CPU, 10,000 in ~12 s, every
#: candidate in ~50 s: the 10,000-input fuzz run's slowest plan). Issue 14: no call runs without bound.
MAX_TOP_K = 1000


class JobOptions(TypedDict, total=False):
    """The job and its size, shared by every function (CLI: ``--gpus``, ``--global-batch-size``, ...)."""

    gpus: int | None
    nodes: int | None
    global_batch_size: int
    seq_length: int
    precision: Literal["bf16", "fp16", "fp8", "fp32"]
    flash_attention: bool
    dropout: bool
    framework: Literal["megatron", "deepspeed", "torchtitan"] | None
    memory_headroom: float
    at_risk_margin: float
    full_model_init: bool
    flops_convention: Literal["megatron", "palm"]
    expert_load_imbalance: float | None
    capacity_factor: float | None


class LayoutOptions(JobOptions, total=False):
    """One given configuration (``evaluate``, ``memory``, ``explain``); options left out take Megatron-LM's
    defaults. ``dp`` is derived: GPUs / (tp x pp x cp)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int | None
    vpp: int
    micro_batch_size: int
    zero_stage: int
    recompute: Literal["none", "selective", "full"]
    recompute_num_layers: int | None
    sequence_parallel: bool
    first_stage_layers: int | None
    last_stage_layers: int | None
    pipeline_layout: str | None
    recompute_modules: tuple[str, ...] | None
    offload_modules: tuple[str, ...] | None
    recompute_method: Literal["block", "uniform"]
    optimizer_cpu_offload: float
    param_cpu_offload: bool
    exp_avg_dtype: Literal["fp32", "fp16", "bf16", "fp8"]
    exp_avg_sq_dtype: Literal["fp32", "fp16", "bf16", "fp8"]
    main_params_dtype: Literal["fp32", "fp16", "bf16"]
    pipeline_schedule: str | None


class CostOptions(TypedDict, total=False):
    """The whole-run cost (``plan`` and ``evaluate``; planner/cost.py): with ``train_tokens`` each plan gets a
    ``cost`` block. ``gpu_hour_price`` is USD per GPU-hour (one number, ``"NAME=USD,..."`` or a dict by cluster
    name; default: the cluster's own dated price); ``interruption_rate`` (per GPU-hour), ``restart_s`` and ``pue``
    override the cluster's figures; ``async_checkpoint`` hides the checkpoint write behind compute."""

    train_tokens: float | None
    gpu_hour_price: float | str | dict[str, float] | None
    async_checkpoint: bool
    interruption_rate: float | None
    restart_s: float | None
    pue: float | None


class EvaluateOptions(LayoutOptions, CostOptions, total=False):
    """``evaluate``: one layout, and optionally its whole-run cost."""


class PlanOptions(JobOptions, CostOptions, total=False):
    """``plan``: the search's settings and pins (a pinned knob is searched at that value only). ``objective``
    ``cost`` is the cheapest plan that trains ``train_tokens`` by ``deadline_days``; ``min-gpus`` takes
    ``deadline_days`` instead of a rate target."""

    top_k: int
    solver: Literal["cpsat", "enumerate"]
    objective: Literal["throughput", "headroom", "min-gpus", "cost"]
    within: float | None
    target_step_s: float | None
    target_tokens_per_day: float | None
    deadline_days: float | None
    global_batch_size_tolerance: float | None
    tp: int | None
    pp: int | None
    cp: int | None
    ep: int | None
    vpp: int | None
    micro_batch_size: int | None
    zero_stage: int | None
    recompute: Literal["none", "selective", "full"] | None
    first_stage_layers: int | None
    last_stage_layers: int | None
    pipeline_schedule: str | None
    #: wall seconds that repeated planning may take (min-gpus counts, nearest-change searches; ``None``: no limit;
    #: default ``planner.progress.DEFAULT_BUDGET_S``) and a callback told each step (a progress line)
    time_budget_s: float | None
    progress: Callable[[str], None] | None


_JOB_KEYS = frozenset(JobOptions.__annotations__)
_LAYOUT_KEYS = frozenset(LayoutOptions.__annotations__) - _JOB_KEYS
_COST_KEYS = frozenset(CostOptions.__annotations__)
_PLAN_KEYS = frozenset(PlanOptions.__annotations__) | _COST_KEYS


@dataclass(frozen=True)
class Inputs:
    """A resolved problem: the model, the cluster, the world size (GPUs) and the job."""

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    job: TrainingJob


@dataclass(frozen=True)
class SearchStats:
    """How the search went: candidates examined, feasible ones (an upper bound when ``exact`` is False: CP-SAT
    stopped re-scoring once no other candidate could enter the top K)."""

    num_candidates: int
    num_feasible: int
    exact: bool
    #: one line when the search stopped at its time budget (what was not tried), else None
    note: str | None = None


def _flag(field: str) -> str:
    """The command-line spelling of an option (``seq_length`` -> ``--seq-length``): messages name the option as
    both the CLI and the API user know it."""
    return "--" + field.replace("_", "-")


def _bool(field: str, value: Any) -> bool:
    """A yes/no option: ``True`` or ``False``; anything else, the string ``"false"`` included (``bool("false")`` is
    true), is an input error naming the option."""
    if isinstance(value, bool):
        return value
    raise PlanInputError(f"{_flag(field)} {value!r}: must be true or false")


def _choice(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise PlanInputError(f"{_flag(field)} {value!r}: must be one of {', '.join(allowed)}")
    return value


def _check_keys(options: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise PlanInputError(f"{where}: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def load_inputs(model: ModelLike | None = None, cluster: ClusterLike | None = None, *, gpus: int | None = None,
                nodes: int | None = None, global_batch_size: int = 1024, seq_length: int = 4096,
                precision: str = "bf16", flash_attention: bool = True, dropout: bool = False,
                framework: str | None = None, full_model_init: bool = False,
                expert_load_imbalance: float | None = None, capacity_factor: float | None = None) -> Inputs:
    """Resolve the model (default ``llama3.1-8b``), the cluster (default ``dgx-h100``), the GPU count (``gpus`` or
    ``nodes``; default the cluster's default node count: a multiple of the node size, or a divisor of it for a job
    on part of one node) and the job (``full_model_init``: every rank first materializes its whole 16-bit model,
    DeepSpeed without ``zero.Init``; checked as the init phase; ``expert_load_imbalance``: dropless MoE routing's
    busiest expert over the mean in one micro-batch, None = ``cost_models/moe_imbalance.py``'s default;
    ``capacity_factor``: drop-and-pad MoE routing to that capacity, Megatron-LM ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``, None = dropless).

    Raises ``ModelSpecError`` / ``ClusterSpecError`` (unreadable or invalid files, unknown names, a GPU count that
    is not whole nodes) and ``PlanInputError`` (an option outside its allowed values).
    """
    from cluster_specs import DEFAULT_CLUSTER, load_cluster, resolve_num_gpus
    from cluster_specs.spec import ClusterSpec
    from cost_models.config import TrainingJob
    from model_zoo import DEFAULT_MODEL, load_model
    from model_zoo.spec import ModelSpec

    _choice("precision", precision, PRECISIONS)
    fw = _choice("framework", framework or "megatron", FRAMEWORKS)
    for field, v in (("global_batch_size", global_batch_size), ("seq_length", seq_length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanInputError(f"{_flag(field)} {v!r}: must be a positive integer")
    if isinstance(model, ModelSpec):
        m = model
    else:
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise PlanInputError(f"--model {model!r}: give a built-in name (plan3d models), a model YAML or "
                                 f"config.json path, or a ModelSpec")
        if model is not None and not str(model).strip():
            raise PlanInputError("--model: empty; give a built-in name (plan3d models), a model YAML or a config.json")
        m = load_model(os.fspath(model) if model is not None else DEFAULT_MODEL)
    if m.position_embedding == "learned" and seq_length > m.max_position_embeddings:
        # a longer learned position table is another model (more parameters): refuse rather than plan it
        raise PlanInputError(f"--seq-length {seq_length} exceeds {m.name}'s learned position embeddings "
                             f"(max_position_embeddings {m.max_position_embeddings}); use --seq-length <= "
                             f"{m.max_position_embeddings} or a model file with a longer table")
    if cluster is not None and not isinstance(cluster, (ClusterSpec, str, os.PathLike)):
        raise PlanInputError(f"--cluster {cluster!r}: give a built-in name (plan3d clusters), a cluster YAML path "
                             f"or a ClusterSpec")
    if cluster is not None and not isinstance(cluster, ClusterSpec) and not os.fspath(cluster).strip():
        raise PlanInputError("--cluster: empty; give a built-in name (plan3d clusters) or a cluster YAML")
    c = cluster if isinstance(cluster, ClusterSpec) else load_cluster(
        os.fspath(cluster) if cluster is not None else DEFAULT_CLUSTER)
    n = resolve_num_gpus(c, gpus, nodes)
    if precision not in c.supported_precisions:
        raise PlanInputError(f"--precision {precision}: {c.gpu.name} supports {', '.join(c.supported_precisions)}")
    if precision == "fp32" and flash_attention and fw in ("megatron", "deepspeed"):
        # Transformer Engine's DotProductAttention picks its unfused backend for fp32 (FlashAttention and cuDNN
        # fused attention take fp16/bf16 only), so a fused-attention fp32 plan would not be the run that happens
        raise PlanInputError(f"--precision fp32 with --framework {fw}: fused attention has no fp32 kernel (Transformer "
                             f"Engine runs its unfused attention); add --no-flash-attention, or use --framework "
                             f"torchtitan (PyTorch SDPA's memory-efficient kernel takes fp32)")
    if precision == "fp16" and fw == "torchtitan":
        # torchtitan's mixed_precision_param is Literal["bfloat16", "float32"] (config/job_config.py at 0.2.2,
        # config/configs.py at 0.3.0) and it has no loss scaling
        raise PlanInputError("--precision fp16 with --framework torchtitan: torchtitan trains bf16 or fp32 (no fp16 "
                             "loss scaling); use --precision bf16, or --framework megatron")
    if dropout and fw == "torchtitan":
        # the step time and the launch would disagree: torchtitan builds no dropout (its models/llama3 model.py,
        # models/deepseek_v3 have none), while the memory model would store masks
        raise PlanInputError("--dropout with --framework torchtitan: torchtitan's models have no dropout layers; "
                             "drop --dropout, or use --framework megatron")
    expert_load_imbalance = _real("expert_load_imbalance", expert_load_imbalance, "a number >= 1 (the busiest "
                                  "expert's routed tokens over the mean; 1 = balanced)")
    capacity_factor = _real("capacity_factor", capacity_factor, "a number >= 1 (each expert's capacity over the "
                            "balanced share)")
    if expert_load_imbalance is not None:
        _check_routing_ratio("--expert-load-imbalance", m, expert_load_imbalance,
                             "the busiest expert then receives every token")
    if capacity_factor is not None:
        _check_capacity_factor(m, fw, capacity_factor, expert_load_imbalance)
    from pydantic import ValidationError
    try:
        job = TrainingJob(global_batch_size=global_batch_size, seq_length=seq_length, precision=precision,
                          flash_attention=_bool("flash_attention", flash_attention),
                          dropout=_bool("dropout", dropout), framework=fw,
                          full_model_init=_bool("full_model_init", full_model_init),
                          expert_load_imbalance=expert_load_imbalance, moe_expert_capacity_factor=capacity_factor)
    except ValidationError as e:  # a plausible range (cost_models/config.py): "--seq-length V is outside [lo, hi]"
        from .errors import option_error
        raise option_error(e, {"global_batch_size": "--global-batch-size", "seq_length": "--seq-length",
                               "expert_load_imbalance": "--expert-load-imbalance",
                               "moe_expert_capacity_factor": "--capacity-factor"}) from None
    return Inputs(m, c, n, job)


def _real(field: str, value: Any, allowed: str) -> float | None:
    """``value`` as a finite float (any real number type: int, float, numpy scalars), None kept; a one-line
    ``PlanInputError`` naming the option otherwise."""
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise TypeError
        return float(value)
    except (TypeError, OverflowError, ValueError):
        text = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise PlanInputError(f"{_flag(field)} {text}: must be {allowed}") from None


def _check_routing_ratio(flag: str, model: Any, value: float, at_most: str) -> None:
    """Rules common to the MoE routing ratios over the balanced share (``--capacity-factor``,
    ``--expert-load-imbalance``): the model has routed experts, and the ratio is at most ``num_experts / top_k``.
    Each token picks ``top_k`` distinct experts, so an expert receives at most every token of the micro-batch, while
    the balanced share (the mean) is ``tokens x top_k / num_experts`` (Megatron-LM ``TopKRouter``; the same bound
    Megatron's capacity ``tokens x top_k / E x F`` reaches when every expert holds every token). ``at_most`` says
    what the bound means for ``flag``. Raises ``PlanInputError``."""
    if model.moe is None:
        raise PlanInputError(f"{flag} applies to MoE models; {model.name} has no experts")
    most = model.moe.num_experts / model.moe.top_k
    if value > most:
        raise PlanInputError(f"{flag} {value:g}: at most num_experts / top_k = {most:g} for {model.name} "
                             f"({at_most})")


def _check_capacity_factor(model: Any, framework: str, capacity_factor: float,
                           expert_load_imbalance: float | None) -> None:
    """Drop-and-pad routing's own rules (``--capacity-factor``): a MoE model, at most ``num_experts / top_k`` (the
    capacity at which every expert holds every token: Megatron-LM pads each expert to ``tokens x top_k / E x F``
    slots and picks them by ``topk`` over the tokens), Megatron-LM (whose ``--moe-expert-capacity-factor`` plan3d
    costs and emits), and no ``--expert-load-imbalance`` (a dropless setting: padded, every expert holds its
    capacity). Raises ``PlanInputError``."""
    _check_routing_ratio("--capacity-factor", model, capacity_factor, "every expert then holds every token")
    if framework != "megatron":
        raise PlanInputError(f"--capacity-factor with --framework {framework}: drop-and-pad routing is costed and "
                             f"emitted for Megatron-LM (--moe-expert-capacity-factor); drop --capacity-factor or use "
                             f"--framework megatron")
    if expert_load_imbalance is not None:
        raise PlanInputError("--expert-load-imbalance with --capacity-factor: the imbalance is dropless routing's; "
                             "padded to capacity, every expert holds its capacity; give one of them")


def _job_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    return {k: options[k] for k in ("gpus", "nodes", "global_batch_size", "seq_length", "precision",
                                    "flash_attention", "dropout", "framework", "full_model_init",
                                    "expert_load_imbalance", "capacity_factor") if k in options}


def _fraction(field: str, value: float | None, default: float) -> float:
    """A memory fraction option (``memory_headroom``, ``at_risk_margin``) in [0, 0.5], ``default`` when None."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 0.5:
        raise PlanInputError(f"{_flag(field)} {value!r}: must be a fraction in [0, 0.5]")
    return float(value)


def _headroom(value: float | None) -> float:
    return _fraction("memory_headroom", value, DEFAULT_HEADROOM)


def _at_risk_margin(value: float | None) -> float:
    return _fraction("at_risk_margin", value, DEFAULT_AT_RISK_MARGIN)


def parallel_config(inputs: Inputs, *, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
                    vpp: int = 1, micro_batch_size: int = 1, zero_stage: int = 0, recompute: str = "none",
                    recompute_num_layers: int | None = None, sequence_parallel: bool = False,
                    first_stage_layers: int | None = None, last_stage_layers: int | None = None,
                    pipeline_layout: str | None = None, recompute_modules: tuple[str, ...] | None = None,
                    offload_modules: tuple[str, ...] | None = None,
                    recompute_method: str = "block",
                    optimizer_cpu_offload: float = 0.0, param_cpu_offload: bool = False,
                    exp_avg_dtype: str = "fp32", exp_avg_sq_dtype: str = "fp32",
                    main_params_dtype: str = "fp32", pipeline_schedule: str | None = None) -> ParallelConfig:
    """The ``ParallelConfig`` of one given layout on ``inputs`` (``dp`` derived as GPUs / (tp x pp x cp)).

    Memory knobs (``cost_models.config.ParallelConfig``): ``pipeline_layout`` (Megatron
    ``--pipeline-model-parallel-layout``, a custom per-stage layer list), ``offload_modules`` (Megatron
    ``--offload-modules``: activation offloading to host memory), ``recompute_modules`` (``--recompute-modules``
    under selective recompute), ``recompute_method`` (``--recompute-method`` block | uniform with
    ``recompute_num_layers``), ``optimizer_cpu_offload`` (share of the optimizer in host memory: Megatron
    ``--optimizer-offload-fraction``, DeepSpeed ``offload_optimizer``), ``param_cpu_offload`` (DeepSpeed ZeRO-3
    ``offload_param``), ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` / ``main_params_dtype`` (optimizer-state precision).

    When ``pp`` does not divide the layers and no split is given, the end stages get fewer layers (Megatron's
    ``--decoder-first/last-pipeline-num-layers``); interleaved (``vpp`` > 1), such a split counts the embedding
    and the loss as one layer each (``--account-for-embedding/loss-in-pipeline-split``), as the search does
    (``planner.space.to_parallel``). Raises ``PlanInputError`` for sizes that cannot form a layout.
    """
    from pydantic import ValidationError

    from cost_models.config import ParallelConfig
    from cost_models.layout import uneven_split

    _choice("recompute", recompute, RECOMPUTE_CHOICES)
    if pipeline_schedule is not None:
        _choice("pipeline_schedule", pipeline_schedule, SCHEDULE_CHOICES)
    sizes = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "micro_batch_size": micro_batch_size}
    for field, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanInputError(f"{_flag(field)} {v!r}: must be a positive integer")
    n, layers = inputs.num_gpus, inputs.model.num_layers
    if n % (tp * pp * cp):
        raise PlanInputError(f"--gpus {n} is not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp}")
    if pp * vpp > layers + 2:  # the cost models build pp x vpp chunks: --vpp 1e9 would allocate gigabytes
        raise PlanInputError(f"--vpp {vpp}: pp x vpp = {pp * vpp} model chunks for {layers} layers; each chunk holds "
                             f"at least one layer (the embedding and the loss may count as one each): at most "
                             f"{max(1, (layers + 2) // pp)}")
    first, last, account = first_stage_layers, last_stage_layers, False
    if first is None and last is None and layers % pp and pipeline_layout is None:
        split = uneven_split(layers, pp)
        if split is not None:
            first, last = split
        if vpp > 1 and (layers + 2) % (pp * vpp) == 0:
            first = last = None
            account = True
    try:
        return ParallelConfig(tp=tp, pp=pp, dp=n // (tp * pp * cp), cp=cp, ep=ep, etp=etp, vpp=vpp,
                              micro_batch_size=micro_batch_size, zero_stage=zero_stage, recompute=recompute,
                              recompute_num_layers=recompute_num_layers,
                              sequence_parallel=_bool("sequence_parallel", sequence_parallel),
                              first_stage_layers=first, last_stage_layers=last,
                              account_for_embedding_in_pipeline_split=account,
                              account_for_loss_in_pipeline_split=account, pipeline_layout=pipeline_layout,
                              recompute_modules=tuple(recompute_modules) if recompute_modules else None,
                              offload_modules=tuple(offload_modules) if offload_modules else None,
                              recompute_method=recompute_method,
                              optimizer_cpu_offload_fraction=optimizer_cpu_offload,
                              param_cpu_offload=_bool("param_cpu_offload", param_cpu_offload),
                              exp_avg_dtype=exp_avg_dtype,
                              exp_avg_sq_dtype=exp_avg_sq_dtype, main_params_dtype=main_params_dtype,
                              schedule=pipeline_schedule)
    except ValidationError as e:
        err = e.errors()[0]
        name = {"optimizer_cpu_offload_fraction": "optimizer_cpu_offload"}.get(str(err["loc"][0]), str(err["loc"][0])) \
            if err.get("loc") else "layout"
        field = _flag(name)
        raise PlanInputError(f"{field} {err.get('input')!r}: {err.get('msg', 'invalid')}") from None


def _cost_options(options: dict[str, Any]):
    """``planner.cost.CostOptions`` of the cost keys in ``options`` (None without ``train_tokens``)."""
    from .cost import cost_options
    return cost_options(options.get("train_tokens"), gpu_hour_price=options.get("gpu_hour_price"),
                        async_checkpoint=_bool("async_checkpoint", options.get("async_checkpoint", False)),
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
    _check_keys(options, _JOB_KEYS | _LAYOUT_KEYS, where)
    inputs = load_inputs(model, cluster, **_job_kwargs(options))
    par = parallel_config(inputs, **{k: options[k] for k in _LAYOUT_KEYS if k in options})
    conv = _choice("flops_convention", options.get("flops_convention") or "megatron", FLOPS_CONVENTIONS)
    return inputs, par, _headroom(options.get("memory_headroom")), inputs.job.framework, conv


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
    keys = ("gpus", "nodes", "global_batch_size", "seq_length", "precision", "flash_attention", "dropout",
            "framework", "capacity_factor")
    inputs = load_inputs(model, cluster, **{k: options[k] for k in keys if options.get(k) is not None})
    why = job_refusal(emit, inputs.model, inputs.job)
    if why is not None:
        alt = "; change that option, or --emit megatron, which runs it" if emit != "megatron" and job_refusal(
            "megatron", inputs.model, inputs.job) is None else ""
        raise NoFeasiblePlan(f"--emit {emit}: {why}; no parallel layout changes that{alt}")


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
            raise PlanInputError(f"{_flag(k)} {v}: with --pp {pp} and {num_layers} layers plan searches "
                                 f"{', '.join(map(str, sizes))} (end stages at most {END_STAGE_LIGHTER} layers "
                                 f"lighter than the middle ones); plan3d evaluate takes any split")


def _plan_setup(model, cluster, options: dict[str, Any]) -> _PlanSetup:
    """Check ``plan``'s options and resolve the inputs (raises the input errors ``plan`` documents)."""
    _check_keys(options, _PLAN_KEYS, "plan")
    o = dict(options)
    objective = _choice("objective", o.get("objective", "throughput"), OBJECTIVES)
    solver = _choice("solver", o.get("solver", "cpsat"), SOLVERS)
    conv = _choice("flops_convention", o.get("flops_convention") or "megatron", FLOPS_CONVENTIONS)
    step_t, tok_t, within = o.get("target_step_s"), o.get("target_tokens_per_day"), o.get("within")
    for field, v in (("target_step_s", step_t), ("target_tokens_per_day", tok_t)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise PlanInputError(f"{_flag(field)} {v!r}: must be a positive finite number")
    if within is not None and objective != "headroom":
        raise PlanInputError("--within applies to --objective headroom only")
    if within is not None and (isinstance(within, bool) or not isinstance(within, (int, float))
                               or not 0.0 <= within <= 1.0):
        raise PlanInputError(f"--within {within!r}: must be a fraction in [0, 1] (the throughput loss allowed)")
    # the pins, as the CLI's option ranges check them (the search divides by them)
    for k in ("tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "first_stage_layers", "last_stage_layers"):
        v = o.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise PlanInputError(f"{_flag(k)} {v!r}: must be a positive integer")
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
    inputs = load_inputs(model, cluster, **_job_kwargs(o))
    _check_price_names(cost, [inputs.cluster.name])
    _check_pinned_split(inputs.model.num_layers, o)
    headroom = _headroom(o.get("memory_headroom"))
    if o.get("recompute") is not None:
        _choice("recompute", o["recompute"], RECOMPUTE_CHOICES)
    if o.get("pipeline_schedule") is not None:
        _choice("pipeline_schedule", o["pipeline_schedule"], SCHEDULE_CHOICES)
        from .space import SEARCH_SCHEDULES
        searched = ("1f1b", "interleaved", *SEARCH_SCHEDULES[inputs.job.framework])
        if o["pipeline_schedule"] not in searched:
            raise PlanInputError(f"--pipeline-schedule {o['pipeline_schedule']}: {inputs.job.framework} plans search "
                                 f"{', '.join(searched)} (evaluate takes any schedule)")
    from .space import SearchSpace
    one = lambda x: None if x is None else (x,)  # noqa: E731
    sp_kw: dict[str, Any] = {k: one(o.get(k)) for k in ("tp", "pp", "cp", "ep", "vpp", "first_stage_layers",
                                                         "last_stage_layers")}
    for k in ("micro_batch_size", "zero_stage", "recompute", "pipeline_schedule"):
        if o.get(k) is not None:
            sp_kw[k] = (o[k],)
    from .progress import DEFAULT_BUDGET_S, Budget, no_progress
    seconds = o.get("time_budget_s", DEFAULT_BUDGET_S)
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not 0 < seconds < float("inf")):
        raise PlanInputError(f"--time-budget {seconds!r}: must be a positive number of seconds")
    return _PlanSetup(inputs, objective, solver, conv, headroom, top_k, within, step_t, tok_t,
                      None if deadline is None else float(deadline), cost, SearchSpace(**sp_kw), Budget(seconds),
                      o.get("progress") or no_progress, _at_risk_margin(o.get("at_risk_margin")),
                      None if tol is None else float(tol))


def plan(model: ModelLike | None = None, cluster: ClusterLike | None = None,
         **options: Unpack[PlanOptions]) -> PlanDocument:
    """Search the parallel layouts of a job and return the best plans (best first) as the plan document.

    ``options``: the job (``gpus`` or ``nodes``, ``global_batch_size`` 1024, ``seq_length`` 4096, ``precision``
    bf16, ``flash_attention`` True, ``dropout`` False, ``framework`` megatron, ``memory_headroom`` 0.05,
    ``flops_convention`` megatron), the search (``top_k`` 5, ``solver`` cpsat|enumerate, ``objective``
    throughput|headroom|min-gpus|cost with ``within`` / ``target_step_s`` / ``target_tokens_per_day`` /
    ``deadline_days``), pins (``tp``, ``pp``, ``cp``, ``ep``, ``vpp``, ``micro_batch_size``, ``zero_stage``,
    ``recompute``, ``first_stage_layers`` / ``last_stage_layers``: the decoder layers of the end stages) and the cost options (``train_tokens``, ...: ``CostOptions``; each plan then has a ``cost``).
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
    margin = _at_risk_margin(options.get("at_risk_margin"))
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
    _check_keys(o, _JOB_KEYS | _LAYOUT_KEYS | _COST_KEYS, "evaluate")
    cost = _cost_options(o)
    inputs, par, headroom, fw, conv = _layout_problem(
        model, cluster, {k: v for k, v in o.items() if k not in _COST_KEYS}, "evaluate")
    _check_price_names(cost, [inputs.cluster.name])
    ev = _evaluation(inputs, par, headroom, fw, conv)
    doc = build_document(inputs.model, inputs.cluster, inputs.job, inputs.num_gpus, [ev],
                         _at_risk_margin(o.get("at_risk_margin")))
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
    margin = _at_risk_margin(o.get("at_risk_margin"))
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
                                     i.job.framework)
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
    return ExplainReport(inputs, par, ex, headroom, _at_risk_margin(options.get("at_risk_margin")))


def validate(dataset: str | os.PathLike[str] | None = None, cross_validate: bool = False,
             progress: Any = None) -> ValidationReport:
    """Run the step-time model over published, measured training runs (default: the packaged dev rows) and
    return the per-row and per-group errors (``ValidationReport.mape``, ``group_mape()``, ``failures(...)``).
    ``cross_validate``: also refit the model's constants without each source group and predict the group with them
    (``ValidationReport.cross_validation``, ``planner.calibration.cross_validate``; one process, about 70 s on a
    2-core machine), ``progress`` called with each fold's name. Raises ``PlanInputError`` for an unreadable dataset
    or one with no evaluable row."""
    from .validation import load_rows, run_validation
    rep = run_validation(dataset)
    if not rep.evaluated:
        reasons = sorted({r.skipped for r in rep.rows if r.skipped})
        raise PlanInputError(f"--dataset: no row could be evaluated ({len(rep.rows)} rows"
                             + (f"; skipped: {'; '.join(reasons[:3])}" if reasons else "") + ")")
    if cross_validate:
        from .calibration import cross_validate as run_cross_validation
        rep.cross_validation = run_cross_validation(load_rows(dataset), fold_progress=progress)
    return rep
