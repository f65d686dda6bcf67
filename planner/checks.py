"""Independent re-check of every hard constraint of one configuration.

This module deliberately does not share code with the search (``planner.space``): a plan is emitted only if
``check_config`` finds no violation, so a bug in the search's pruning cannot produce a wrong plan.
Rules and their sources (formulas.md Sec. 7.1 "Checks enforced", Megatron-LM ``arguments.py`` /
``TransformerConfig.__post_init__`` / ``parallel_state``; DeepSpeed ``runtime/pipe/engine.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import LayoutError, stage_layer_counts
from cost_models.memory import MemoryEstimate
from model_zoo.spec import ModelSpec

#: Default fraction of usable memory kept free (allocator spikes, NCCL growth); see ``--memory-headroom``.
DEFAULT_MEMORY_HEADROOM = 0.0
#: A plan whose peak is within this fraction of capacity is flagged ``at_risk`` (field experience: PyTorch's
#: caching allocator fragments a few percent of memory; field_cases.md MEM cases OOM within ~3-5%).
AT_RISK_FRACTION = 0.05


@dataclass(frozen=True)
class Violation:
    """One broken constraint: ``name`` (stable id), a one-line ``message``, and ``excess`` (how much it is
    exceeded by, in the constraint's own unit; bytes for memory, 0 for divisibility)."""

    name: str
    message: str
    excess: float = 0.0


def check_config(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, num_gpus: int,
                 memory: MemoryEstimate | None = None, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                 framework: str = "megatron") -> list[Violation]:
    """All violated constraints of ``par`` (empty list = valid). ``memory`` is checked when given."""
    v: list[Violation] = []
    add = lambda name, msg, excess=0.0: v.append(Violation(name, msg, excess))  # noqa: E731

    if par.world_size != num_gpus:
        add("world_size", f"tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = {par.world_size} != {num_gpus} GPUs")
    a, g = model.num_attention_heads, model.num_kv_heads
    if a % par.tp:
        add("heads_tp", f"num_attention_heads {a} is not divisible by tp {par.tp}")
    if model.mla is None and g % par.tp and par.tp % g:
        add("kv_heads_tp", f"num_kv_heads {g} and tp {par.tp}: neither divides the other")
    if par.tp > cluster.node.nvlink_domain_size:
        add("tp_nvlink", f"tp {par.tp} exceeds the NVLink domain of {cluster.node.nvlink_domain_size} GPUs")
    if job.precision not in cluster.gpu.peak_flops or not cluster.gpu.peak_flops.get(job.precision):
        add("precision", f"{cluster.gpu.name} has no dense {job.precision} rate")
    try:
        counts = stage_layer_counts(model.num_layers, par)
    except LayoutError as e:
        add("layers_pp", str(e))
        counts = []
    if par.vpp > 1:
        if par.pp == 1:
            add("vpp_pp", "vpp > 1 (interleaved schedule) needs pp > 1")
        bad = [c for c in counts if c % par.vpp]
        if bad:
            add("layers_vpp", f"stage layer counts {sorted(set(bad))} are not divisible by vpp {par.vpp}")
    if job.global_batch_size % (par.micro_batch_size * par.dp):
        add("batch", f"global_batch_size {job.global_batch_size} is not divisible by "
                     f"micro_batch_size*dp = {par.micro_batch_size}*{par.dp}")
    m = job.global_batch_size // (par.micro_batch_size * par.dp) if par.micro_batch_size * par.dp else 0
    if par.pp > 1 and par.vpp > 1 and m % par.pp:
        add("microbatches_interleaved", f"interleaved schedule needs num_microbatches {m} divisible by pp {par.pp}")
    if par.cp > 1 and job.seq_length % (2 * par.cp):
        add("seq_cp", f"seq_length {job.seq_length} is not divisible by 2*cp = {2 * par.cp}")
    if par.sequence_parallel and (job.seq_length // par.cp) % par.tp:
        add("seq_sp", f"seq_length/cp {job.seq_length // par.cp} is not divisible by tp {par.tp} (sequence parallel)")
    if par.ep > 1:
        if model.moe is None:
            add("ep_dense", "ep > 1 needs a mixture-of-experts model")
        elif model.moe.num_experts % par.ep:
            add("experts_ep", f"num_experts {model.moe.num_experts} is not divisible by ep {par.ep}")
        if (par.dp * par.cp * par.tp) % (par.ep * par.expert_tp):
            add("expert_grid", f"dp*cp*tp = {par.dp * par.cp * par.tp} is not divisible by ep*etp = "
                               f"{par.ep * par.expert_tp}")
    if par.recompute_num_layers is not None and par.recompute != "full":
        add("recompute_num_layers", "recompute_num_layers needs recompute full")
    if framework == "deepspeed" and par.pp > 1 and par.zero_stage >= 2:
        add("deepspeed_pipeline_zero", f"DeepSpeed's pipeline engine cannot run ZeRO stage {par.zero_stage} with pp > 1")
    if memory is not None:
        limit = memory.capacity_bytes * (1 - memory_headroom)
        peak = memory.peak_stage
        if peak.total > limit:
            add("memory", f"stage {peak.stage} needs {peak.total / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB usable "
                          f"(by {(peak.total - limit) / 2**30:.1f} GiB)", peak.total - limit)
    return v
