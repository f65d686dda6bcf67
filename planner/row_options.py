"""What a published run needs beyond its parallel layout: the row's ``setup`` block, read and checked.

``plan3d validate`` (``planner/published_rows.py``) builds a model, cluster, job and ``ParallelConfig`` from each row
of a published-runs dataset. The published columns leave out things the model needs: the framework (kernel set and
overlap defaults), how the source counts TFLOP/s, the machine when the GPU name alone does not say it (a power cap, a
slow network), whether the run had fused attention and dropout, and recipe settings (selective-recompute modules,
16-bit gradient reduction, FP8 primary weights, precision-aware optimizer states, the cross-entropy implementation,
pipeline layouts, EP overlap, CUDA graphs, forced balanced MoE routing, drop-and-pad MoE routing), and the date of its
software (which kernel-library generation it ran). A row states them as data, each with its source, in a ``setup``
block (the header of ``planner/data/published_runs_dev.yaml`` lists the keys); nothing here is keyed on a source's
name, so every dataset is held to the same physics. A published ``parallel.*`` value wins over ``setup``.

``row_setup(row)`` parses the block (one-line ``PlanInputError`` naming the field on bad input); ``row_options(row)``
turns it into ``ParallelConfig`` / ``TrainingJob`` fields; ``apply_row_options`` applies them (one call in
``build_inputs``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cluster_specs.efficiency import SOFTWARE_DATE_PATTERN
from cluster_specs.spec import ClusterSpec
from cost_models.config import FlexDispatcherBackend, ParallelConfig, RecomputeModule, TrainingJob

from .errors import PlanInputError

_MODULES: tuple[str, ...] = get_args(RecomputeModule)

#: Frameworks a row can name (``planner.published_rows._FRAMEWORK_DEFAULTS``): Megatron-LM, NeMo / Megatron-Bridge recipes,
#: DeepSpeed (Megatron-DeepSpeed), torchtitan.
RowFramework = Literal["megatron", "nemo", "deepspeed", "torchtitan"]
#: How a source counts its TFLOP/s (``cost_models.flops.model_flops_per_token_variant``).
RowConvention = Literal["causal", "full_attention", "n21_hardware", "bloom_hardware"]


class RowSetup(BaseModel):
    """A row's ``setup`` block (see the module docstring); every set field needs an entry in ``sources``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: RowFramework | None = None
    flops_convention: RowConvention | None = None
    cluster: str | None = Field(None, min_length=1, description="plan3d cluster name or YAML path")
    flash_attention: bool | None = None
    dropout: bool | None = None
    recompute: Literal["none", "selective", "full"] | None = None
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    etp: int | None = Field(None, ge=1)
    pipeline_layout: str | None = Field(None, min_length=1)
    grad_reduce_in_bf16: bool | None = None
    fp8_param_gather: bool | None = None
    exp_avg_dtype: Literal["fp32", "bf16"] | None = None
    exp_avg_sq_dtype: Literal["fp32", "bf16"] | None = None
    #: bytes of the master weight the optimizer keeps per parameter, as a dtype: ``bf16`` = 2 bytes (Megatron-FSDP
    #: bf16 main params, or NeMo 1.x's Apex ``DistributedFusedAdam`` with ``store_param_remainders``: the 16-bit
    #: remainder of each fp32 master weight beside the bf16 parameter)
    main_params_dtype: Literal["fp32", "bf16"] | None = None
    cross_entropy_fusion_impl: Literal["native", "te"] | None = None
    cross_entropy_loss_fusion: bool | None = None
    async_tp_backward: bool | None = None
    overlap_grad_reduce: bool | None = None
    ep_overlap: bool | None = None
    full_cuda_graph: bool | None = None
    moe_router_force_load_balancing: bool | None = None
    moe_expert_capacity_factor: float | None = Field(None, ge=1.0)
    #: Megatron-LM ``moe_flex_dispatcher_backend`` / ``moe_flex_dispatcher_num_sms`` (``moe_deepep_num_sms``,
    #: ``moe_hybridep_num_sms``) of the run (``TrainingJob.moe_flex_dispatcher_backend``)
    moe_flex_dispatcher_backend: FlexDispatcherBackend | None = None
    moe_flex_dispatcher_num_sms: int | None = Field(None, gt=0)
    #: YYYY-MM of the run's container or framework release (``TrainingJob.software_date``)
    software_date: str | None = Field(None, pattern=SOFTWARE_DATE_PATTERN)
    sources: dict[str, str] = Field(default_factory=dict)


