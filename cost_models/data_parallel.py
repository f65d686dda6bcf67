"""Data-parallel gradient reduction and parameter gathers, and how much of them the step exposes (seconds).

Gradient reduce-scatter (fp32 gradient buffers, Megatron's default for bf16; 16-bit for its fp16 runs and with
``--grad-reduce-in-bf16``: ``reduced_gradient_bytes``) + parameter all-gather (distributed optimizer / ZeRO-1) or
all-reduce (ZeRO-0); overlapped with the last micro-batch's backward / first forward when
the framework overlaps them (``overlap_dp``), otherwise exposed. ZeRO-3/FSDP all-gathers the 16-bit parameters
layer by layer in forward and again in backward of *every* micro-batch (resharded after forward; Rajbhandari et
al. SC20 Sec. 7: 1.5x the data-parallel volume at one micro-batch), and reduce-scatters the gradients in every
micro-batch's backward (``FSDP_REDUCE_EVERY_MICROBATCH``). Prefetch hides layer i+1's gather under layer i's
compute (``fsdp_exposed_s``). DeepSpeed ZeRO-2 and Megatron-FSDP ``optim_grads`` (plan3d's Megatron ZeRO-2)
reduce-scatter in every micro-batch's backward too and all-gather the updated weights after the optimizer step.
HSDP (``hsdp_shard_size``) keeps the gathers in the shard group and all-reduces the reduced shard across replicas;
``grad_reduce_in_bf16`` halves gradient bytes.

ZeRO-3 with pipeline parallelism in torchtitan: PyTorch's pipeline stage keeps the parameters unsharded across
micro-batches and reduces once (``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``), but the
published torchtitan 405B PP rows (1F1B / interleaved, torchtitan's default 8 / 16 micro-batches) come out +0.4% /
+19.7% with that schedule (torchtitan group 7.25%) and -3.3% / +6.2% with per-micro-batch gathers (6.90%), so the
per-micro-batch schedule is kept there (a calibration choice, open until a trace settles it).
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .comm import collective_time
from .config import BYTES_16BIT, BYTES_FP32, ParallelConfig, TrainingJob, compute_bytes
from .gemm import hbm_rate
from .layout import GroupPlacement
from .memory import StageParams

#: Fractional slowdown of compute kernels while a collective runs next to them (NCCL's channels occupy SMs and
#: HBM bandwidth; a GEMM sized to one wave of SMs spills into a second wave): Lee et al. 2025, "Characterizing
#: Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114), abstract: average
#: 18.9% (max 40%) compute slowdown under overlap on A100/H100, GPT and Llama layers. Applied to the compute that
#: hides ZeRO-3 / FSDP traffic (``fsdp_exposed_s``), where the overlap spans the whole pass; the TP and EP overlap
#: factors (``TP_OVERLAP_EXPOSED``, ``EP_OVERLAP_EXPOSED``) are fitted and already include theirs. Also applied to
#: the compute under an overlapped gradient reduction / parameter gather (``overlapped_exposed_s``).
OVERLAP_COMPUTE_SLOWDOWN = 0.189

#: ZeRO-3 / FSDP reduce-scatters the gradients in every micro-batch's backward, not only in the last one of the
#: step, in all three frameworks, since each rank keeps only its gradient shard. DeepSpeed ZeRO-2/3: "gradient
#: reduction is required after every backward because of gradient partitioning" (tjruwase, deepspeedai/DeepSpeed
#: issue 2252; ``engine.py``: "ZeRO stage >= 2 communicates during non gradient accumulation boundaries as well").
#: torchtitan FSDP2: no ``set_requires_gradient_sync(False)`` during gradient accumulation (pytorch/torchtitan PR 1710
#: declined for that reason; pytorch/pytorch PR 126166: FSDP2 reduce-scatters per micro-batch "without any
#: intervention"). Megatron-FSDP: ``MegatronFSDP.no_sync`` (``megatron/core/distributed/fsdp/src/megatron_fsdp/
#: megatron_fsdp.py``): "For grads shard mode there will actually always be gradient sync happening"
#: (``optim_grads`` and ``optim_grads_params``).
FSDP_REDUCE_EVERY_MICROBATCH = frozenset({"megatron", "nemo", "deepspeed", "torchtitan"})

#: Frameworks whose ZeRO-3 is PyTorch FSDP2 (``fully_shard``), which copies every all-gathered layer out of the flat
#: all-gather buffer into per-parameter tensors on the compute stream: ``foreach_all_gather_copy_out`` waits for the
#: all-gather event on the current stream, then ``split_with_sizes_copy`` reads and writes the unsharded parameters
#: (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``). Megatron-FSDP and DeepSpeed ZeRO-3 gather into the
#: parameters' own storage (no copy). The gradient reduce-scatter's copy-in runs on the reduce-scatter stream.
FSDP2_FRAMEWORKS = frozenset({"torchtitan"})
#: HBM bytes of that copy per gathered parameter byte: read once, written once.
FSDP2_COPY_OUT_PASSES = 2.0


def fsdp_exposed_s(gather_s: float, reduce_s: float, compute_s: float, units: int) -> float:
    """Exposed seconds of layer-wise (FSDP / ZeRO-3) communication of one forward or backward pass of one
    micro-batch: ``gather_s`` (parameter all-gathers) and ``reduce_s`` (gradient reduce-scatters) over the whole
    pass, split evenly over ``units`` layers that take ``compute_s`` in all.

    Prefetch overlaps layer i+1's gather with layer i's compute, and layer i's reduce-scatter with layer i-1's
    compute (PyTorch FSDP ``backward_prefetch`` / FSDP2 implicit prefetch, Zhao et al. VLDB 2023 Sec. 3.3-3.4;
    DeepSpeed ``stage3_prefetch_bucket_size``; Megatron-FSDP ``--overlap-param-gather`` / ``--overlap-grad-reduce``).
    Gathers and reduce-scatters share the GPU's NIC, so the pass is a three-stage pipeline (gather, compute,
    reduce) over ``units`` items: the first gather and the last reduce-scatter are always exposed, and every
    other layer exposes whatever its communication takes beyond its compute,
    ``g + r + (units - 1) * max(0, g + r - c)`` with per-layer ``g, r, c``. So a pass never takes less than its
    communication (exposed >= gather + reduce - compute) nor less than its compute. The compute that runs under
    the collectives is stretched by ``OVERLAP_COMPUTE_SLOWDOWN`` (counted as exposed time).
    """
    if gather_s <= 0 and reduce_s <= 0:
        return 0.0
    n = max(1, units)
    g, r, c = gather_s / n, reduce_s / n, compute_s / n
    # the compute that runs under a collective is slowed by the SMs and HBM bandwidth the NCCL kernels take
    # (``OVERLAP_COMPUTE_SLOWDOWN``): the overlapped span min(g + r, c) of every layer but the edges is stretched
    hidden = (n - 1) * min(g + r, c)
    return g + r + (n - 1) * max(0.0, g + r - c) + OVERLAP_COMPUTE_SLOWDOWN * hidden


@dataclass(frozen=True)
class DataParallelSync:
    """Seconds of one full data-parallel synchronisation of the most loaded stage: gradient reduction
    (reduce-scatter, or all-reduce under ZeRO-0; dense + expert + tied embedding), parameter all-gather, and
    HSDP's all-reduce of the reduced shard across replicas."""

    reduce_s: float = 0.0
    gather_s: float = 0.0
    replica_all_reduce_s: float = 0.0
    #: seconds of one FSDP2 copy-out of the stage's gathered parameters on the compute stream (``FSDP2_FRAMEWORKS``)
    copy_out_s: float = 0.0


