"""The plan JSON document (versioned). Launch scripts consume it: keys listed here are stable.

Top level: ``schema_version``, ``input`` (model, cluster, job), ``plans`` (best first). Floats are rounded to
6 significant digits and keys keep their declared order, so the same input gives byte-identical JSON.
"""
from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr

from cluster_specs import nodes_holding
from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.memory import MemoryEstimate
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_AT_RISK_MARGIN
from .emit import launch_fields
from .evaluation import Evaluation
from .uncertainty import step_class, step_interval

#: 1.1 (additive): parallel.account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split
#: 1.2 (additive): plans[].cost, the whole-run cost of --train-tokens (planner/cost.py); launch.colossalai
#:     (Colossal-AI plugin arguments); parallel.pipeline_layout (null unless the plan sets per-stage layers: plans
#:     over pools, planner/pools.py)
#: 1.3 (additive): launch.env (framework -> environment variables of its launch, planner/emit/env.py);
#:     input.job.framework / flash_attention / dropout (the job options the plans depend on, so that a consumer such
#:     as plan3d fallback --plan re-evaluates the same job)
#: 1.4 (additive): time.step_s_low / step_s_high, throughput.mfu_low / mfu_high (planner/uncertainty.py);
#:     input.job.expert_load_imbalance (--expert-load-imbalance: the dropless MoE busiest-expert ratio the plans were
#:     sized for, cost_models/moe_imbalance.py; null = the sourced default); input.job.requested_global_batch_size
#:     (plan --global-batch-size-tolerance)
#: 1.5 (additive): input.job.moe_expert_capacity_factor (--capacity-factor: drop-and-pad MoE routing; null =
#:     dropless)
#: 1.6 (additive): input.job.software_date (--software-date: the kernel-library generation the plans were timed
#:     with, cluster_specs/data/efficiency/attention.yaml; null = the newest)
#: 1.7 (additive): input.job.moe_flex_dispatcher_backend / moe_flex_dispatcher_num_sms (the MoE flex dispatcher
#:     the plans were timed with, cluster_specs/data/efficiency/ep_dispatch.yaml; null = plan3d's choice)
#: 1.8 (additive): input.job.fp8_recipe (--fp8-recipe: the FP8 scaling recipe the plans were timed and launched with;
#:     null = the framework's default, cost_models/fp8_recipe.py)
SCHEMA_VERSION = "1.8"


def readable_schema_version(version: str) -> str:
    """``version`` if this plan3d reads documents of it: the same major version and a minor version up to
    ``SCHEMA_VERSION``'s (minor versions only add fields, so an older document reads; a newer one may carry fields
    this plan3d does not know).

    Raises:
        ValueError: another major version, a newer minor version, or not ``MAJOR.MINOR``.
    """
    major, minor = (int(x) for x in SCHEMA_VERSION.split("."))
    m = re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)", version)  # as plan3d writes them: no "01.5", "1.05"
    if m is None or int(m[1]) != major or int(m[2]) > minor:
        newer = m is not None and int(m[1]) == major
        raise ValueError(f"{version!r}: this plan3d reads {major}.0 to {SCHEMA_VERSION}"
                         + ("; upgrade plan3d to read it" if newer else ""))
    return version