def row_setup(row: dict[str, Any]) -> RowSetup:
    """The row's ``setup`` block; an empty one when absent.

    Raises:
        PlanInputError: unknown key, wrong value type, or a set field without its ``sources`` entry.
    """
    raw = row.get("setup")
    if raw is None:
        return RowSetup()
    rid = row.get("id")
    if not isinstance(raw, dict):
        raise PlanInputError(f"row {rid!r}: setup must be a mapping of fields, got {type(raw).__name__}")
    try:
        s = RowSetup.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        raise PlanInputError(f"row {rid!r}: setup.{loc}: {e['msg']}, got {e.get('input')!r}") from None
    missing = [k for k in RowSetup.model_fields if k != "sources" and getattr(s, k) is not None
               and not str(s.sources.get(k, "")).strip()]
    if missing:
        raise PlanInputError(f"row {rid!r}: setup.sources has no entry for {', '.join(missing)} "
                             f"(every setup value names where it was read)")
    return s


@dataclass
class RowOptions:
    """Extra ``ParallelConfig`` / ``TrainingJob`` fields and why each was set."""

    parallel: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _recompute_modules(text: str) -> tuple[str, ...] | None:
    """Module names listed in a row's recompute text, e.g. ``selective (mla_up_proj, mlp)``; None if none."""
    inner = re.search(r"\((.*?)\)", text)
    if not inner:
        return None
    names = tuple(m for m in re.split(r"[,\s]+", inner.group(1).strip()) if m in _MODULES)
    return names or None


def setup_source(s: RowSetup, key: str) -> str:
    """The short name of where a setup value was read (its source up to the first ':' or ' (')."""
    text = s.sources.get(key, "")
    return re.split(r": | \(", text, maxsplit=1)[0]


def row_fp8_recipe(row: dict[str, Any]) -> str | None:
    """The Megatron-LM ``--fp8-recipe`` a row's precision or feature list names (``TrainingJob.fp8_recipe``): MXFP8
    (FP8-MX), DeepSeek-style blockwise / sub-channel scaling, per-tensor current scaling (FP8-CS, tensorwise); None
    when it names none (plain "fp8": the framework's default, ``cost_models.fp8_recipe.job_fp8_recipe``)."""
    p = row.get("parallel") or {}
    s = f"{p.get('precision') or ''} {(p.get('other') or {}).get('features') or ''}".lower()
    if re.search(r"\b(mxfp8|fp8-mx)\b", s):
        return "mxfp8"
    if re.search(r"\b(blockwise|sub-?channel)\b", s):
        return "blockwise"
    if re.search(r"\b(fp8-?cs|current scaling|tensorwise)\b", s):
        return "tensorwise"
    if re.search(r"\bdelayed\b", s):
        return "delayed"
    return None


