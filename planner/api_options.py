"""The options of plan3d's Python API (``planner.api``): their allowed values and defaults, the typed
keyword sets of each function, the checks that turn a bad value into a one-line ``PlanInputError`` naming the
option, and their resolution into the model, cluster, job (``load_inputs``) and layout (``parallel_config``).
"""
from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, TypedDict

from .errors import PlanInputError

if TYPE_CHECKING:  # heavy imports stay lazy: the CLI's start-up only pays for what a command uses
    from cluster_specs.spec import ClusterSpec
    from cost_models.config import FlexDispatcherBackend, Fp8Recipe, ParallelConfig, TrainingJob
    from model_zoo.spec import ModelSpec

    #: a built-in name, a file path, or a built model / cluster
    ModelLike = str | os.PathLike[str] | ModelSpec
    ClusterLike = str | os.PathLike[str] | ClusterSpec

#: Allowed values of the enumerated options (the CLI's choices; the API checks them itself).
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
#: Megatron-LM ``--fp8-recipe`` choices (``cost_models.config.Fp8Recipe``; which framework runs which:
#: ``cost_models.fp8_recipe.FRAMEWORK_FP8_RECIPES``).
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
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
    software_date: str | None
    moe_flex_dispatcher_backend: FlexDispatcherBackend | None
    moe_flex_dispatcher_num_sms: int | None
    fp8_recipe: Fp8Recipe | None


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
    #: one granularity, or a tuple of those to search (``launchable_pins``: none or full for ds_config.json alone)
    recompute: Literal["none", "selective", "full"] | tuple[Literal["none", "selective", "full"], ...] | None
    first_stage_layers: int | None
    last_stage_layers: int | None
    pipeline_schedule: str | None
    #: wall seconds that repeated planning may take (min-gpus counts, nearest-change searches; ``None``: no limit;
    #: default ``planner.progress.DEFAULT_BUDGET_S``) and a callback told each step (a progress line)
    time_budget_s: float | None
    progress: Callable[[str], None] | None


JOB_KEYS = frozenset(JobOptions.__annotations__)
LAYOUT_KEYS = frozenset(LayoutOptions.__annotations__) - JOB_KEYS
COST_KEYS = frozenset(CostOptions.__annotations__)
PLAN_KEYS = frozenset(PlanOptions.__annotations__) | COST_KEYS


@dataclass(frozen=True)
class Inputs:
    """A resolved problem: the model, the cluster, the world size (GPUs) and the job."""

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    job: TrainingJob


def option_flag(field: str) -> str:
    """The command-line spelling of an option (``seq_length`` -> ``--seq-length``): messages name the option as
    both the CLI and the API user know it."""
    return "--" + field.replace("_", "-")


def check_bool(field: str, value: Any) -> bool:
    """A yes/no option: ``True`` or ``False``; anything else, the string ``"false"`` included (``bool("false")`` is
    true), is an input error naming the option."""
    if isinstance(value, bool):
        return value
    raise PlanInputError(f"{option_flag(field)} {value!r}: must be true or false")