def _r(x: float) -> float:
    """Round to 6 significant digits (stable JSON)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.6g}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelInfo(_Strict):
    name: str
    num_parameters: int
    num_active_parameters: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    moe_experts: int | None = None
    source: str


class ClusterInfo(_Strict):
    name: str
    gpu: str
    num_gpus: int
    gpus_per_node: int
    num_nodes: int
    memory_bytes_per_gpu: int


class JobInfo(_Strict):
    global_batch_size: int
    seq_length: int
    precision: str
    optimizer: str
    tokens_per_step: int
    framework: str | None = Field(None, description="whose rules the plans were made under (--framework); null in "
                                                    "documents written before it was recorded (megatron)")
    flash_attention: bool | None = Field(None, description="fused attention (--flash-attention); null: true")
    dropout: bool | None = Field(None, description="dropout layers (--dropout); null: false")
    expert_load_imbalance: float | None = Field(
        None, description="dropless MoE: busiest expert's routed tokens over the mean (--expert-load-imbalance); null: "
                          "cost_models/moe_imbalance.py's sourced default")
    moe_expert_capacity_factor: float | None = Field(
        None, description="drop-and-pad MoE routing to this capacity factor (--capacity-factor); null: dropless")
    software_date: str | None = Field(
        None, description="YYYY-MM of the run's container or framework release (--software-date): the kernel "
                          "library's generation the plans were timed with; null: the newest")
    moe_flex_dispatcher_backend: str | None = Field(
        None, description="MoE flex token dispatcher (--moe-flex-dispatcher-backend: deepep, hybridep) the plans were "
                          "timed with; null: plan3d's choice (DeepEP across NVLink domains, NCCL all-to-all inside one)")
    moe_flex_dispatcher_num_sms: int | None = Field(
        None, description="SMs of the flex dispatcher (--moe-flex-dispatcher-num-sms); null: the backend's default")
    fp8_recipe: str | None = Field(
        None, description="FP8 scaling recipe (--fp8-recipe: delayed, tensorwise, mxfp8, blockwise) the plans were "
                          "timed and launched with; null: the framework's default for the GPU and layout "
                          "(cost_models/fp8_recipe.py)")
    requested_global_batch_size: int | None = Field(
        None, description="plan --global-batch-size-tolerance: the global batch asked for (global_batch_size is the "
                          "one planned, within the tolerance of it); null without a tolerance")


class InputInfo(_Strict):
    model: ModelInfo
    cluster: ClusterInfo
    job: JobInfo


class ParallelInfo(_Strict):
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    zero_stage: int
    sequence_parallel: bool
    recompute: str
    recompute_num_layers: int | None
    pipeline_schedule: str
    first_stage_layers: int | None
    last_stage_layers: int | None
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool
    pipeline_layout: str | None = Field(None, description="Megatron --pipeline-model-parallel-layout (per-stage "
                                                          "layers), when the plan sets one")


class StageMemoryInfo(_Strict):
    stage: int
    num_layers: int
    total_bytes: int
    in_flight_microbatches: float
    breakdown: dict[str, int] = Field(description="term -> bytes, largest first")
    peak_phase: str | None = Field(None, description="phase of the step at which this stage peaks "
                                                     "(forward, backward or optimizer)")
    phases: dict[str, int] | None = Field(None, description="phase -> total bytes of this stage in that phase "
                                                            "(init, forward, backward, optimizer)")
    buffers: dict[str, int] | None = Field(None, description="backend buffers at the peak phase: name -> bytes "
                                                             "(cost_models/memory_buffers.py)")


class MemoryInfo(_Strict):
    peak_bytes: int
    capacity_bytes: int
    headroom_bytes: int = Field(description="capacity_bytes - peak_bytes: memory left free at the peak (the plan is "
                                            "feasible while peak_bytes <= capacity x (1 - --memory-headroom))")
    peak_stage: int
    at_risk: bool = Field(description=f"peak within the at-risk margin (default {DEFAULT_AT_RISK_MARGIN:.0%}) of "
                                      "capacity, not over it")
    breakdown: dict[str, int] = Field(description="peak stage: term -> bytes, largest first")
    stages: list[StageMemoryInfo]


class TimeInfo(_Strict):
    #: seconds per optimizer step = compute_s + bubble_s + optimizer_s + the exposed tp, cp, ep, dp (and host)
    #: communication; exposed_comm_s.pp is not added again: it is the part of bubble_s spent in pipeline sends
    step_s: float
    compute_s: float
    bubble_s: float
    bubble_fraction: float
    optimizer_s: float
    exposed_comm_s: dict[str, float]
    #: seconds per step of GEMMs, attention core and memory-bound kernels on the busiest pipeline rank
    compute_breakdown_s: dict[str, float] = {}
    #: pipeline schedule simulated (1f1b, interleaved, gpipe, zb-h1) and micro-batches per step
    schedule: str = ""
    num_microbatches: int = 0
    #: interval of step_s from the cross-validated errors of published runs of the same class
    #: (planner/uncertainty.py: GPU generation, number format, dense/MoE, scale; 80% of them fell inside)
    step_s_low: float | None = None
    step_s_high: float | None = None


class ThroughputInfo(_Strict):
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    flops_convention: str
    peak_flops_per_gpu: float
    #: number format of ``peak_flops_per_gpu`` (the MFU denominator; the 16-bit peak also for FP8 runs, the TF32 peak
    #: for fp32 training, whose GEMMs run on the TF32 tensor cores)
    mfu_peak_dtype: str = "bf16"
    #: MFU at time.step_s_high and time.step_s_low
    mfu_low: float | None = None
    mfu_high: float | None = None


class LaunchInfo(_Strict):
    """Everything a launch script needs (planner/emit): a framework that cannot run the plan gets ``None``
    and its one-line reason in ``unsupported``."""
    nodes: int
    gpus_per_node: int
    world_size: int = Field(description="nodes x gpus_per_node = tp*pp*dp*cp")
    megatron: list[str] | None = Field(description="Megatron-LM pretrain_gpt.py arguments")
    deepspeed: dict[str, Any] | None = Field(description="DeepSpeed ds_config.json")
    megatron_deepspeed: list[str] | None = Field(None, description="Megatron-DeepSpeed pretrain_gpt.py arguments")
    torchtitan_toml: str | None = Field(None, description="torchtitan 0.2.x JobConfig TOML")
    torchtitan_overrides: list[str] | None = Field(None, description="torchtitan 0.3.x command-line overrides")
    colossalai: dict[str, Any] | None = Field(None, description="Colossal-AI HybridParallelPlugin / "
                                              "MoeHybridParallelPlugin keyword arguments and booster settings "
                                              "(schema 1.2)")
    unsupported: dict[str, str] = Field(default_factory=dict, description="framework, or one of its launches "
                                        "(megatron_deepspeed, torchtitan_overrides) -> why it cannot run the plan")
    env: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="framework (megatron, deepspeed, torchtitan, colossalai) -> environment variables its "
                                          "launch needs (planner/emit/env.py); only frameworks that can run the plan")


class CostInfo(_Strict):
    """Whole-run cost of training ``train_tokens`` tokens with the plan (cost_models/training_cost.py gives every
    formula and planner/cost.py the options). Days and hours are wall-clock; ``effective_days`` counts
    interruptions, restarts and checkpoints (``wall_clock_days / goodput_fraction``) and ``gpu_hours`` is
    ``effective_days x 24 x GPUs``, what a rental bills."""
    train_tokens: float
    steps: int
    wall_clock_days: float = Field(description="failure-free training time: train_tokens / tokens_per_s, days")
    effective_days: float = Field(description="with interruptions, restarts and checkpoints: wall_clock_days / "
                                              "goodput_fraction, days")
    gpu_hours: float = Field(description="effective_days x 24 x GPUs")
    goodput_fraction: float = Field(description="useful training time / wall time (Daly 2006)")
    checkpoint_bytes: int = Field(description="weights + optimizer states of every parameter, bytes")
    checkpoint_write_s: float = Field(description="checkpoint bytes / storage write bandwidth, seconds")
    checkpoint_blocking_s: float = Field(description="seconds each checkpoint stops training (the write, or with "
                                                     "async_checkpoint the copy to host memory)")
    checkpoint_interval_s: float = Field(description="Young/Daly interval between checkpoint starts, whole steps, s")
    checkpoint_interval_steps: int
    async_checkpoint: bool
    mtbf_s: float = Field(description="job mean time between interruptions, seconds")
    restart_s: float = Field(description="seconds from an interruption to training again")
    expected_interruptions: float
    it_power_kw: float | None = Field(description="GPUs x board power + nodes x node overhead, kW")
    pue: float
    energy_mwh: float | None = Field(description="it_power_kw x PUE x effective time, MWh (1e6 Wh)")
    energy_scope: str = Field(description="what energy_mwh counts")
    usd: float | None = Field(description="gpu_hours x usd_per_gpu_hour; None without a price")
    usd_per_gpu_hour: float | None
    price_date: str | None = Field(description="when the price was read (prices move); None for --gpu-hour-price")
    price_source: str | None


class PlanInfo(_Strict):
    rank: int
    feasible: bool
    violations: list[str]
    parallel: ParallelInfo
    memory: MemoryInfo | None
    time: TimeInfo | None
    throughput: ThroughputInfo | None
    launch: LaunchInfo
    #: whole-run cost, present when --train-tokens is given (schema 1.2)
    cost: CostInfo | None = None


class PlanDocument(_Strict):
    schema_version: Annotated[str, AfterValidator(readable_schema_version)] = SCHEMA_VERSION
    input: InputInfo
    plans: list[PlanInfo]
    #: ``planner.api.SearchStats`` of the search that produced the plans (not part of the JSON)
    _search_stats: Any = PrivateAttr(default=None)

    @property
    def search_stats(self):
        """How many candidates the search examined and found feasible (``planner.api.SearchStats``), or None for
        a document that no search produced (``evaluate``)."""
        return self._search_stats

    def model_dump_json(self, **kwargs: Any) -> str:
        """The document's JSON text. Without arguments: exactly what ``plan3d plan|evaluate --format json``
        prints (``to_json``: 2-space indent, declared key order, 6 significant digits, trailing newline), so a
        script using the Python API and one reading the CLI's output see the same bytes. With arguments:
        pydantic's own serializer."""
        return super().model_dump_json(**kwargs) if kwargs else to_json(self)


