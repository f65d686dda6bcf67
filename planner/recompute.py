"""Partial full recompute: the fewest recomputed layers per model chunk that fit in memory.

Megatron-LM's ``--recompute-granularity full --recompute-method block --recompute-num-layers N`` checkpoints the
first N layers of each model chunk (each pipeline stage; each virtual stage under interleaving) and keeps the full
activations of the others (megatron-core 0.16.1 ``transformer/transformer_block.py``
``TransformerBlock._checkpointed_forward``, method ``block``). In the cost models the recompute time grows with
N (``cost_models.step_time``: one more forward of each recomputed layer, ``flops.recomputed_layers``) and the
stored activations fall with N (``cost_models.memory``: a recomputed layer keeps only its input), so for a given
everything-else the best N is the smallest that fits. The search therefore does not vary N: it derives it here.

Only Megatron-LM expresses "first N layers" (the planner's Megatron emitter writes ``block N``); DeepSpeed's
pipeline engine checkpoints at a layer interval (``activation_checkpoint_interval``) and torchtitan's full
activation checkpointing wraps every block (``activation_checkpoint.mode = "full"``), so for them N stays None
(every layer).
"""
from __future__ import annotations

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import parse_pipeline_layout, stage_layer_counts
from cost_models.memory import estimate_memory
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM

#: Frameworks whose launch can recompute only the first N layers of each chunk (Megatron ``block`` method).
PARTIAL_RECOMPUTE_FRAMEWORKS = ("megatron",)


def max_chunk_layers(model: ModelSpec, par: ParallelConfig) -> int:
    """Most decoder layers of one model chunk (a stage's layers / vpp under interleaving; ``pipeline_layout``
    chunks when one is given): ``recompute_num_layers`` at or above it recomputes every layer."""
    if par.pipeline_layout is not None:
        counts = [c.count("t") for c in parse_pipeline_layout(par.pipeline_layout)]
        v = par.vpp if par.pipeline_schedule == "interleaved" else 1
        per_rank = max(1, len(counts) // par.pp)
        if per_rank != v:
            return max(sum(counts[c * par.pp + r] for c in range(per_rank)) for r in range(par.pp))
        return max(counts, default=0)
    v = par.vpp if par.pipeline_schedule == "interleaved" else 1
    return max(-(-n // v) for n in stage_layer_counts(model.num_layers, par))


def fewest_recomputed_layers(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                             framework: str = "megatron",
                             headroom: float = DEFAULT_MEMORY_HEADROOM) -> int | None:
    """Smallest ``recompute_num_layers`` N (0 < N < layers of the largest chunk) under full recompute such that
    every stage's memory (``cost_models.memory.estimate_memory``, its peak over stages) fits in the GPU's
    capacity x (1 - ``headroom``) bytes; None = every layer (N would reach a whole chunk, or nothing smaller fits,
    or even every layer does not fit, or ``framework`` cannot express a partial recompute).

    Bisection over N: the memory model's stored activations fall monotonically with N (each further recomputed
    layer keeps only its input, ``activations.layer_input_bytes``, instead of its full activations), so "fits" is
    monotone in N; about log2(layers per chunk) + 1 memory evaluations.
    """
    if framework.split("_")[0] not in PARTIAL_RECOMPUTE_FRAMEWORKS:
        return None
    if getattr(job, "framework", framework) != framework:
        job = job.model_copy(update={"framework": framework})
    limit = cluster.gpu.memory_bytes * (1 - headroom)
    top = max_chunk_layers(model, par)
    if top <= 1:
        return None

    def fits(n: int | None) -> bool:
        p = par.model_copy(update={"recompute": "full", "recompute_num_layers": n})
        return estimate_memory(model, cluster, job, p).peak_bytes <= limit

    if not fits(None):
        return None
    lo, hi = 1, top  # fits(top) == fits(None): N = a whole chunk recomputes every layer
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return None if lo >= top else lo


def with_fewest_recomputed_layers(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                                  framework: str = "megatron",
                                  headroom: float = DEFAULT_MEMORY_HEADROOM) -> ParallelConfig:
    """``par`` with ``recompute_num_layers`` set by ``fewest_recomputed_layers`` when it is a full-recompute
    configuration; unchanged otherwise."""
    if par.recompute != "full":
        return par
    n = fewest_recomputed_layers(model, cluster, job, par, framework, headroom)
    return par if n == par.recompute_num_layers else par.model_copy(update={"recompute_num_layers": n})


def dominated_by_no_recompute(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                              peak_bytes: float, headroom: float = DEFAULT_MEMORY_HEADROOM,
                              framework: str = "megatron") -> bool:
    """True when ``par`` recomputes (full, any N) although the same configuration without recompute fits in
    capacity x (1 - ``headroom``) with a peak no higher than ``peak_bytes`` (``par``'s own): it is then slower
    and no smaller, so a plan list should show the no-recompute plan instead. The search drops such plans only
    when ``none`` is in its recompute space (callers check). ``framework`` selects the memory model, as in
    ``planner.evaluation.evaluate``."""
    if par.recompute != "full":
        return False
    plain = par.model_copy(update={"recompute": "none", "recompute_num_layers": None})
    p = estimate_memory(model, cluster, job, plain, framework=framework).peak_bytes
    return p <= cluster.gpu.memory_bytes * (1 - headroom) and p <= peak_bytes
