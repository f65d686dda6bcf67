"""Collective times (alpha-beta, NCCL bus-bandwidth convention) on real topologies."""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.comm import collective_time
from cost_models.config import ParallelConfig
from cost_models.layout import GroupPlacement, group_placement

H100 = get_cluster("dgx-h100")
GB = 1e9


def test_intra_node_collectives_run_at_measured_busbw():
    # 8x H100: all-reduce with NVLS ~480 GB/s busbw, ring collectives ~370 GB/s (hardware.yaml, nccl-tests 212/290)
    t = collective_time("all_reduce", 8 * GB, GroupPlacement(8, 8), H100)
    assert 2 * 7 / 8 * 8 * GB / t == pytest.approx(480e9, rel=0.01)
    t = collective_time("reduce_scatter", 8 * GB, GroupPlacement(8, 8), H100)
    assert 7 / 8 * 8 * GB / t == pytest.approx(370e9, rel=0.01)
    # A100 has no NVLS: ring all-reduce at 230 GB/s (sjeaugey, nccl-tests issue 149)
    a100 = get_cluster("dgx-a100-80g")
    t = collective_time("all_reduce", 8 * GB, GroupPlacement(8, 8), a100)
    assert 2 * 7 / 8 * 8 * GB / t == pytest.approx(230e9, rel=0.02)


def test_reduce_scatter_is_half_a_ring_all_reduce():
    a100 = get_cluster("dgx-a100-80g")  # no NVLS: all-reduce is a ring (reduce-scatter + all-gather)
    g = GroupPlacement(8, 8)
    ar = collective_time("all_reduce", 4 * GB, g, a100)
    rs = collective_time("reduce_scatter", 4 * GB, g, a100)
    ag = collective_time("all_gather", 4 * GB, g, a100)
    assert rs == pytest.approx(ag) and ar == pytest.approx(2 * rs, rel=1e-6)


def test_cross_node_all_reduce_is_bound_by_the_nic():
    # 2 nodes x 8 GPUs, 1 GPU per node in the group (tp=8 fills the node): pure network ring at 47 GB/s busbw
    # (NDR 400G, nccl-tests issue 290)
    t = collective_time("all_reduce", 8 * GB, GroupPlacement(2, 1), H100)
    assert 2 * 1 / 2 * 8 * GB / t == pytest.approx(47e9, rel=0.01)


def test_multi_node_collectives_pipeline_nvlink_and_network():
    # 16 ranks, 8 per node. NCCL pipelines the NVLink and network hops (ring, or tree for all-reduce), so the time
    # is bound by the slower of NVLink and the node's 8 NICs, not their sum (cost_models.comm.multi_domain_time)
    s = 8 * GB
    ring_bw = min(450e9 * 0.8222, 8 * 50e9 * 0.94)  # NVLink ring busbw vs 8 NICs
    rs = collective_time("reduce_scatter", s, GroupPlacement(16, 8), H100)
    assert 15 / 16 * s / rs == pytest.approx(ring_bw, rel=0.01)
    # 2 nodes: the all-reduce tree moves S per node per direction over the NICs, under the NVLS intra-node part:
    # busbw above the NIC rate (nccl-tests doc/PERFORMANCE.md: use NCCL_ALGO=RING to measure the network)
    ar = collective_time("all_reduce", s, GroupPlacement(16, 8), H100)
    assert 2 * 15 / 16 * s / ar > 8 * 50e9 * 0.94
    assert ar == pytest.approx(max(2 * 7 / 8 * s / (450e9 * 480 / 450), s / (8 * 47e9)), rel=0.01)
    assert ar < collective_time("all_reduce", s, GroupPlacement(16, 1), H100)


def test_megatron_rank_order_places_groups():
    # tp innermost: tp=8 fills a DGX node, so each dp group has one rank per node
    par = ParallelConfig(tp=8, pp=2, dp=4)
    assert group_placement("tp", par, 8) == GroupPlacement(8, 8)
    assert group_placement("dp", par, 8).ranks_per_domain == 1
    # on an NVL72 domain the same dp group stays on NVLink
    assert group_placement("dp", par, 72).intra_domain


def test_p2p_and_empty_groups():
    assert collective_time("all_reduce", GB, GroupPlacement(1, 1), H100) == 0.0
    intra = collective_time("p2p", GB, GroupPlacement(2, 2), H100)
    inter = collective_time("p2p", GB, GroupPlacement(2, 1), H100)
    assert intra < inter
    assert inter == pytest.approx(H100.network.latency_s + GB / (50e9 * 0.94))
