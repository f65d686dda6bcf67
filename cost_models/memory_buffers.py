"""Transient and communication buffers of each sharding backend, per phase of a training step (bytes per GPU).

What each backend allocates *outside* the persistent model states (``cost_models.memory.model_state_terms``) and
the stored activations, read from the backend's own source. Every function returns ``{phase: {name: bytes}}`` for
the phases ``forward``, ``backward`` and ``optimizer``; a name appears in ``plan3d memory``'s breakdown.

Sources (versions read for this model):

* Megatron-LM at commit d98e8a6 (2026-08-22): ``megatron/core/distributed/param_and_grad_buffer.py`` (DDP and the
  distributed optimizer), ``megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py`` and
  ``.../megatron_fsdp/param_and_grad_buffer.py`` (Megatron-FSDP), ``megatron/core/pipeline_parallel/
  p2p_communication.py`` (pipeline send/receive).
* DeepSpeed 0.19.8 (the ``validators`` extra): ``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``,
  ``config.py`` (bucket defaults).
* PyTorch 2.13.0: ``torch/distributed/fsdp/_fully_shard/`` (FSDP2), ``torch/distributed/pipelining/stage.py``.
* torchtitan at commit b5bcd76 (2026-08-21): ``torchtitan/distributed/fsdp.py`` (``reshard_after_forward``
  policy).

Units: parameters are counted on one GPU after TP/EP sharding (``StageParams``); bytes per element are named
constants below.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import BYTES_16BIT, BYTES_FP32

Buffers = dict[str, dict[str, float]]

#: Megatron-FSDP ``suggested_communication_unit_size`` when unset: ``max(1e9, 2 x mean FSDP-unit size)`` for
#: ``optim_grads_params``, ``max(1e9, bucket_size or 1e9)`` otherwise (``bucket_size`` is None under Megatron-FSDP);
#: the reduce-scatter queue holds up to this many unsharded gradient elements, the all-gather prefetch half of it
#: (``MegatronFSDP.__init__``: ``suggested_RS_queue_capacity``, ``suggested_AG_prefetch_size``).
MEGATRON_FSDP_COMM_UNIT_ELEMENTS = 1_000_000_000
#: DeepSpeed ZeRO ``reduce_bucket_size`` default, elements (``deepspeed/runtime/zero/config.py``).
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
#: DeepSpeed ZeRO-1/2 IPG buffers in backward with ``overlap_comm`` on, as plan3d emits it (``buf_0`` + ``buf_1``).
DEEPSPEED_IPG_BUFFERS = 2
#: DeepSpeed ZeRO-3 ``stage3_prefetch_bucket_size`` default, elements (``deepspeed/runtime/zero/config.py``).
DEEPSPEED_PREFETCH_BUCKET_ELEMENTS = 50_000_000
#: DeepSpeed ZeRO-3 ``stage3_max_reuse_distance`` default, elements (``deepspeed/runtime/zero/config.py``;
#: ``stage3_max_live_parameters`` has the same default and caps only the prefetch).
DEEPSPEED_MAX_REUSE_DISTANCE_ELEMENTS = 1_000_000_000

PHASE_NAMES = ("forward", "backward", "optimizer")  # the init phase has no backend buffers


@dataclass(frozen=True)
class BufferInputs:
    """What the buffer formulas need about one GPU of one pipeline stage.

    ``stage_params``: parameters on this GPU before data-parallel sharding (after TP/EP); ``largest_layer``: the
    largest decoder layer's parameters (the FSDP unit; also taken as Megatron-FSDP's mean unit, decoder layers
    being alike); ``largest_module``: DeepSpeed's ``largest_layer_params`` (largest single module);
    ``dp_shard``: ranks the states are sharded over; ``elem_bytes``: the 16-bit dtype's 2 bytes, 4 under fp32
    training (every "16-bit" buffer below is then fp32)."""

    zero_stage: int
    stage_params: float
    largest_layer: float
    largest_module: float
    dp_shard: int
    #: bytes per element of the gathered parameters and of the gradient buckets: 2 (16-bit), 4 in fp32 training
    elem_bytes: int = BYTES_16BIT
    #: the final norm + output layer's parameters on this GPU (last pipeline stage; 0 elsewhere)
    output_layer: float = 0.0


def _empty() -> Buffers:
    return {ph: {} for ph in PHASE_NAMES}


def megatron_buffers(b: BufferInputs) -> Buffers:
    """Megatron-LM's data-parallel buffers.

    * DDP and the distributed optimizer (``zero_stage`` 0 / 1): none beyond the model states. The gradient buffer
      ``_ParamAndGradBuffer.grad_data`` (and the parameter buffer ``param_data``) are allocated once and every bucket
      is a view of them; the distributed optimizer reduce-scatters each bucket into its own shard of that buffer and
      all-gathers parameters into ``param_data`` in place (``param_and_grad_buffer.py`` ``_ParamAndGradBuffer.__init__``,
      ``_ParamAndGradBucketGroup.start_grad_sync`` / ``start_param_sync``). Counted: nothing.
    * Megatron-FSDP ``optim_grads`` (``zero_stage`` 2): the gradient buffer is sharded, so each FSDP unit's
      (transformer layer's) gradients are fetched into an unsharded temporary bucket in every backward
      (``grad_reduce_every_bprop``) and reduce-scattered asynchronously; ``GradReducePipeline`` keeps reduce-scatters
      in flight until their unsharded buckets exceed ``suggested_RS_queue_capacity`` elements
      (``wait_for_previous_grad_reduce``), plus the bucket being reduced and the one being accumulated:
      ``2 * min(P_stage, 1e9 + 2 * layer)`` in backward.
    * ``optim_grads_params`` (``zero_stage`` 3): also the unsharded 16-bit parameters of the running unit and the
      prefetched ones, up to ``suggested_AG_prefetch_size`` (= half the unit size, 5e8) elements beyond the current
      unit (``AllGatherPipeline.all_gather_params``: prefetch while the prefetched size is below the limit, so at most
      one unit past it): ``2 * min(P_stage, 2 * layer + 5e8)`` in forward and backward.

    The unsharded buckets are in the gradient-communication dtype, which defaults to the main-gradient dtype, which
    defaults to the parameters' (``--megatron-fsdp-grad-comm-dtype auto``, ``--megatron-fsdp-main-grads-dtype auto``:
    ``ParamAndGradBuffer._resolve_group_grad_dtype`` returns ``group.dtype``): 16-bit. (The persistent sharded main
    gradients are still counted at the model's 4 bytes in ``model_state_terms``, the conservative side.)
    """
    out = _empty()
    p, layer = b.stage_params, b.largest_layer
    if b.zero_stage < 2 or b.dp_shard <= 1:
        return out
    unit = max(MEGATRON_FSDP_COMM_UNIT_ELEMENTS, 2 * layer) if b.zero_stage >= 3 else \
        MEGATRON_FSDP_COMM_UNIT_ELEMENTS
    rs_queue = b.elem_bytes * min(p, unit + 2 * layer)
    out["backward"]["fsdp_grad_reduce_queue"] = rs_queue
    if b.zero_stage >= 3:
        gathered = b.elem_bytes * min(p, 2 * layer + unit / 2)
        out["forward"]["fsdp_param_gather"] = gathered
        out["backward"]["fsdp_param_gather"] = gathered
    return out


def deepspeed_buffers(b: BufferInputs) -> Buffers:
    """DeepSpeed ZeRO buffers (0.19.8 defaults).

    * ZeRO-1/2: the contiguous-gradient IPG bucket, ``reduce_bucket_size`` (5e8) elements of the 16-bit gradient
      dtype, allocated at the start of every backward (``DeepSpeedZeroOptimizer.setup_buckets``: ``buf_0``), and a
      second one, ``buf_1``, with ``overlap_comm``, which DeepSpeed leaves off below stage 3 (``overlap_comm_valid``)
      but plan3d's ds_config turns on (``planner/emit/deepspeed.py``): two buckets in backward. One bucket is counted
      in the optimizer step, as the F02 measurement implies (field_cases.md F02: 28.28 GiB held at the step = states
      + one bucket within 2%). The post-step parameter all-gather (``allgather_bucket_size``) writes into the
      16-bit partitions in place (``all_gather_dp_groups``).
    * ZeRO-3: the estimator's gather buffer ``4 * largest_layer`` (16-bit parameters + gradients of the largest
      module; ``estimate_zero3_model_states_mem_needs``), the prefetch bucket ``stage3_prefetch_bucket_size`` (5e7)
      16-bit elements in forward and backward (``PartitionedParameterCoordinator``), and the IPG reduce bucket,
      ``reduce_bucket_size`` elements of the 16-bit dtype allocated once at init and kept (``DeepSpeedZeroOptimizer_
      Stage3.__init__``: ``bucket.buffer = torch.empty(self.reduce_bucket_size, ...)``).
    * ZeRO-3 parameters kept gathered for reuse: after a module runs, its parameters are not released if the trace
      shows them used again within ``stage3_max_reuse_distance`` (1e9) parameters (``partitioned_param_coordinator
      .py`` ``__params_to_release``). At the end of forward the last modules' parameters come back first in
      backward, after about twice the parameters that follow them, so the last ``max_reuse_distance / 2`` of the
      stage's parameters stay gathered from their forward to their backward: ``2 * min(P_stage, 5e8)`` in forward
      (at its end) and in backward (at its start). (``stage3_max_live_parameters`` bounds only the prefetch:
      ``max_params_to_prefetch = min(max_available - n_available, prefetch_bucket)``.)
    """
    out = _empty()
    p = b.stage_params
    if b.zero_stage in (1, 2) and b.dp_shard > 1:
        bucket = b.elem_bytes * min(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, p)
        out["backward"]["zero_reduce_bucket"] = DEEPSPEED_IPG_BUFFERS * bucket
        out["optimizer"]["zero_reduce_bucket"] = bucket
    elif b.zero_stage >= 3:
        gather = 2 * b.elem_bytes * b.largest_module
        prefetch = b.elem_bytes * min(DEEPSPEED_PREFETCH_BUCKET_ELEMENTS, p)
        ipg = b.elem_bytes * min(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, p)
        retained = b.elem_bytes * min(p, DEEPSPEED_MAX_REUSE_DISTANCE_ELEMENTS / 2)
        for ph in ("forward", "backward"):
            out[ph]["zero3_gather"] = gather
            out[ph]["zero3_prefetch_bucket"] = prefetch
            out[ph]["zero3_reuse_retained"] = retained
        for ph in PHASE_NAMES:
            out[ph]["zero3_reduce_bucket"] = ipg
    return out


def torchtitan_buffers(b: BufferInputs, pp: int) -> Buffers:
    """torch FSDP2 buffers as torchtitan applies it (``zero_stage`` 3; 0 = DDP/replicate: none counted).

    * No PP: every transformer block is an FSDP unit resharded after forward (torchtitan ``fsdp.py``
      ``get_fsdp_reshard_after_forward_policy``: ``default`` = ``not pp_enabled``). Forward holds the running block's
      unsharded 16-bit parameters and the next one's, all-gathered ahead by FSDP2's implicit prefetch
      (``2 * 2 * block``); backward adds the block's 16-bit unsharded gradients and their fp32 copy for the
      reduce-scatter (``reduce_dtype`` fp32: ``foreach_reduce`` copies into a ``reduce_dtype`` input,
      ``(2 + 4) * block``). The final norm and output layer are one more unit (``apply_fsdp``:
      ``fully_shard([model.norm, model.lm_head], reshard_after_forward=policy == "always")``: under the default
      policy it is not even resharded after forward, "since FSDP would prefetch them immediately"), the first to run
      backward: while its weight gradient is computed, with the loss's logits buffers still alive, it holds its
      unsharded 16-bit weights and 16-bit gradients and the last block is prefetched, ``(2 + 2) * head + 2 * block``
      (the fp32 reduce copy comes in the post-backward hook, once autograd has freed the logits' gradient); in
      forward, its weights (``2 * head``) once the last block is freed. With a vocabulary of 128k that unit is 2.4x
      a Llama-3.1-8B block, so the head, not a block, sets the backward buffers of the last stage.
    * PP: no resharding after forward, so the stage's 16-bit parameters stay gathered (``2 * P_stage``), and with
      gradient sync off between micro-batches (``torch/distributed/pipelining/stage.py``
      ``_backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``) the unsharded gradients accumulate in
      the fp32 reduce dtype (``_fsdp_param.py`` ``to_accumulated_grad_if_needed``): ``4 * P_stage`` more in
      backward. plan3d's torchtitan launch sets ``fsdp_reshard_after_forward = "always"`` for ZeRO-3
      (``planner/emit/torchtitan.py``, as the step time charges the gathers): a forward then frees the stage's
      parameters, but the pipeline stage also turns resharding after backward off for all but the last micro-batch
      (``set_reshard_after_backward(False)`` next to the gradient sync), so they are gathered again through every
      backward and the backward peak, the stage's peak, is the one counted here.
    """
    out = _empty()
    if b.zero_stage < 3:
        return out
    if pp > 1:
        out["forward"]["fsdp_unsharded_params"] = b.elem_bytes * b.stage_params
        out["backward"]["fsdp_unsharded_params"] = b.elem_bytes * b.stage_params
        out["backward"]["fsdp_accumulated_grads"] = BYTES_FP32 * b.stage_params
        return out
    # the fp32 reduce copy is the gradient itself in fp32 training
    grad = b.elem_bytes + (BYTES_FP32 if b.elem_bytes != BYTES_FP32 else 0)
    layer, head = b.largest_layer, b.output_layer
    if head and b.elem_bytes * (2 * head + layer) > (2 * b.elem_bytes + grad) * layer:
        # the output layer's unit binds (docstring): weights + gradients at its backward, its weights in forward
        out["forward"]["fsdp_param_gather"] = b.elem_bytes * max(2 * layer, head)
        out["backward"]["fsdp_param_gather"] = b.elem_bytes * (head + layer)
        out["backward"]["fsdp_unsharded_grads"] = b.elem_bytes * head
        return out
    gathered = 2 * b.elem_bytes * layer
    out["forward"]["fsdp_param_gather"] = gathered
    out["backward"]["fsdp_param_gather"] = gathered
    out["backward"]["fsdp_reduce_scatter"] = grad * layer
    return out


def pipeline_p2p_buffers(framework: str, stage: int, pp: int, vpp: int, num_microbatches: int,
                         in_flight_chunks: float, stage_input_bytes: float) -> Buffers:
    """Pipeline send/receive buffers of one stage (``stage_input_bytes`` = one micro-batch's hidden states).

    * torchtitan (``torch.distributed.pipelining``): ``PipelineStage._setup_forward_recv_info`` allocates one
      receive buffer per micro-batch for every non-first stage, and ``_setup_backward_recv_info`` one gradient
      receive buffer per micro-batch for every non-last stage, each the size of the stage input, kept for the whole
      step (``_make_tensor_from_meta`` at setup); with ``vpp`` local stages per rank, each has its own. The forward
      buffers of the micro-batches in flight are the stored stage inputs already counted in the activations, so
      ``max(0, m*v - in_flight)`` forward buffers and ``m*v`` gradient buffers are added. A non-last stage also
      keeps each in-flight micro-batch's stage output for its backward (``forward_one_chunk``:
      ``self.fwd_cache[fwd_chunk_id] = (output_tuple, ...)``), which Megatron frees once sent
      (``deallocate_output_tensor``): ``in_flight`` more stage inputs.
    * Megatron-LM / DeepSpeed: each receive allocates a fresh tensor (``p2p_communication._communicate``:
      ``torch.empty`` of ``tensor_shape``; DeepSpeed ``PipelineEngine`` keeps one ``pipe_recv_buf`` and one
      ``grad_layer``), which becomes the stored input; only the gradient in flight of a non-last stage is extra,
      one stage input in backward.
    """
    out = _empty()
    if pp <= 1:
        return out
    first, last = stage == 0, stage == pp - 1
    if framework == "torchtitan":
        buffers = num_microbatches * vpp
        if not first:
            out["forward"]["pp_recv_buffers"] = max(0.0, buffers - in_flight_chunks) * stage_input_bytes
            out["backward"]["pp_recv_buffers"] = out["forward"]["pp_recv_buffers"]
        if not last:
            for ph in ("forward", "backward"):
                out[ph]["pp_grad_recv_buffers"] = buffers * stage_input_bytes
                out[ph]["pp_retained_outputs"] = in_flight_chunks * stage_input_bytes
    elif not last:
        out["backward"]["pp_grad_recv"] = stage_input_bytes
    return out


def merge(*parts: Buffers) -> Buffers:
    """Sum several ``{phase: {name: bytes}}`` maps name by name."""
    out = _empty()
    for part in parts:
        for ph, terms in part.items():
            for k, v in terms.items():
                out[ph][k] = out[ph].get(k, 0.0) + v
    return out


def backend_buffers(framework: str, b: BufferInputs, pp: int) -> Buffers:
    """The data-parallel buffers of ``framework`` (megatron | deepspeed | torchtitan) for ``b``."""
    if framework == "deepspeed":
        return deepspeed_buffers(b)
    if framework == "torchtitan":
        return torchtitan_buffers(b, pp)
    return megatron_buffers(b)


def moe_dispatch_buffers(routed_token_copies: float, hidden_size: int, ep: int,
                         elem_bytes: int = BYTES_16BIT) -> Buffers:
    """Expert-parallel all-to-all buffers of the running MoE layer (``routed_token_copies`` = token copies the
    busiest rank receives, ``tokens x top_k x`` its share over the balanced one: dropless imbalance or a padded
    capacity, ``cost_models.activations.expert_buffer_factor``).

    With ``ep > 1`` the dispatch sends the permuted token copies and receives the other ranks' copies for its own
    experts: Megatron-LM ``MoEAlltoAllTokenDispatcher`` (``token_dispatcher.py``: ``dispatch_preprocess`` permutes,
    ``token_dispatch`` ``all_to_all`` into ``global_input_tokens``, ``dispatch_postprocess`` ``sort_chunks_by_idxs``
    when a rank holds several experts); torchtitan ``ExpertParallel._token_dispatch`` (``all_to_all_single_autograd``).
    Only the sorted receive buffer is kept for the expert GEMM (stored activations); during the exchange one more
    copy of the routed tokens is alive (the send buffer, then the unsorted receive buffer), and the combine's backward
    exchanges the gradients the same way: ``elem_bytes * copies * h`` bytes (16-bit, or 4 in fp32 training) in
    forward and in backward. With
    ``ep == 1`` the all-to-all returns its input (no copy). The receive side is the larger one on the busiest rank
    (it sends its balanced ``tokens x top_k`` and receives more), so the copy is counted at the received size.
    """
    out = _empty()
    if ep <= 1:
        return out
    copy = elem_bytes * routed_token_copies * hidden_size
    out["forward"]["ep_all_to_all"] = copy
    out["backward"]["ep_all_to_all"] = copy
    return out
