"""Step time of the optimizer when (part of) it lives in host memory: gradient copies, CPU Adam, parameter copies.

The GPU side of the optimizer step is the memory-bound fused Adam (``step_time.ADAM_HBM_BYTES_PER_PARAM`` per
local parameter at the HBM bandwidth) over the share that stays on the GPU. The offloaded share ``f`` of the local
optimizer partition ``P`` (parameters this rank updates) costs, per framework, as their sources run it:

* **Megatron-LM** ``--optimizer-cpu-offload --optimizer-offload-fraction f`` (``megatron/core/optimizer/
  cpu_offloading/hybrid_optimizer.py`` ``HybridDeviceOptimizer``, commit d98e8a6): at ``step()`` the offloaded
  parameters' main gradients are copied to pinned host buffers (``_set_sub_optimizer_grads``: the gradient in its
  own dtype, fp32 main gradients, 16-bit with ``--grad-reduce-in-bf16``), ``torch.optim.AdamW(fused=True)`` steps
  their fp32 host copies (``param_update_in_fp32=True``), and a post-step hook copies each fp32 host parameter back
  into the GPU parameter (``param_copy_back_gpu_hook``: the fp32 copy crosses the link, the cast happens on the
  GPU). The GPU optimizer steps the rest at the same time. plan3d emits ``--overlap-cpu-optimizer-d2h-h2d``, which
  builds one CPU optimizer per parameter and runs the copies on their own streams, so the three stages pipeline
  over the parameters: the offloaded share takes ``max(d2h, cpu, h2d)``, and the step ``max(GPU share, that)``.
* **DeepSpeed** ZeRO-Offload (``offload_optimizer: {device: cpu}``, ZeRO 1-3; Ren et al., USENIX ATC 2021,
  Sec. 4.1: "4M" bytes of traffic per step, 16-bit gradients to the host and 16-bit parameters back): in every
  micro-batch's backward each rank's reduced 16-bit gradient partition is copied into the host's fp32 gradient
  buffer (``stage_1_and_2.py`` ``async_accumulate_grad_in_cpu_via_gpu``; ZeRO-3 the same), overlapped with that
  backward (``overlap_comm``); then ``DeepSpeedCPUAdam.step`` updates the fp32 master weights and moments on the
  host and writes the 16-bit copy (``step_plus_copy``), which is copied to the GPU before the parameter
  all-gather. Neither the CPU step nor the copy back overlaps GPU work (delayed parameter update is off by default).

CPU Adam is memory-bandwidth bound (AVX-512 / fused loops over fp32 arrays; Ren et al. Sec. 5.1): per parameter it
reads the fp32 parameter, gradient and both moments and writes the parameter and moments back,
``CPU_ADAM_HOST_BYTES_PER_PARAM`` (28; DeepSpeed also writes the 16-bit copy, 30), at the node's host DRAM bandwidth
shared by its GPUs (``ClusterSpec.host_memory_bandwidth_per_gpu``: the channels' peak, so the time is a lower
bound). Clusters without that figure use ``DEFAULT_HOST_MEMORY_BANDWIDTH_PER_GPU``. Copies use the host link
(``ClusterSpec.host_link_bytes_per_s``, per GPU per direction).
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec

from .config import BYTES_16BIT, BYTES_FP32

#: Host DRAM bytes per parameter of one CPU Adam step: read fp32 parameter, gradient, exp_avg, exp_avg_sq (16),
#: write parameter, exp_avg, exp_avg_sq (12); DeepSpeedCPUAdam's ``step_plus_copy`` also writes the 16-bit
#: parameter copy (2). Derived from the optimizer's state layout (ZeRO paper Sec. 3.1).
CPU_ADAM_HOST_BYTES_PER_PARAM = {"megatron": 28, "deepspeed": 30}
#: Host DRAM bandwidth per GPU when the cluster file gives none: DGX A100's 2 x 204.8 GB/s (AMD EPYC 7742, 8 x
#: DDR4-3200 channels per socket) over 8 GPUs, the least of the built-in clusters (a conservative default).
DEFAULT_HOST_MEMORY_BANDWIDTH_PER_GPU = 51.2e9
#: Host-link bytes per offloaded parameter each way, by framework (module docstring): (gradient to the host,
#: parameter back). Megatron's gradient term is the main-gradient dtype (4, or 2 under --grad-reduce-in-bf16).
COPY_BYTES_PER_PARAM = {"megatron": (BYTES_FP32, BYTES_FP32), "deepspeed": (BYTES_16BIT, BYTES_16BIT)}


@dataclass(frozen=True)
class OffloadedStep:
    """Seconds of one optimizer step with a share in host memory: the GPU share's Adam, the host-link copies of
    the offloaded share (``d2h_s``: gradients, all micro-batches together for DeepSpeed; ``h2d_s``: parameters),
    the CPU Adam, and ``exposed_s``, what the step adds to the iteration (module docstring)."""

    gpu_s: float
    d2h_s: float
    cpu_s: float
    h2d_s: float
    exposed_s: float


def _host_bandwidths(cluster: ClusterSpec) -> tuple[float, float]:
    link = cluster.host_link_bytes_per_s
    if not link:
        raise ValueError(f"cluster {cluster.name!r}: optimizer offload needs the host link bandwidth "
                         f"(operations.storage.host_link_bytes_per_s)")
    return link, cluster.host_memory_bandwidth_per_gpu or DEFAULT_HOST_MEMORY_BANDWIDTH_PER_GPU


def offloaded_optimizer_step(cluster: ClusterSpec, framework: str, local_params: float, offload_fraction: float,
                             gpu_adam_s: float, *, grad_bytes: float = BYTES_FP32, num_microbatches: int = 1,
                             backward_s: float = 0.0) -> OffloadedStep:
    """The optimizer step of ``local_params`` parameters (this rank's partition) with ``offload_fraction`` of them
    in host memory; ``gpu_adam_s`` is the GPU Adam time of the whole partition. Megatron: ``grad_bytes`` per
    gradient copied (4, or 2 with 16-bit main gradients). DeepSpeed: the gradient copy runs in each of the
    ``num_microbatches`` backwards, under its ``backward_s`` of compute. Frameworks other than megatron and deepspeed
    (torchtitan) have no optimizer offload: ``ValueError``.

    Raises:
        ValueError: offload requested on a cluster without a host link figure, or for another framework.
    """
    f = min(1.0, max(0.0, offload_fraction))
    gpu = gpu_adam_s * (1.0 - f)
    if f == 0.0:
        return OffloadedStep(gpu, 0.0, 0.0, 0.0, gpu)
    fw = framework.split("_")[0]
    if fw == "nemo":
        fw = "megatron"
    if fw not in CPU_ADAM_HOST_BYTES_PER_PARAM:
        raise ValueError(f"framework {framework!r} has no optimizer CPU offload (megatron, deepspeed)")
    link, host_bw = _host_bandwidths(cluster)
    p = local_params * f
    to_host, to_gpu = COPY_BYTES_PER_PARAM[fw]
    if fw == "megatron":
        to_host = grad_bytes
    cpu = CPU_ADAM_HOST_BYTES_PER_PARAM[fw] * p / host_bw
    h2d = to_gpu * p / link
    if fw == "megatron":
        d2h = to_host * p / link
        return OffloadedStep(gpu, d2h, cpu, h2d, max(gpu, d2h, cpu, h2d))
    m = max(1, num_microbatches)
    per_mb = to_host * p / link
    exposed_copies = m * max(0.0, per_mb - backward_s)
    return OffloadedStep(gpu, m * per_mb, cpu, h2d, gpu + exposed_copies + cpu + h2d)
