"""Recipe settings of a published run that plan3d's memory model needs beyond the row's parallel layout.

``plan3d validate`` (``planner/validation.py``) builds a model, cluster, job and ``ParallelConfig`` from each row of
the published-runs dataset; this module adds what the row's own recipe says about memory and the layout mapping
leaves out: the GPU's real capacity, selective-recompute modules, FP8 primary weights, 16-bit gradient reduction,
Megatron-FSDP sharding and precision-aware optimizer states. Every rule names the file it was read from; a rule
keyed on a source group applies only to the recipes named in it.

``row_options(row)`` returns the fields; ``apply_row_options`` applies them (one call in ``build_inputs``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, RecomputeModule, TrainingJob

#: Visible memory (bytes) of GPUs whose row states a capacity other than the built-in cluster's, by
#: (GPU family prefix, ``hardware.memory_gb``). H100 96 GB HBM2e (Meta Grand Teton; torchtitan
#: ``benchmarks/llama3_h100_202412_torchtitan.md``: "Each H100 GPU is equipped with 96GB HBM2e"): no nvidia-smi
#: quote of this variant was found; the other 96 GB GH100 parts (GH200 96 GB, H20) report "97871MiB" in
#: nvidia-smi, assumed the same here (6 x 16 GB stacks; the 80 GB part's 81559 MiB is the same 5 x 16 GB minus
#: the same reserved share).
GPU_MEMORY_BYTES: dict[tuple[str, int], int] = {
    ("h100", 96): 97871 * 2**20,
}

#: Megatron-Bridge performance recipes (``scripts/performance/configs``) set ``grad_reduce_in_fp32 = False``
#: (``llama3_llm_pretrain.py`` ``set_llama3_common_configs``, ``qwen3_llm_pretrain.py``
#: ``set_qwen3_common_configs``, ``deepseek_llm_pretrain.py`` ``set_deepseek_v3_common_configs``): 2-byte main
#: gradients. NeMo 24.07's Nemotron-4 340B recipe (NeMo-Framework-Launcher
#: ``launcher_scripts/conf/training/nemotron/nemotron_340b.yaml``: ``optim.grad_sync_dtype: bf16``) does the same.
BF16_GRAD_RECIPES: dict[str, str] = {
    "nemo_bridge_perf_summary": "",  # every Bridge perf recipe
    "nemo_2407_perf_summary": "nemotron",  # only the recipe read: Nemotron-4 340B
}

#: Megatron-Bridge DeepSeek-V3 performance recipes (``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py``,
#: commit 013284246bc0): ``recompute_granularity = "selective"`` with ``recompute_modules = ["mla_up_proj"]`` on
#: GB200/B200 and ``["mla_up_proj", "mlp"]`` on H100.
BRIDGE_DEEPSEEK_RECOMPUTE: dict[str, tuple[str, ...]] = {
    "gb200": ("mla_up_proj",), "b200": ("mla_up_proj",), "h100": ("mla_up_proj", "mlp"),
}

#: Megatron-LM MoE recipes (``examples/moe_recipes/*/*.yaml`` at the rows' commit, e.g.
#: ``qwen3_235b/b200/mxfp8_128GPU_TP2PP4EP16.yaml``, ``deepseek_v3/b200/mxfp8_256GPU_TP1PP8EP32.yaml``):
#: ``use_precision_aware_optimizer: true``, ``exp_avg_dtype: bf16``, ``exp_avg_sq_dtype: bf16`` (main params and
#: main grads fp32). Their ``fp8_param_gather: true`` is MXFP8 (no byte saved; ``cost_models.memory.FP8_PARAM_BYTES``).
MOE_RECIPE_OPTIMIZER = {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}

#: Transformer Engine cross entropy (``cross_entropy_fusion_impl: te``): the Megatron-LM MoE recipe YAMLs
#: (``cross_entropy_loss_fusion: true``, ``cross_entropy_fusion_impl: te``) and Megatron-Bridge's pretrain recipes
#: (``recipes/llama/llama3.py`` common pretrain config: ``model_cfg.cross_entropy_fusion_impl = "te"``;
#: ``recipes/qwen/qwen3_moe`` kernel selections: ``cross_entropy_loss_fusion = True``,
#: ``cross_entropy_fusion_impl = "te"``).
TE_CROSS_ENTROPY_GROUPS = ("megatron_moe_recipes", "nemo_bridge_perf_summary")

#: Megatron-Bridge perf configs set ``expert_tensor_parallel_size=1`` for DeepSeek-V3
#: (``scripts/performance/configs/deepseek/parallelism_configs.py``, every preset) and Qwen3 MoE
#: (``configs/qwen/qwen3_workload_base_configs.py``: ``BASE_QWEN3_*_CONFIG``).
BRIDGE_ETP1_MODELS = ("deepseek", "qwen3")

_MODULES: tuple[str, ...] = get_args(RecomputeModule)


@dataclass
class RowOptions:
    """Extra ``ParallelConfig`` / ``TrainingJob`` fields, a GPU memory override (bytes) and why each was set."""

    parallel: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    gpu_memory_bytes: int | None = None
    notes: list[str] = field(default_factory=list)


def _recompute_modules(text: str) -> tuple[str, ...] | None:
    """Module names listed in a row's recompute text, e.g. ``selective (mla_up_proj, mlp)``; None if none."""
    inner = re.search(r"\((.*?)\)", text)
    if not inner:
        return None
    names = tuple(m for m in re.split(r"[,\s]+", inner.group(1).strip()) if m in _MODULES)
    return names or None


