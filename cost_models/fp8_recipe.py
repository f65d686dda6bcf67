"""The FP8 scaling recipe a run uses by default, and the per-expert host-cost class it falls in.

Recipes are Megatron-LM's ``--fp8-recipe`` choices (``megatron/training/arguments.py``):

- ``mxfp8``: MXFP8, 1 x 32 blocks with E8M0 scales, on GPUs whose tensor cores take block-scaled operands
  (Blackwell; a cluster spec with an ``fp4`` peak). Megatron-LM's MoE recipes on B200 / GB200 / GB300
  (``examples/moe_recipes/*/{b200,gb200,gb300}/mxfp8_*.yaml``: ``fp8_recipe: mxfp8``).
- ``blockwise``: DeepSeek-V3's scaling (1 x 128 activation tiles, 128 x 128 weight blocks; DeepSeek-AI 2024,
  arXiv:2412.19437 Sec. 3.3.1) on Hopper. Megatron-LM's MoE recipes on H100 (``examples/moe_recipes/qwen3_30b/h100/
  fp8_32GPU_TP1PP1EP8.yaml``, ``deepseek_v3/h100/fp8_1024GPU_TP2PP8EP64.yaml``: ``fp8_recipe: blockwise``).
- ``delayed``: per-tensor scaling from an amax history (Transformer Engine's default; Megatron-LM
  ``examples/llama/train_llama3_8b_h100_fp8.sh``), the dense default on Hopper.
- ``tensorwise``: per-tensor current scaling; megatron-core's ``TransformerConfig`` refuses delayed scaling with
  ``moe_act`` / ``layernorm`` recompute under FP8, so those runs take it instead.

Host-cost class (``moe_overhead.HOST_QUANTIZE_S``): Transformer Engine's ``split_quantize`` bulk-allocates the
per-expert outputs of the block-scaled recipes (``bulk_allocate_mxfp8_tensors``,
``bulk_allocate_fp8_blockwise_tensors`` in ``transformer_engine/pytorch/csrc/extensions/cast.cpp``, TE 2.8-2.14):
class ``mx``; the per-tensor recipes build one ``Float8Tensor`` per expert: class ``cs``.

``job_fp8_recipe`` is the recipe a job runs: ``TrainingJob.fp8_recipe`` when it names one, else the framework's one
recipe where it has one (torchtitan's float8: dynamic tensorwise; Megatron-DeepSpeed: delayed), else
``default_fp8_recipe``; the cost terms that depend on it (the forward GEMMs' fast accumulation, current scaling's
amax pass, the per-expert host time) all read it. ``fp8_recipe_problem`` says why a named recipe cannot run.
"""
from __future__ import annotations

from typing import get_args

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .config import Fp8Recipe, ParallelConfig, TrainingJob

#: Recipes that compute each tensor's amax in a pass of its own before the cast (per-tensor current scaling: Transformer
#: Engine's ``Float8CurrentScalingQuantizer`` runs ``nvte_compute_amax``, then the scale, then ``nvte_quantize``;
#: torchao's tensorwise ``tensor_to_scale`` reduces the amax before ``hp_tensor_and_scale_to_float8``). Delayed scaling
#: takes the scale from the amax history and records the new amax inside the cast kernel; the block-scaled recipes
#: compute each block's amax inside the cast kernel.
CURRENT_SCALING_RECIPES = frozenset({"tensorwise"})

#: Megatron-LM ``--fp8-recipe`` value -> per-expert host-cost class of ``moe_overhead.HOST_QUANTIZE_S``.
HOST_COST_CLASS = {"mxfp8": "mx", "blockwise": "mx", "delayed": "cs", "tensorwise": "cs"}
#: Recipes with one scale per tensor (host-cost class ``cs``): their GEMMs take cuBLAS's per-tensor-scaled FP8 path,
#: whose accumulation mode Transformer Engine and torchao set per GEMM (``gemm.FP8_FAST_ACCUM_SPEEDUP``).
PER_TENSOR_RECIPES = frozenset(r for r, c in HOST_COST_CLASS.items() if c == "cs")


#: The ``--fp8-recipe`` values each framework's FP8 path runs as plan3d times and launches it. Megatron-LM (and NeMo,
#: on megatron-core): its four ``--fp8-recipe`` choices (``megatron/training/arguments.py``). Megatron-DeepSpeed:
#: Transformer Engine's delayed scaling behind ``--fp8-hybrid`` (``planner/emit/deepspeed.py``; no recipe argument).
#: torchtitan: its float8 converter's dynamic tensorwise scaling (torchao ``Float8LinearConfig``; the rowwise
#: recipes are not costed).
MEGATRON_FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
FRAMEWORK_FP8_RECIPES = {"megatron": MEGATRON_FP8_RECIPES, "nemo": MEGATRON_FP8_RECIPES,
                         "deepspeed": ("delayed",), "torchtitan": ("tensorwise",)}
#: Selective-recompute modules megatron-core refuses under delayed scaling (``TransformerConfig.__post_init__``:
#: "Delayed scaling does not support moe_act and layernorm recompute for fp8").
DELAYED_SCALING_REFUSED_RECOMPUTE = frozenset({"moe_act", "layernorm"})