def input_info(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
               requested_global_batch_size: int | None = None) -> InputInfo:
    gpn = cluster.node.gpus_per_node
    return InputInfo(
        model=ModelInfo(name=model.name, num_parameters=model.num_parameters(),
                        num_active_parameters=model.num_active_parameters(), num_layers=model.num_layers,
                        hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
                        num_kv_heads=model.num_kv_heads, vocab_size=model.vocab_size,
                        moe_experts=model.moe.num_experts if model.moe else None, source=model.source),
        cluster=ClusterInfo(name=cluster.name, gpu=cluster.gpu.name, num_gpus=num_gpus, gpus_per_node=gpn,
                            num_nodes=nodes_holding(num_gpus, gpn), memory_bytes_per_gpu=cluster.gpu.memory_bytes),
        job=JobInfo(global_batch_size=job.global_batch_size, seq_length=job.seq_length, precision=job.precision,
                    optimizer=job.optimizer, tokens_per_step=job.tokens_per_step, framework=job.framework,
                    flash_attention=job.flash_attention, dropout=job.dropout,
                    expert_load_imbalance=job.expert_load_imbalance,
                    moe_expert_capacity_factor=job.moe_expert_capacity_factor, software_date=job.software_date,
                    moe_flex_dispatcher_backend=job.moe_flex_dispatcher_backend,
                    moe_flex_dispatcher_num_sms=job.moe_flex_dispatcher_num_sms, fp8_recipe=job.fp8_recipe,
                    requested_global_batch_size=requested_global_batch_size))