def row_options(row: dict[str, Any]) -> RowOptions:
    """The recipe's memory settings for one published-runs row (see the module constants for the sources)."""
    out = RowOptions()
    group = str((row.get("source") or {}).get("group", ""))
    p = row.get("parallel") or {}
    hw = row.get("hardware") or {}
    gpu = str(hw.get("gpu") or "").lower()
    name = str((row.get("model") or {}).get("name") or "").lower()
    prec = str(p.get("precision") or "").lower()

    mem_gb = hw.get("memory_gb")
    for (fam, gb), nbytes in GPU_MEMORY_BYTES.items():
        if gpu.startswith(fam) and mem_gb == gb:
            out.gpu_memory_bytes = nbytes
            out.notes.append(f"GPU memory {gb} GB as the row states ({nbytes / 2**30:.2f} GiB visible, assumed)")

    rc = str(p.get("recompute") or "").lower()
    mods = _recompute_modules(rc) if rc.startswith("selective") else None
    if mods is None and not rc and group == "nemo_bridge_perf_summary" and "deepseek" in name:
        fam = next((k for k in BRIDGE_DEEPSEEK_RECOMPUTE if gpu.startswith(k)), None)
        if fam is not None:
            mods = BRIDGE_DEEPSEEK_RECOMPUTE[fam]
            out.parallel["recompute"] = "selective"
            out.notes.append(f"selective recompute of {', '.join(mods)} (Megatron-Bridge DeepSeek-V3 perf recipe)")
    if mods is not None:
        out.parallel["recompute_modules"] = mods
        if "recompute" not in out.parallel:
            out.notes.append(f"selective recompute modules {', '.join(mods)} (row)")

    key = BF16_GRAD_RECIPES.get(group)
    if key is not None and key in name:
        out.parallel["grad_reduce_in_bf16"] = True
        out.notes.append("16-bit main gradients (recipe: grad_reduce_in_fp32 False / grad_sync_dtype bf16)")

    fsdp = p.get("fsdp")
    if group != "torchtitan" and isinstance(fsdp, int) and not isinstance(fsdp, bool) and fsdp > 1:
        # Megatron-Bridge perf scripts (set_mcore_fsdp_configs): data_parallel_sharding_strategy optim_grads_params
        out.parallel["zero_stage"] = 3
        out.notes.append(f"Megatron-FSDP over {fsdp} ranks: optim_grads_params (ZeRO-3; Megatron-Bridge perf scripts)")

    if group == "nemo_bridge_perf_summary" and re.search(r"fp8[-_ ]?cs", prec):
        # Megatron-Bridge bf16_with_fp8_current_scaling_mixed(): fp8_recipe tensorwise, fp8_param_gather True
        out.parallel["fp8_param_gather"] = True
        out.notes.append("FP8 primary weights (FP8-CS recipe: fp8_param_gather True, 1-byte weights)")

    if group in TE_CROSS_ENTROPY_GROUPS:
        out.job["cross_entropy_fusion_impl"] = "te"
        out.notes.append("Transformer Engine cross entropy (recipe: cross_entropy_fusion_impl te)")

    if (group == "nemo_bridge_perf_summary" and p.get("etp") is None and p.get("ep")
            and any(m in name for m in BRIDGE_ETP1_MODELS)):
        out.parallel["etp"] = 1
        out.notes.append("expert tensor parallel 1 (Megatron-Bridge perf config)")

    if group == "megatron_moe_recipes":
        out.parallel.update(MOE_RECIPE_OPTIMIZER)
        out.notes.append("precision-aware optimizer: bf16 Adam moments (recipe YAML)")
    return out


def apply_row_options(row: dict[str, Any], cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                      notes: list[str]) -> tuple[ClusterSpec, TrainingJob, ParallelConfig]:
    """``row_options(row)`` applied to the built inputs; its notes are appended to ``notes``."""
    o = row_options(row)
    notes.extend(o.notes)
    if o.gpu_memory_bytes is not None and o.gpu_memory_bytes != cluster.gpu.memory_bytes:
        cluster = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"memory_bytes": o.gpu_memory_bytes})})
    if o.parallel:
        par = ParallelConfig(**{**par.model_dump(), **o.parallel})
    if o.job:
        job = TrainingJob(**{**job.model_dump(), **o.job})
    return cluster, job, par