def row_options(row: dict[str, Any], framework: str = "megatron") -> RowOptions:
    """The recipe settings of one published-runs row: the published recompute modules, then the ``setup`` block.

    ``framework`` (the row's, ``megatron`` by default) decides what an integer ``parallel.fsdp`` means: Megatron-FSDP
    ``optim_grads_params`` (ZeRO-3; Megatron-Bridge perf scripts ``set_mcore_fsdp_configs``) for Megatron and NeMo.
    """
    out = RowOptions()
    s = row_setup(row)
    p = row.get("parallel") or {}

    rc = str(p.get("recompute") or "").lower()
    mods = _recompute_modules(rc) if rc.startswith("selective") else None
    if mods is not None:
        out.parallel["recompute_modules"] = mods
        out.notes.append(f"selective recompute modules {', '.join(mods)} (row)")
    elif not rc and s.recompute_modules:
        out.parallel["recompute_modules"] = tuple(s.recompute_modules)
        out.notes.append(f"selective recompute modules {', '.join(s.recompute_modules)} "
                         f"({setup_source(s, 'recompute_modules')})")

    fsdp = p.get("fsdp")
    if framework in ("megatron", "nemo") and isinstance(fsdp, int) and not isinstance(fsdp, bool) and fsdp > 1:
        out.parallel["zero_stage"] = 3
        out.notes.append(f"Megatron-FSDP over {fsdp} ranks: optim_grads_params (ZeRO-3; Megatron-Bridge perf scripts)")

    if p.get("etp") is None and s.etp is not None and p.get("ep"):
        out.parallel["etp"] = s.etp
        out.notes.append(f"expert tensor parallel {s.etp} ({setup_source(s, 'etp')})")
    if s.grad_reduce_in_bf16:
        out.parallel["grad_reduce_in_bf16"] = True
        out.notes.append(f"16-bit main gradients ({setup_source(s, 'grad_reduce_in_bf16')})")
    if s.fp8_param_gather:
        out.parallel["fp8_param_gather"] = True
        out.notes.append(f"FP8 primary weights, 1 byte each ({setup_source(s, 'fp8_param_gather')})")
    for k in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(s, k) is not None:
            out.parallel[k] = getattr(s, k)
    if s.exp_avg_dtype or s.exp_avg_sq_dtype:
        out.notes.append(f"precision-aware optimizer: Adam moments {s.exp_avg_dtype or 'fp32'}/"
                         f"{s.exp_avg_sq_dtype or 'fp32'} ({setup_source(s, 'exp_avg_dtype')})")
    if s.main_params_dtype is not None:
        out.parallel["main_params_dtype"] = s.main_params_dtype
        out.notes.append(f"master weights {s.main_params_dtype} ({setup_source(s, 'main_params_dtype')})")
    recipe = row_fp8_recipe(row)
    if recipe is not None:
        out.job["fp8_recipe"] = recipe
        out.notes.append(f"FP8 recipe {recipe} (row precision)")
    if s.moe_router_force_load_balancing:
        # Megatron --moe-router-force-load-balancing routes every token to random, evenly loaded experts: the busiest
        # expert gets the mean (cost_models/moe_imbalance.py)
        out.job["expert_load_imbalance"] = 1.0
        out.notes.append(f"MoE routing forced to balance ({setup_source(s, 'moe_router_force_load_balancing')})")
    if s.moe_expert_capacity_factor is not None:
        # --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity: drop-and-pad routing, no host sync
        out.job["moe_expert_capacity_factor"] = s.moe_expert_capacity_factor
        out.notes.append(f"MoE drop-and-pad routing, capacity factor {s.moe_expert_capacity_factor:g} "
                         f"({setup_source(s, 'moe_expert_capacity_factor')})")
    if s.moe_flex_dispatcher_backend is not None:
        out.job["moe_flex_dispatcher_backend"] = s.moe_flex_dispatcher_backend
        sms = "" if s.moe_flex_dispatcher_num_sms is None else f" on {s.moe_flex_dispatcher_num_sms} SMs"
        out.notes.append(f"MoE dispatcher {s.moe_flex_dispatcher_backend}{sms} "
                         f"({setup_source(s, 'moe_flex_dispatcher_backend')})")
    if s.moe_flex_dispatcher_num_sms is not None:
        out.job["moe_flex_dispatcher_num_sms"] = s.moe_flex_dispatcher_num_sms
    if s.software_date is not None:
        out.job["software_date"] = s.software_date
        out.notes.append(f"software of {s.software_date} ({setup_source(s, 'software_date')})")
    if s.cross_entropy_fusion_impl is not None:
        out.job["cross_entropy_fusion_impl"] = s.cross_entropy_fusion_impl
        out.notes.append(f"cross entropy {s.cross_entropy_fusion_impl} ({setup_source(s, 'cross_entropy_fusion_impl')})")
    if s.cross_entropy_loss_fusion is not None:
        out.job["cross_entropy_loss_fusion"] = s.cross_entropy_loss_fusion
        out.notes.append(f"cross-entropy loss {'fused' if s.cross_entropy_loss_fusion else 'not fused'} "
                         f"({setup_source(s, 'cross_entropy_loss_fusion')})")
    return out


def apply_row_options(row: dict[str, Any], cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                      notes: list[str], framework: str = "megatron") -> tuple[ClusterSpec, TrainingJob, ParallelConfig]:
    """``row_options(row, framework)`` applied to the built inputs; its notes are appended to ``notes``."""
    o = row_options(row, framework)
    notes.extend(o.notes)
    if o.parallel:
        par = ParallelConfig(**{**par.model_dump(), **o.parallel})
    if o.job:
        job = TrainingJob(**{**job.model_dump(), **o.job})
    return cluster, job, par