def check_choice(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` when it is one of ``allowed``; else a ``PlanInputError`` naming the option and the allowed values."""
    if value not in allowed:
        raise PlanInputError(f"{option_flag(field)} {value!r}: must be one of {', '.join(allowed)}")
    return value


def check_keys(options: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """A ``PlanInputError`` naming the keyword options of ``where`` that are not in ``allowed``, and the allowed ones
    (a misspelt option is an error, never ignored)."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise PlanInputError(f"{where}: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


#: Tokens per sequence when the job does not say (``load_inputs``): Llama 2 / 3 pre-training's 4096.
DEFAULT_SEQ_LENGTH = 4096


def load_inputs(model: ModelLike | None = None, cluster: ClusterLike | None = None, *, gpus: int | None = None,
                nodes: int | None = None, global_batch_size: int = 1024, seq_length: int | None = None,
                precision: str = "bf16", flash_attention: bool = True, dropout: bool = False,
                framework: str | None = None, full_model_init: bool = False,
                expert_load_imbalance: float | None = None, capacity_factor: float | None = None,
                software_date: str | None = None, moe_flex_dispatcher_backend: str | None = None,
                moe_flex_dispatcher_num_sms: int | None = None, fp8_recipe: str | None = None) -> Inputs:
    """Resolve the model (default ``llama3.1-8b``), the cluster (default ``dgx-h100``), the GPU count (``gpus`` or
    ``nodes``; default the cluster's default node count: a multiple of the node size, or a divisor of it for a job
    on part of one node) and the job (``full_model_init``: every rank first materializes its whole 16-bit model,
    DeepSpeed without ``zero.Init``; checked as the init phase; ``expert_load_imbalance``: dropless MoE routing's
    busiest expert over the mean in one micro-batch, None = ``cost_models/moe_imbalance.py``'s default;
    ``capacity_factor``: drop-and-pad MoE routing to that capacity, Megatron-LM ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``, None = dropless; ``software_date``: ``YYYY-MM`` of the container or
    framework release the run uses, which picks the kernel library's generation in the efficiency tables,
    ``cluster_specs/data/efficiency/attention.yaml``, None = the newest; ``moe_flex_dispatcher_backend``:
    ``deepep`` or ``hybridep``, Megatron-LM's flex token dispatcher, timed inside one NVLink domain from its measured
    throughput, ``cluster_specs/data/efficiency/ep_dispatch.yaml``, with ``moe_flex_dispatcher_num_sms`` SMs, None =
    the backend's default; None = plan3d's choice; ``fp8_recipe``: Megatron-LM ``--fp8-recipe`` of an FP8 job,
    ``delayed`` / ``tensorwise`` / ``mxfp8`` / ``blockwise``, checked against the GPU and the framework,
    ``cost_models.fp8_recipe.fp8_recipe_problem``; None = the framework's default for the GPU and layout,
    ``cost_models.fp8_recipe.job_fp8_recipe``). ``seq_length`` None: ``DEFAULT_SEQ_LENGTH``
    (4096), or the model's ``max_position_embeddings`` when it has a shorter learned position table (GPT-3, OPT).

    Raises ``ModelSpecError`` / ``ClusterSpecError`` (unreadable or invalid files, unknown names, a GPU count that
    is not whole nodes) and ``PlanInputError`` (an option outside its allowed values).
    """
    from cluster_specs import DEFAULT_CLUSTER, load_cluster, resolve_num_gpus
    from cluster_specs.efficiency import SOFTWARE_DATE_PATTERN
    from cluster_specs.spec import ClusterSpec
    from cost_models.config import TrainingJob
    from model_zoo import DEFAULT_MODEL, load_model
    from model_zoo.spec import ModelSpec

    check_choice("precision", precision, PRECISIONS)
    fw = check_choice("framework", framework or "megatron", FRAMEWORKS)
    for field, v in (("global_batch_size", global_batch_size), ("seq_length", seq_length)):
        if field == "seq_length" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanInputError(f"{option_flag(field)} {v!r}: must be a positive integer")
    if isinstance(model, ModelSpec):
        m = model
    else:
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise PlanInputError(f"--model {model!r}: give a built-in name (plan3d models), a model YAML or "
                                 f"config.json path, or a ModelSpec")
        if model is not None and not str(model).strip():
            raise PlanInputError("--model: empty; give a built-in name (plan3d models), a model YAML or a config.json")
        m = load_model(os.fspath(model) if model is not None else DEFAULT_MODEL)
    if seq_length is None:  # the default: 4096 tokens, within a learned position table
        seq_length = min(DEFAULT_SEQ_LENGTH, m.max_position_embeddings) if m.position_embedding == "learned" \
            else DEFAULT_SEQ_LENGTH
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
    if moe_flex_dispatcher_backend is not None or moe_flex_dispatcher_num_sms is not None:
        _check_flex_dispatcher(m, fw, moe_flex_dispatcher_backend, moe_flex_dispatcher_num_sms, capacity_factor)
    if software_date is not None and (not isinstance(software_date, str)
                                      or re.fullmatch(SOFTWARE_DATE_PATTERN, software_date) is None):
        raise PlanInputError(f"--software-date {software_date!r}: give YYYY-MM (a year 2010-2099), the month of the "
                             f"container or framework release the run uses (e.g. 2024-07); leave it out for today's "
                             f"kernels")
    _check_fp8_recipe(fp8_recipe, precision, c, fw)
    from pydantic import ValidationError
    try:
        job = TrainingJob(global_batch_size=global_batch_size, seq_length=seq_length, precision=precision,
                          flash_attention=check_bool("flash_attention", flash_attention),
                          dropout=check_bool("dropout", dropout), framework=fw,
                          full_model_init=check_bool("full_model_init", full_model_init),
                          expert_load_imbalance=expert_load_imbalance, moe_expert_capacity_factor=capacity_factor,
                          software_date=software_date, moe_flex_dispatcher_backend=moe_flex_dispatcher_backend,
                          moe_flex_dispatcher_num_sms=moe_flex_dispatcher_num_sms, fp8_recipe=fp8_recipe)
    except ValidationError as e:  # a plausible range (cost_models/config.py): "--seq-length V is outside [lo, hi]"
        from .errors import option_error
        raise option_error(e, {"global_batch_size": "--global-batch-size", "seq_length": "--seq-length",
                               "expert_load_imbalance": "--expert-load-imbalance",
                               "moe_expert_capacity_factor": "--capacity-factor",
                               "moe_flex_dispatcher_num_sms": "--moe-flex-dispatcher-num-sms"}) from None
    _check_dispatcher_sms(c, moe_flex_dispatcher_num_sms)
    return Inputs(m, c, n, job)


def _check_fp8_recipe(recipe: str | None, precision: str, cluster: Any, framework: str) -> None:
    """``--fp8-recipe`` names a recipe the job can run: FP8 training, on a GPU and under a framework that offer it
    (``cost_models.fp8_recipe.fp8_recipe_problem``). Raises ``PlanInputError``."""
    if recipe is None:
        return
    from cost_models.fp8_recipe import FRAMEWORK_FP8_RECIPES, fp8_recipe_problem
    check_choice("fp8_recipe", recipe, FP8_RECIPES)
    if precision != "fp8":
        raise PlanInputError(f"--fp8-recipe {recipe}: an FP8 scaling recipe, with --precision {precision}; add "
                             f"--precision fp8 or drop --fp8-recipe")
    problem = fp8_recipe_problem(recipe, cluster, framework)
    if problem is not None:
        runnable = [r for r in FRAMEWORK_FP8_RECIPES.get(framework, FP8_RECIPES)
                    if fp8_recipe_problem(r, cluster, framework) is None]
        raise PlanInputError(f"--fp8-recipe {recipe}: {problem}; use {' or '.join(runnable)}, or leave it out for "
                             f"the framework's default")


def _check_dispatcher_sms(cluster: Any, num_sms: int | None) -> None:
    """``--moe-flex-dispatcher-num-sms`` is at most the GPU's SM count where plan3d knows it (``attention.yaml``
    ``sm_count``: H100 132, B200 148, GB300 160). Raises ``PlanInputError``."""
    from cluster_specs.efficiency import attention_sm_count
    sms = attention_sm_count(cluster.gpu.name) if num_sms is not None else None
    if sms is not None and num_sms > sms:
        raise PlanInputError(f"--moe-flex-dispatcher-num-sms {num_sms}: the {cluster.gpu.name} has {sms} SMs; give at "
                             f"most {sms} (the dispatcher's kernels share them with the compute)")


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
        raise PlanInputError(f"{option_flag(field)} {text}: must be {allowed}") from None


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


def _megatron_only(flag: str, framework: str, what: str, megatron_flag: str) -> None:
    """A ``PlanInputError`` when ``flag`` (``what``, which plan3d costs and emits as Megatron-LM's ``megatron_flag``)
    is given with another ``framework``."""
    if framework != "megatron":
        raise PlanInputError(f"{flag} with --framework {framework}: {what} is costed and emitted for Megatron-LM "
                             f"({megatron_flag}); drop {flag} or use --framework megatron")


def _check_capacity_factor(model: Any, framework: str, capacity_factor: float,
                           expert_load_imbalance: float | None) -> None:
    """Drop-and-pad routing's own rules (``--capacity-factor``): a MoE model, at most ``num_experts / top_k`` (the
    capacity at which every expert holds every token: Megatron-LM pads each expert to ``tokens x top_k / E x F``
    slots and picks them by ``topk`` over the tokens), Megatron-LM (whose ``--moe-expert-capacity-factor`` plan3d
    costs and emits), and no ``--expert-load-imbalance`` (a dropless setting: padded, every expert holds its
    capacity). Raises ``PlanInputError``."""
    _check_routing_ratio("--capacity-factor", model, capacity_factor, "every expert then holds every token")
    _megatron_only("--capacity-factor", framework, "drop-and-pad routing", "--moe-expert-capacity-factor")
    if expert_load_imbalance is not None:
        raise PlanInputError("--expert-load-imbalance with --capacity-factor: the imbalance is dropless routing's; "
                             "padded to capacity, every expert holds its capacity; give one of them")


def _check_flex_dispatcher(model: Any, framework: str, backend: Any, num_sms: Any,
                           capacity_factor: float | None) -> None:
    """A stated flex dispatcher (``--moe-flex-dispatcher-backend``, ``--moe-flex-dispatcher-num-sms``) is one
    Megatron-LM runs: a backend of ``FLEX_DISPATCHER_BACKENDS``, a MoE model, dropless routing (Megatron-LM's flex
    dispatcher has no drop-and-pad path), SMs only with a backend. Raises ``PlanInputError``."""
    from cluster_specs.efficiency import FLEX_DISPATCHER_BACKENDS
    if backend is None:
        raise PlanInputError("--moe-flex-dispatcher-num-sms without --moe-flex-dispatcher-backend: give the backend "
                             f"({', '.join(FLEX_DISPATCHER_BACKENDS)}) whose kernels run on those SMs")
    check_choice("moe_flex_dispatcher_backend", backend, FLEX_DISPATCHER_BACKENDS)
    if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1):
        raise PlanInputError(f"--moe-flex-dispatcher-num-sms {num_sms!r}: must be a positive integer")
    if model.moe is None:
        raise PlanInputError(f"--moe-flex-dispatcher-backend: {model.name} has no experts (a MoE model's token "
                             f"dispatcher); drop the option")
    _megatron_only("--moe-flex-dispatcher-backend", framework, "the flex dispatcher", "--moe-token-dispatcher-type flex")
    if capacity_factor is not None:
        raise PlanInputError("--moe-flex-dispatcher-backend with --capacity-factor: Megatron-LM's flex dispatcher "
                             "routes dropless (no pad-to-capacity); give one of them")


def job_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The ``load_inputs`` keywords among ``options``."""
    return {k: options[k] for k in ("gpus", "nodes", "global_batch_size", "seq_length", "precision",
                                    "flash_attention", "dropout", "framework", "full_model_init",
                                    "expert_load_imbalance", "capacity_factor", "software_date",
                                    "moe_flex_dispatcher_backend", "moe_flex_dispatcher_num_sms", "fp8_recipe")
            if k in options}


def _fraction(field: str, value: float | None, default: float) -> float:
    """A memory fraction option (``memory_headroom``, ``at_risk_margin``) in [0, 0.5], ``default`` when None."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 0.5:
        raise PlanInputError(f"{option_flag(field)} {value!r}: must be a fraction in [0, 0.5]")
    return float(value)


def headroom_option(value: float | None) -> float:
    """``memory_headroom``, checked (a fraction in [0, 0.5]), ``DEFAULT_HEADROOM`` when None."""
    return _fraction("memory_headroom", value, DEFAULT_HEADROOM)


def at_risk_option(value: float | None) -> float:
    """``at_risk_margin``, checked (a fraction in [0, 0.5]), ``DEFAULT_AT_RISK_MARGIN`` when None."""
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
    ``--decoder-first/last-pipeline-num-layers``; under DeepSpeed the stages it balances itself, heavier first:
    ``layout.deepspeed_pipeline_layout``); interleaved (``vpp`` > 1), such a split counts the embedding
    and the loss as one layer each (``--account-for-embedding/loss-in-pipeline-split``), as the search does
    (``planner.space.to_parallel``). Raises ``PlanInputError`` for sizes that cannot form a layout.
    """
    from pydantic import ValidationError

    from cost_models.config import ParallelConfig
    from cost_models.layout import deepspeed_pipeline_layout, uneven_split

    check_choice("recompute", recompute, RECOMPUTE_CHOICES)
    if pipeline_schedule is not None:
        check_choice("pipeline_schedule", pipeline_schedule, SCHEDULE_CHOICES)
    sizes = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "micro_batch_size": micro_batch_size}
    for field, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanInputError(f"{option_flag(field)} {v!r}: must be a positive integer")
    n, layers = inputs.num_gpus, inputs.model.num_layers
    if n % (tp * pp * cp):
        raise PlanInputError(f"--gpus {n} is not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp}")
    if pp * vpp > layers + 2:  # the cost models build pp x vpp chunks: --vpp 1e9 would allocate gigabytes
        raise PlanInputError(f"--vpp {vpp}: pp x vpp = {pp * vpp} model chunks for {layers} layers; each chunk holds "
                             f"at least one layer (the embedding and the loss may count as one each): at most "
                             f"{max(1, (layers + 2) // pp)}")
    first, last, account = first_stage_layers, last_stage_layers, False
    if (first is None and last is None and layers % pp and pipeline_layout is None and vpp == 1
            and getattr(inputs.job, "framework", None) == "deepspeed"):
        # Megatron-DeepSpeed balances the layers itself, heavier stages first (layout.deepspeed_pipeline_layout)
        pipeline_layout = deepspeed_pipeline_layout(layers, pp)
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
                              sequence_parallel=check_bool("sequence_parallel", sequence_parallel),
                              first_stage_layers=first, last_stage_layers=last,
                              account_for_embedding_in_pipeline_split=account,
                              account_for_loss_in_pipeline_split=account, pipeline_layout=pipeline_layout,
                              recompute_modules=tuple(recompute_modules) if recompute_modules else None,
                              offload_modules=tuple(offload_modules) if offload_modules else None,
                              recompute_method=recompute_method,
                              optimizer_cpu_offload_fraction=optimizer_cpu_offload,
                              param_cpu_offload=check_bool("param_cpu_offload", param_cpu_offload),
                              exp_avg_dtype=exp_avg_dtype,
                              exp_avg_sq_dtype=exp_avg_sq_dtype, main_params_dtype=main_params_dtype,
                              schedule=pipeline_schedule)
    except ValidationError as e:
        err = e.errors()[0]
        name = {"optimizer_cpu_offload_fraction": "optimizer_cpu_offload"}.get(str(err["loc"][0]), str(err["loc"][0])) \
            if err.get("loc") else "layout"
        field = option_flag(name)
        raise PlanInputError(f"{field} {err.get('input')!r}: {err.get('msg', 'invalid')}") from None
