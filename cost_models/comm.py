"""Time of collectives on a group whose ranks sit in known places (alpha-beta model).

Ring costs per rank (formulas.md Sec. 6; NCCL's bus-bandwidth convention, nccl-tests ``doc/PERFORMANCE.md``):
all-reduce ``2(n-1)/n * S``, reduce-scatter and all-gather ``(n-1)/n * S`` (S = full, un-sharded bytes),
all-to-all ``(n-1)/n * S``. Latency ``(n-1)`` steps of ``alpha`` for RS/AG, ``2(n-1)`` for all-reduce.

A group that spans NVLink domains runs hierarchically (NCCL's intra-node/inter-node split): reduce-scatter
inside the domain on NVLink, the cross-domain collective on ``S/r`` bytes over each GPU's own NIC
(rail-optimised fabric, every GPU has a NIC), then all-gather inside the domain. Achievable bandwidth is the
link rate times the cluster's calibrated bus efficiency (measured NCCL busbw over line rate). Inside an NVLink
domain with NVLink SHARP (``node.nvls``) all-reduce runs in the switch at the measured NVLS bus bandwidth.
"""
from __future__ import annotations

from typing import Literal

from cluster_specs.spec import ClusterSpec

from .layout import GroupPlacement

#: NVLS all-reduce bus bandwidth over the NVLink per-direction line rate: 480 / 450 on 8x H100 (hardware.yaml
#: measured.intra_node_all_reduce_busbw_gb_s.H100_8gpu_NVLink4_NVLS expected_peak 480, measured 476); the same
#: ratio is assumed for the NVLink 5 switches of B200/GB200 (no measurement in hardware.yaml).
NVLS_BUSBW_OVER_LINE_RATE = 480 / 450

Collective = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "p2p"]


def _bw(cluster: ClusterSpec) -> tuple[float, float]:
    cal = cluster.calibration
    return (cluster.node.nvlink_bandwidth_bytes_per_s * cal.nvlink_bus_efficiency,
            cluster.network.nic_bandwidth_bytes_per_s * cal.network_bus_efficiency)


def _ring(kind: str, n: int, size: float, bw: float, alpha: float) -> float:
    if n <= 1 or size <= 0:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw
    return (n - 1) * alpha + (n - 1) / n * size / bw


def collective_time(kind: Collective, size_bytes: float, group: GroupPlacement, cluster: ClusterSpec) -> float:
    """Seconds for one collective of ``size_bytes`` (the full, un-sharded payload) on ``group``.

    For ``p2p`` ``size_bytes`` is the message sent to one neighbour; ``group.intra_domain`` says whether it
    stays on NVLink.
    """
    nvl_bw, net_bw = _bw(cluster)
    a_nvl, a_net = cluster.network.nvlink_latency_s, cluster.network.latency_s
    n, r = group.size, group.ranks_per_domain
    if kind == "p2p":
        if group.intra_domain:
            return a_nvl + size_bytes / nvl_bw
        return a_net + size_bytes / net_bw
    if n <= 1:
        return 0.0
    if group.intra_domain:
        if kind == "all_reduce" and cluster.node.nvls and n > 2:
            # NVLink SHARP: the switch reduces, busbw ~480 GB/s on 8x H100 vs 370 for rings (hardware.yaml
            # measured.intra_node_all_reduce_busbw_gb_s H100_8gpu_NVLink4_NVLS; sjeaugey, nccl-tests issue 212)
            return 2 * (n - 1) * a_nvl + 2 * (n - 1) / n * size_bytes / (
                cluster.node.nvlink_bandwidth_bytes_per_s * NVLS_BUSBW_OVER_LINE_RATE)
        return _ring(kind, n, size_bytes, nvl_bw, a_nvl)
    domains = group.num_domains
    if kind == "all_to_all":
        # each rank sends (n-1)/n of its data; the share to other domains crosses the NIC
        intra = size_bytes * (r - 1) / n / nvl_bw
        inter = size_bytes * (n - r) / n / net_bw
        return max(intra, inter) + (domains - 1) * a_net + (r - 1) * a_nvl
    # hierarchical: intra-domain part on NVLink, inter-domain part on S/r bytes over the NICs
    inner = _ring("reduce_scatter" if kind != "all_gather" else "all_gather", r, size_bytes, nvl_bw, a_nvl)
    if kind == "all_reduce":
        inner *= 2  # reduce-scatter before, all-gather after
    outer = _ring(kind, domains, size_bytes / r, net_bw, a_net)
    return inner + outer
