"""Time of collectives on a group whose ranks sit in known places (alpha-beta model).

Ring costs per rank (formulas.md Sec. 6; NCCL's bus-bandwidth convention, nccl-tests ``doc/PERFORMANCE.md``):
all-reduce ``2(n-1)/n * S``, reduce-scatter and all-gather ``(n-1)/n * S`` (S = full, un-sharded bytes),
all-to-all ``(n-1)/n * S``. Latency ``(n-1)`` steps of ``alpha`` for RS/AG, ``2(n-1)`` for all-reduce.

A group that spans NVLink domains runs as NCCL runs it, NVLink and network hops pipelined (``multi_domain_time``):
a ring at the slower of NVLink and the ``r`` NICs of the group's ``r`` GPUs per domain (rail-optimised fabric,
every GPU has a NIC), or for all-reduce a tree (NCCL's double binary tree / NVLSTree) when that is faster (2 domains,
latency-bound sizes). Achievable bandwidth is the link rate times the cluster's calibrated bus efficiency (measured
NCCL busbw over line rate), so a slow network (RoCE, Omni-Path, 100-200 Gb/s per GPU) costs its own line rate and
efficiency. Inside an NVLink domain with NVLink SHARP (``node.nvls``) all-reduce runs in the switch at the measured
NVLS bus bandwidth. Checked against nccl-tests figures in ``tests/test_slow_networks.py``.
"""
from __future__ import annotations

import math
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
    nvls_bw = cluster.node.nvlink_bandwidth_bytes_per_s * NVLS_BUSBW_OVER_LINE_RATE if cluster.node.nvls else None
    return multi_domain_time(kind, n, r, size_bytes, nvl_bw, net_bw, a_nvl, a_net, nvls_bw)


def multi_domain_time(kind: Collective, n: int, r: int, size_bytes: float, nvl_bw: float, net_bw: float,
                      a_nvl: float, a_net: float, nvls_bw: float | None = None) -> float:
    """Seconds of an all-reduce, reduce-scatter or all-gather of ``size_bytes`` over ``n`` ranks, ``r`` per NVLink
    domain (``n / r`` domains, > 1), at achievable NVLink bandwidth ``nvl_bw`` and NIC bandwidth ``net_bw`` per GPU
    (bytes/s per direction); ``nvls_bw``: the NVLink SHARP all-reduce bus bandwidth, None without NVLS.

    As NCCL runs them (``src/graph/tuning.cc`` models the same two algorithms), transfers on NVLink and on the
    network are pipelined, not one after the other:

    * **ring** (every collective): each rank moves ``f (n-1)/n S`` (``f`` = 2 for all-reduce, 1 for reduce-scatter /
      all-gather) at the ring's bus bandwidth, the slower of NVLink and the ``r`` NICs its ``r`` GPUs in a domain
      drive (rail-optimised fabric, one NIC per GPU): ``min(nvl_bw, r net_bw)``; multi-node DGX A100 rings reach
      8 x 24 = 192 GB/s busbw (AddyLaddy, NVIDIA, nccl issue 812), not the NVLink+network sum. Latency: ``f (n-1)``
      steps, ``f (D-1)`` of them on the network (tuning.cc ``nInterSteps``).
    * **tree** (all-reduce only; NCCL's double binary tree, or NVLSTree on Hopper): the intra-domain reduce/broadcast
      (NVLS where the switch reduces) runs under the inter-domain tree. Per domain the NICs carry ``S`` per direction
      on 2 domains (each tree is one edge) and ``2S`` beyond (interior nodes of one tree: ``1.5 S``, leaves of the
      other: ``S/2``), over ``r`` NICs. This is why 2-node all-reduce busbw exceeds the NIC rate (nccl-tests
      ``doc/PERFORMANCE.md``; hardware.yaml measured.nccl_conventions.two_node_caveat). Latency
      ``2((r-1) a_nvl + log2(D) a_net)`` (tuning.cc tree latency).

    NCCL picks the faster; so does this model.
    """
    domains = math.ceil(n / r)
    f = 2 if kind == "all_reduce" else 1
    ring_bw = min(nvl_bw, r * net_bw) if r > 1 else net_bw
    ring = f * (n - 1) / n * size_bytes / ring_bw + f * ((domains - 1) * a_net + (n - domains) * a_nvl)
    if kind != "all_reduce":
        return ring
    if r > 1:
        intra_bw = nvls_bw if nvls_bw is not None and r > 2 else nvl_bw
        intra = 2 * (r - 1) / r * size_bytes / intra_bw
    else:
        intra = 0.0
    inter = (1 if domains == 2 else 2) * size_bytes / (r * net_bw)
    tree = max(intra, inter) + 2 * ((r - 1) * a_nvl + math.ceil(math.log2(domains)) * a_net)
    return min(ring, tree)