def parallel_info(par: ParallelConfig, job: TrainingJob) -> ParallelInfo:
    return ParallelInfo(
        tp=par.tp, pp=par.pp, dp=par.dp, cp=par.cp, ep=par.ep, etp=par.expert_tp, vpp=par.vpp,
        micro_batch_size=par.micro_batch_size, global_batch_size=job.global_batch_size,
        num_microbatches=par.num_microbatches(job.global_batch_size), zero_stage=par.zero_stage,
        sequence_parallel=par.sequence_parallel, recompute=par.recompute,
        recompute_num_layers=par.recompute_num_layers, pipeline_schedule=par.pipeline_schedule,
        first_stage_layers=par.first_stage_layers, last_stage_layers=par.last_stage_layers,
        account_for_embedding_in_pipeline_split=par.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=par.account_for_loss_in_pipeline_split, pipeline_layout=par.pipeline_layout)


def memory_info(est: MemoryEstimate, at_risk_margin: float = DEFAULT_AT_RISK_MARGIN) -> MemoryInfo:
    """The document's ``MemoryInfo`` of ``est`` (bytes rounded to integers; deterministic)."""
    pk = est.peak_stage
    stages = [StageMemoryInfo(stage=s.stage, num_layers=s.num_layers, total_bytes=round(s.total),
                              in_flight_microbatches=_r(s.in_flight_microbatches),
                              breakdown={k: round(v) for k, v in s.terms().items()},
                              peak_phase=s.phase, phases={k: round(v) for k, v in s.phases.items()},
                              buffers={k: round(v) for k, v in s.buffer_terms.get(s.phase, {}).items()})
              for s in est.stages]
    cap = est.capacity_bytes
    return MemoryInfo(peak_bytes=round(pk.total), capacity_bytes=cap, headroom_bytes=round(cap - pk.total),
                      peak_stage=pk.stage, at_risk=cap * (1 - at_risk_margin) < pk.total <= cap,
                      breakdown={k: round(v) for k, v in pk.terms().items()}, stages=stages)