def fp8_recipe_problem(recipe: str, cluster: ClusterSpec, framework: str = "megatron") -> str | None:
    """Why an FP8 job cannot run ``recipe`` on ``cluster`` under ``framework``; None when it can.

    - the framework's FP8 path must offer it (``FRAMEWORK_FP8_RECIPES``);
    - ``mxfp8`` needs tensor cores that take block-scaled operands: a cluster spec with an ``fp4`` peak, as
      ``default_fp8_recipe`` assumes (Transformer Engine ``check_mxfp8_support``: compute capability >= 10.0,
      Blackwell; gfx950 in its ROCm port).
    """
    fw = framework.split("_")[0]
    allowed = FRAMEWORK_FP8_RECIPES.get(fw, MEGATRON_FP8_RECIPES)
    if recipe not in allowed:
        return f"{fw} runs FP8 with {', '.join(allowed)}"
    peak = cluster.gpu.peak_flops
    if recipe == "mxfp8" and "fp4" not in peak:
        return (f"MXFP8 needs block-scaled tensor cores (Blackwell: Transformer Engine check_mxfp8_support), which "
                f"the {cluster.gpu.name} lacks")
    return None


def default_fp8_recipe(cluster: ClusterSpec, model: ModelSpec, par: ParallelConfig) -> str:
    """The Megatron-LM ``--fp8-recipe`` plan3d assumes (and emits) for an FP8 run of ``model`` on ``cluster``:
    ``mxfp8`` on block-scaled tensor cores (an ``fp4`` peak), else ``blockwise`` for a MoE model, else
    ``tensorwise`` under ``moe_act`` / ``layernorm`` selective recompute, else ``delayed`` (module docstring)."""
    if "fp4" in cluster.gpu.peak_flops:
        return "mxfp8"
    return _hopper_fp8_recipe(model, par)


def _hopper_fp8_recipe(model: ModelSpec, par: ParallelConfig) -> str:
    """``blockwise`` for a MoE model, else the per-tensor recipe (``default_fp8_recipe`` without block-scaled tensor
    cores)."""
    return "blockwise" if model.moe is not None else per_tensor_fp8_recipe(par)


def shared_fp8_recipe(clusters: list[ClusterSpec], model: ModelSpec, par: ParallelConfig) -> str:
    """The one ``--fp8-recipe`` of a launch whose ranks run on several clusters (plans over pools): each cluster's
    ``default_fp8_recipe`` when they agree, else the recipe without block-scaled tensor cores, which every FP8 GPU
    runs. Transformer Engine (``transformer_engine/pytorch/quantization.py``): MXFP8 needs compute capability 10.x
    (Blackwell), FP8 block scaling 9.0 or higher with CUDA >= 12.9, per-tensor scaling 8.9 or higher. The host-cost
    class is unchanged by the fallback (``blockwise`` and ``mxfp8`` are both ``mx``; dense models have no per-expert
    host cost)."""
    recipes = {default_fp8_recipe(c, model, par) for c in clusters}
    return recipes.pop() if len(recipes) == 1 else _hopper_fp8_recipe(model, par)


def per_tensor_fp8_recipe(par: ParallelConfig) -> str:
    """``tensorwise`` under ``moe_act`` / ``layernorm`` selective recompute (megatron-core's ``TransformerConfig``:
    "Delayed scaling does not support moe_act and layernorm recompute for fp8"), else ``delayed``."""
    return "tensorwise" if delayed_scaling_refused_modules(par) else "delayed"


def delayed_scaling_refused_modules(par: ParallelConfig) -> list[str]:
    """The selective-recompute modules of ``par`` that megatron-core refuses under delayed scaling
    (``DELAYED_SCALING_REFUSED_RECOMPUTE``), in ``par``'s order; empty when none or not selective."""
    if par.recompute != "selective":
        return []
    return [m for m in (getattr(par, "recompute_modules", None) or ()) if m in DELAYED_SCALING_REFUSED_RECOMPUTE]


def host_cost_class(recipe: str) -> str:
    """``mx`` or ``cs``: the per-expert host-cost class of a Megatron-LM ``--fp8-recipe`` (``HOST_COST_CLASS``).

    Raises:
        ValueError: ``recipe`` is not one of ``HOST_COST_CLASS``.
    """
    if recipe not in HOST_COST_CLASS:
        raise ValueError(f"fp8 recipe {recipe!r}: allowed {', '.join(HOST_COST_CLASS)}")
    return HOST_COST_CLASS[recipe]


def job_fp8_recipe(job: TrainingJob, cluster: ClusterSpec, model: ModelSpec, par: ParallelConfig,
                   framework: str = "megatron") -> str:
    """The ``--fp8-recipe`` an FP8 job runs: ``job.fp8_recipe`` when set, else the one recipe of a framework whose
    FP8 path has one (``FRAMEWORK_FP8_RECIPES``: torchtitan's float8 dynamic tensorwise scaling, torchao
    ``Float8LinearConfig`` ``hp_tensor_to_float8_dynamic``; Megatron-DeepSpeed's delayed scaling), else
    ``default_fp8_recipe``."""
    if job.fp8_recipe is not None:
        return job.fp8_recipe
    only = FRAMEWORK_FP8_RECIPES.get(framework.split("_")[0], ())
    if len(only) == 1:
        return only[0]
    return default_fp8_recipe(cluster, model, par)


def job_host_cost_class(job: TrainingJob, cluster: ClusterSpec, model: ModelSpec, par: ParallelConfig,
                        framework: str = "megatron") -> str:
    """The host-cost class (``mx`` / ``cs``) of the recipe the job runs (``job_fp8_recipe``: ``job.fp8_recipe``, else
    the framework's default): what ``estimate_step`` assumes when its caller gives no class."""
    return host_cost_class(job_fp8_recipe(job, cluster, model, par, framework))