def reduced_gradient_bytes(par: ParallelConfig, precision: str, fw_base: str) -> int:
    """Bytes per gradient element in the data-parallel reduction: Megatron's fp32 main gradients (forced for bf16,
    ``accumulate_allreduce_grads_in_fp32``), 16-bit with ``--grad-reduce-in-bf16``
    (``ParallelConfig.grad_reduce_in_bf16``) and in Megatron's fp16 training, whose main gradients stay fp16
    (``memory.state_bytes``)."""
    if getattr(par, "grad_reduce_in_bf16", False) or (precision == "fp16" and fw_base in ("megatron", "nemo")):
        return BYTES_16BIT
    return BYTES_FP32


def dp_sync_s(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, stage: StageParams,
              groups: dict[str, GroupPlacement], fw_base: str) -> DataParallelSync:
    """The collectives that synchronise ``stage``'s parameters over the data-parallel (x CP) group and the
    expert-data-parallel group (``DataParallelSync``), by framework and ZeRO stage."""
    dom = cluster.node.nvlink_domain_size
    cp_g, dp_g = groups["cp"], groups["dp"]
    shard = par.dp * par.cp
    dp_group = GroupPlacement(shard, dp_g.ranks_per_domain * (cp_g.size if cp_g.intra_domain else 1)) \
        if shard > 1 else GroupPlacement(1, 1)
    rs_t = ag_t = rep_ar_t = 0.0
    grad_b = reduced_gradient_bytes(par, job.precision, fw_base)
    # bytes per gathered parameter: 16-bit, or 1-byte FP8 weights with ``--fp8-param-gather`` under a per-tensor
    # FP8 recipe (Transformer Engine Float8Tensor; ``cost_models.memory.FP8_PARAM_BYTES``)
    ab = compute_bytes(job.precision)  # the parameters' compute copy: 4 bytes in fp32 training
    param_b = 1.0 if getattr(par, "fp8_param_gather", False) and job.precision == "fp8" else float(ab)
    hsdp = getattr(par, "hsdp_shard_size", None)
    hsdp = hsdp if par.zero_stage >= 3 and hsdp and 1 < hsdp < shard and shard % hsdp == 0 else None
    if shard > 1:
        if par.zero_stage == 0:
            rs_t = collective_time("all_reduce", grad_b * stage.dense, dp_group, cluster)
        elif fw_base == "deepspeed" and par.zero_stage == 1:
            # DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py): all-reduce of the fp32 gradient buffer, each
            # rank updates its partition, then all-gathers the 16-bit weights. The all-reduce runs in the engine's
            # communication_data_type, bf16 / fp16 under bf16 / fp16 training (runtime/engine.py
            # ``communication_data_type``, ``allreduce_bucket`` casts the fp32 buffer; pipe/engine.py
            # ``_bf16_reduce_grads``); BLOOM needed PyTorch 1.11's NCCL "which supports BF16 comms" for it
            # (bigscience tr11-176B-ml README)
            rs_t = collective_time("all_reduce", ab * stage.dense, dp_group, cluster)
            ag_t = collective_time("all_gather", param_b * stage.dense, dp_group, cluster)
        elif hsdp:
            # HSDP (ZeRO-3 within ``hsdp_shard_size`` ranks, replicated across): gathers and reduce-scatters stay in
            # the shard group, the reduced shard is then all-reduced across the replicas (PyTorch FSDP2
            # ``fully_shard`` with a 2-D mesh; pytorch/pytorch PR 126166). The shard group is the inner (contiguous)
            # dimension of the dp x cp ranks (torchtitan mesh: dp_replicate outer, dp_shard inner)
            rpd = dp_group.ranks_per_domain
            sg = GroupPlacement(hsdp, min(hsdp, rpd))
            rg = GroupPlacement(shard // hsdp, max(1, rpd // hsdp))
            rs_t = collective_time("reduce_scatter", grad_b * stage.dense, sg, cluster)
            rep_ar_t = collective_time("all_reduce", grad_b * stage.dense / hsdp, rg, cluster)
            ag_t = collective_time("all_gather", param_b * stage.dense, sg, cluster)
        else:
            rs_t = collective_time("reduce_scatter", grad_b * stage.dense, dp_group, cluster)
            ag_t = collective_time("all_gather", param_b * stage.dense, dp_group, cluster)
    if par.expert_dp > 1 and stage.expert > 0:
        edp = GroupPlacement(par.expert_dp, max(1, min(par.expert_dp, dom // max(1, par.expert_tp * par.ep))))
        rs_t += collective_time("reduce_scatter" if par.zero_stage else "all_reduce",
                                BYTES_FP32 * stage.expert, edp, cluster)
        if par.zero_stage:
            ag_t += collective_time("all_gather", ab * stage.expert, edp, cluster)
    if model.tie_word_embeddings and par.pp > 1:
        # first and last stage all-reduce the shared embedding's fp32 gradient after the pipeline drains
        # (Megatron-LM ``finalize_model_grads._allreduce_word_embedding_grads``; DeepSpeed ``ReduceTiedGrads``)
        emb_g = GroupPlacement(2, 2 if par.world_size // par.pp * (par.pp - 1) < dom else 1)
        vocab = model.padded_vocab_size(par.tp)
        rs_t += collective_time("all_reduce", BYTES_FP32 * vocab * model.hidden_size / par.tp, emb_g, cluster)
    if getattr(par, "param_cpu_offload", False) and par.zero_stage >= 3 and shard > 1:
        # ZeRO-Infinity CPU tier: each gather first copies this rank's 16-bit partition from host memory
        # (``offload_param``; partitioned_param_coordinator fetches it to the GPU before the all-gather)
        ag_t += ab * stage.dense / shard / (cluster.host_link_bytes_per_s or float("inf"))
    copy_out = 0.0
    if fw_base in FSDP2_FRAMEWORKS and par.zero_stage >= 3 and shard > 1:
        copy_out = FSDP2_COPY_OUT_PASSES * param_b * stage.dense / hbm_rate(cluster)
    return DataParallelSync(rs_t, ag_t, rep_ar_t, copy_out)


def dp_exposed_s(sync: DataParallelSync, par: ParallelConfig, fw_base: str, overlap_dp: bool, m: int,
                 first_fwd_s: float, last_bwd_s: float, units: int) -> float:
    """Seconds of data-parallel synchronisation on the step's critical path, given one micro-batch's forward
    (``first_fwd_s``) and backward (``last_bwd_s``) on the busiest rank, ``m`` micro-batches and ``units`` FSDP
    units (decoder layers) on that rank. The schedule by framework and ZeRO stage is in the module docstring."""
    rs_t, ag_t, rep_ar_t = sync.reduce_s, sync.gather_s, sync.replica_all_reduce_s
    shard = par.dp * par.cp
    if par.zero_stage >= 3 and shard > 1:
        # ZeRO-3 / FSDP: every micro-batch all-gathers the 16-bit parameters layer by layer in forward and again in
        # backward (parameters are resharded after forward), and reduce-scatters the gradients layer by layer in
        # backward; each layer's gather is prefetched under the previous layer's compute (``fsdp_exposed_s``)
        # torchtitan with pipeline parallelism does not reshard after forward (``fsdp_reshard_after_forward``
        # "default") and PyTorch's pipeline stage turns off reshard-after-backward and gradient sync for all but the
        # last backward (``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``), which would gather
        # once per step; the published torchtitan 405B PP rows come out +0.4% / +19.7% with that schedule (-3.3% /
        # +6.2% with per-micro-batch gathers), so the per-micro-batch schedule below is kept for them too
        # until a trace settles it (calibration choice, documented in the module docstring)
        # HSDP: torchtitan all-reduces across the replicas only in the last micro-batch
        # (``set_requires_all_reduce(is_last)``, pytorch/torchtitan PR 4505); Megatron-FSDP in every one
        rs_mb = rs_t if fw_base in FSDP_REDUCE_EVERY_MICROBATCH else 0.0
        rs_mb += 0.0 if fw_base == "torchtitan" else rep_ar_t
        fwd_mb = fsdp_exposed_s(ag_t, 0.0, first_fwd_s, units)
        bwd_mb = fsdp_exposed_s(ag_t, rs_mb, last_bwd_s, units)
        bwd_last = fsdp_exposed_s(ag_t, rs_t + rep_ar_t, last_bwd_s, units)
        # FSDP2 copies each gathered layer out of the all-gather buffer on the compute stream, twice per micro-batch
        return m * fwd_mb + (m - 1) * bwd_mb + bwd_last + 2 * m * sync.copy_out_s
    if fw_base == "deepspeed" and par.zero_stage == 2 and shard > 1 and par.pp == 1:
        # DeepSpeed ZeRO-2 reduce-scatters the gradients in every micro-batch's backward (each rank keeps only its
        # partition: DeepSpeed issue 2252, stage_1_and_2.py ``reduce_ready_partitions_and_remove_grads``), in
        # buckets overlapped with the backward (``overlap_comm``); the updated 16-bit parameters are all-gathered
        # once after the optimizer step, before the next forward (``all_gather_dp_groups`` in ``step``)
        return m * fsdp_exposed_s(0.0, rs_t, last_bwd_s, units) + ag_t
    if fw_base in ("megatron", "nemo") and par.zero_stage == 2 and shard > 1:
        # Megatron-FSDP ``optim_grads`` (sharded gradients) reduce-scatters in every micro-batch's backward
        # (``megatron_fsdp.py``: ``grad_reduce_every_bprop`` for optim_grads / optim_grads_params), layer by layer
        # under the backward; the replicated 16-bit weights are all-gathered once after the optimizer step
        # (under the first forward with ``--overlap-param-gather``)
        return m * fsdp_exposed_s(0.0, rs_t, last_bwd_s, units) + (
            overlapped_exposed_s(ag_t, first_fwd_s) if overlap_dp else ag_t)
    if overlap_dp:
        return overlapped_exposed_s(rs_t, last_bwd_s) + overlapped_exposed_s(ag_t, first_fwd_s)
    return rs_t + ag_t


def overlapped_exposed_s(comm_s: float, compute_s: float) -> float:
    """Exposed seconds of a collective of ``comm_s`` overlapped with a pass of ``compute_s`` (the bucketed gradient
    reduction under the last micro-batch's backward, Megatron-LM ``--overlap-grad-reduce`` / NeMo / DeepSpeed
    ``overlap_comm``; the parameter all-gather under the first forward, ``--overlap-param-gather``): what the
    collective takes beyond the compute, plus the slowdown of the compute that runs next to it
    (``OVERLAP_COMPUTE_SLOWDOWN`` x the overlapped span ``min(comm, compute)``), as ``fsdp_exposed_s`` charges it
    for layer-wise sharded data parallelism."""
    if comm_s <= 0:
        return 0.0
    return max(0.0, comm_s - compute_s) + OVERLAP_COMPUTE_SLOWDOWN * min(comm_s, compute_s)