def plan_info(rank: int, ev: Evaluation, model: ModelSpec, cluster: ClusterSpec, job: TrainingJob,
              at_risk_margin: float = DEFAULT_AT_RISK_MARGIN) -> PlanInfo:
    par = ev.parallel
    mem = tim = thr = None
    if ev.memory is not None:
        mem = memory_info(ev.memory, at_risk_margin)
    if ev.step is not None:
        st = ev.step
        iv = step_interval(st.step_s, step_class(model, cluster, job, par.world_size))
        tim = TimeInfo(step_s=_r(st.step_s), compute_s=_r(st.compute_s), bubble_s=_r(st.bubble_s),
                       bubble_fraction=_r(st.bubble_fraction), optimizer_s=_r(st.optimizer_s),
                       exposed_comm_s={k: _r(v) for k, v in st.exposed_comm_s.items()},
                       compute_breakdown_s={k: _r(v) for k, v in getattr(st, "compute_breakdown_s", {}).items()},
                       schedule=getattr(st, "schedule", ""), num_microbatches=st.num_microbatches,
                       step_s_low=_r(iv.low), step_s_high=_r(iv.high))
        thr = ThroughputInfo(tokens_per_s=_r(st.tokens_per_s), tokens_per_s_per_gpu=_r(st.tokens_per_s / par.world_size),
                             tflops_per_gpu=_r(st.tflops_per_gpu), mfu=_r(st.mfu), hfu=_r(st.hfu),
                             flops_convention=st.flops_convention, peak_flops_per_gpu=_r(st.peak_flops_per_gpu),
                             mfu_peak_dtype=getattr(st, "mfu_peak_dtype", "bf16"),
                             mfu_low=_r(st.mfu * st.step_s / iv.high), mfu_high=_r(st.mfu * st.step_s / iv.low))
    gpn = cluster.node.gpus_per_node
    launch = LaunchInfo(**launch_fields(model, job, par, gpn, cluster))
    return PlanInfo(rank=rank, feasible=ev.feasible, violations=[v.message for v in ev.violations],
                    parallel=parallel_info(par, job), memory=mem, time=tim, throughput=thr, launch=launch)


def build_document(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                   evaluations: list[Evaluation], at_risk_margin: float = DEFAULT_AT_RISK_MARGIN,
                   requested_global_batch_size: int | None = None) -> PlanDocument:
    """The document for ``evaluations`` (already in rank order); ``at_risk_margin`` sets ``memory.at_risk``;
    ``requested_global_batch_size``: the batch asked for when ``plan`` was given a tolerance (``job`` holds the
    one planned)."""
    return PlanDocument(input=input_info(model, cluster, job, num_gpus, requested_global_batch_size),
                        plans=[plan_info(i + 1, ev, model, cluster, job, at_risk_margin)
                               for i, ev in enumerate(evaluations)])


def to_json(doc: PlanDocument) -> str:
    """Deterministic, strict JSON text (2-space indent, declared key order, trailing newline).

    Raises ``PlanInternalError`` naming the field when the document holds a non-finite number (NaN or Infinity,
    which no JSON parser accepts): that is a bug of the cost models or of an input check, never a plan to print."""
    return dumps_finite(doc.model_dump(mode="json"), "plan document", indent=2) + "\n"


def nonfinite_fields(obj: Any, path: str = "") -> list[str]:
    """Paths (``plans[0].time.step_s``) of the non-finite floats in a JSON-able value."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path or "."]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in nonfinite_fields(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in nonfinite_fields(v, f"{path}[{i}]")]
    return []


def dumps_finite(obj: Any, what: str, **kw: Any) -> str:
    """``json.dumps(obj, allow_nan=False, **kw)``; a non-finite number is a ``PlanInternalError`` naming its field
    (the CLI prints it as an internal error, exit 3). Used for every JSON document plan3d writes."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        bad = nonfinite_fields(obj)
        if not bad:
            raise
        from .errors import PlanInternalError
        raise PlanInternalError(f"{what}: field {bad[0]} is not a finite number"
                                + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")) from None


#: Documents plan3d writes, by the name ``plan3d schema --document`` takes: (module, class).
DOCUMENT_KINDS = {"plan": ("planner.document", "PlanDocument"), "pools": ("planner.pools", "PoolsDocument"),
                  "comparison": ("planner.comparison", "ComparisonDocument"),
                  "fallback": ("planner.fallback_plans", "FallbackDocument")}


def json_schema(kind: str = "plan") -> dict:
    """JSON Schema of a document plan3d writes: ``plan`` (``plan`` / ``evaluate --format json``), ``pools`` (a plan
    over pools, ``--cluster NAME:NODES,...``), ``comparison`` (``--cluster A,B``), ``fallback``.

    Raises:
        PlanInputError: ``kind`` is none of ``DOCUMENT_KINDS``.
    """
    from importlib import import_module

    from .errors import PlanInputError
    if kind not in DOCUMENT_KINDS:
        raise PlanInputError(f"--document {kind!r}: must be one of {', '.join(DOCUMENT_KINDS)}")
    module, name = DOCUMENT_KINDS[kind]
    return getattr(import_module(module), name).model_json_schema()
