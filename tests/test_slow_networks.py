"""Slow networks: the collective model (``cost_models.comm``) against published NCCL measurements, and what a RoCE
cluster at 100-200 Gb/s per GPU costs for TP and PP across nodes and DP at scale (issue 9 item 7).

Bus bandwidth follows nccl-tests ``doc/PERFORMANCE.md``: all-reduce busbw = ``2 (n-1)/n x S / t``, reduce-scatter and
all-gather ``(n-1)/n x S / t``. Each measured figure names its source; where the model misses a measurement the miss
is recorded with its cause (``KNOWN``) and held to it, as ``tests/test_memory_published.py`` does.
"""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.comm import collective_time
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import GroupPlacement
from cost_models.step_time import estimate_step
from model_zoo import get_model

GB = 1e9


def all_reduce_busbw(cluster, n: int, per_node: int, size: float = 8 * GB) -> float:
    """Predicted nccl-tests all-reduce busbw (bytes/s) of ``n`` ranks, ``per_node`` per node."""
    t = collective_time("all_reduce", size, GroupPlacement(n, per_node), cluster)
    return 2 * (n - 1) / n * size / t


def with_network(name: str, new_name: str, nic_bytes_per_s: float, bus_efficiency: float):
    """A built-in cluster with another scale-out network (the GPUs, NVLink and the rest unchanged)."""
    c = get_cluster(name)
    return c.model_copy(update={
        "name": new_name,
        "network": c.network.model_copy(update={"nic_bandwidth_bytes_per_s": nic_bytes_per_s}),
        "calibration": c.calibration.model_copy(update={"network_bus_efficiency": bus_efficiency})})


# ------------------------------------------------------------------------- InfiniBand reference points

def test_dgx_a100_multi_node_ring_runs_at_eight_nics():
    # "On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW"
    # (AddyLaddy, NVIDIA, nccl issue 812, quoted in nccl issue 1576). NCCL pipelines the NVLink and network hops of
    # its rings; the old hierarchical sum (NVLink reduce-scatter + network ring + NVLink all-gather) gave 118 GB/s.
    a100 = get_cluster("dgx-a100-80g")
    for nodes in (4, 8, 32):
        assert all_reduce_busbw(a100, 8 * nodes, 8) == pytest.approx(192e9, rel=0.03)


def test_a100_with_a_nic_per_two_gpus_reaches_the_nic_target():
    # 3 nodes of 8 A100-SXM4-40GB with 4 HDR 200 Gb/s NICs each: 84.9 GB/s average, ~96 peak; sjeaugey (NVIDIA):
    # "24GB/s is the peak performance per 200G NIC ... so 96GB/s is the target" (nccl-tests issue 119)
    c = with_network("dgx-a100-40g", "a100-4nic", 4 * 25e9 / 8, 0.96)
    bw = all_reduce_busbw(c, 24, 8, size=128e6)
    assert bw == pytest.approx(96e9, rel=0.05)
    assert bw / 84.9e9 - 1 == pytest.approx(0.11, abs=0.03)  # the run's average includes its small messages


def test_h800_node_figures():
    h800 = get_cluster("dgx-h800")
    # 8x H800 all-reduce busbw 215 GB/s, above the 200 GB/s NVLink line rate: NVLink SHARP (nccl issue 1374)
    assert all_reduce_busbw(h800, 8, 8) == pytest.approx(215e9, rel=0.02)
    # DeepSeek-V3 (arXiv 2412.19437, Sec. 3.2.2): "NVLink offers a bandwidth of 160 GB/s", IB 50 GB/s per GPU
    t = collective_time("reduce_scatter", 8 * GB, GroupPlacement(8, 8), h800)
    assert 7 / 8 * 8 * GB / t == pytest.approx(160e9, rel=0.01)
    t = collective_time("p2p", 1 * GB, GroupPlacement(2, 1), h800)
    assert GB / t == pytest.approx(47e9, rel=0.01)  # 0.94 of the 50 GB/s line rate (NDR, nccl-tests issue 290)


# ------------------------------------------------------------------------- slow networks, measured

#: Measured all-reduce busbw (bytes/s) on slow networks and the model's recorded error on each (predicted /
#: measured - 1) with the reason it misses. Held to +-3 points.
KNOWN = {
    # nccl-tests issue 169: A100 nodes with 8 x 100 Gb/s RoCE NICs on PCIe, all_reduce_perf 1-8 GB. The cluster's
    # 0.70 bus efficiency is this 3-node figure; 4-6 nodes lose more as the RoCE fabric congests (flow collisions,
    # no adaptive routing), which the model does not see.
    ("roce-8x100g", 3): (70e9, 0.00),
    ("roce-8x100g", 4): (58e9, +0.21),
    ("roce-8x100g", 6): (40e9, +0.75),
    # BigScience experiments/bandwidth/n4_a100_all_reduce_bench.txt, Jean Zay: 16 ranks, 4 per node, 4 GB fp32,
    # 39.87 Gb/s busbw. NCCL 2.10 put both channels on one Omni-Path port; the model gives 4 GPUs their 2 ports.
    ("jean-zay-a100", 4): (39.87e9 / 8, +1.01),
}


@pytest.mark.parametrize("key", list(KNOWN), ids=lambda k: f"{k[0]}-{k[1]}nodes")
def test_slow_network_all_reduce_against_measurements(key):
    name, nodes = key
    measured, known = KNOWN[key]
    if name == "roce-8x100g":
        c = with_network("a800-roce", name, 12.5e9, 0.70)
        c = c.model_copy(update={"node": get_cluster("dgx-a100-80g").node,
                                 "calibration": c.calibration.model_copy(update={"nvlink_bus_efficiency": 0.7667})})
        bw = all_reduce_busbw(c, 8 * nodes, 8)
    else:
        bw = all_reduce_busbw(get_cluster(name), 16, 4, size=4 * GB)
    assert bw / measured - 1 == pytest.approx(known, abs=0.03), f"{name} {nodes} nodes: {bw / 1e9:.1f} GB/s"


def test_roce_cluster_is_charged_its_line_rate():
    roce, ib = get_cluster("a800-roce"), get_cluster("dgx-a100-80g")
    # 200 Gb/s RoCE per GPU at the measured RoCE efficiency: 17.5 GB/s per NIC, 8 NICs per node = 140 GB/s ring
    assert roce.effective_nic_bandwidth_bytes_per_s == pytest.approx(17.5e9)
    assert all_reduce_busbw(roce, 64, 8) == pytest.approx(140e9, rel=0.03)
    # one rank per node (TP 8 fills the node): a pure network ring at one NIC
    assert all_reduce_busbw(roce, 8, 1) == pytest.approx(17.5e9, rel=0.01)
    assert all_reduce_busbw(ib, 8, 1) == pytest.approx(24e9, rel=0.01)


# ------------------------------------------------------------------------- what it costs in a step

def _step(cluster, **par):
    """Step estimate of Llama 3.1 70B, 64 sequences of 4k tokens, on ``cluster`` with the given layout."""
    model = get_model("llama3.1-70b")
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    return estimate_step(model, cluster, job, ParallelConfig(**par))


def test_tp_across_nodes_is_charged_at_network_speed():
    roce = get_cluster("a800-roce")
    net = roce.effective_nic_bandwidth_bytes_per_s  # 17.5 GB/s per GPU
    # one TP all-reduce of a 4k x 8192 bf16 activation (64 MiB)
    s = 2 * 4096 * 8192
    inside = collective_time("all_reduce", s, GroupPlacement(8, 8), roce)
    two = collective_time("all_reduce", s, GroupPlacement(16, 8), roce)
    four = collective_time("all_reduce", s, GroupPlacement(32, 8), roce)
    # across nodes every byte of the tree crosses the node's 8 NICs (S per direction on 2 nodes, 2S beyond): the
    # A800's cut NVLink (160 GB/s ring) and 8 x 17.5 GB/s of RoCE are close, so 2 nodes cost about one node ...
    assert two >= max(inside, s / (8 * net))
    # ... and 4 nodes are network-bound
    assert four >= 2 * s / (8 * net) > inside
    # a TP group with one rank per node (TP over the slowest dimension) runs at one NIC: 10x the NVLink time
    spread = collective_time("all_reduce", s, GroupPlacement(16, 1), roce)
    assert spread == pytest.approx(2 * 15 / 16 * s / net + 2 * 15 * roce.network.latency_s, rel=1e-3)
    assert spread > 9 * inside


def test_pp_across_nodes_uses_one_nic():
    # a pipeline send goes over the sending GPU's own NIC: 25 GB/s x 0.70 on RoCE, 50 x 0.94 on NDR
    for name, bw in (("a800-roce", 17.5e9), ("dgx-h800", 47e9)):
        c = get_cluster(name)
        t = collective_time("p2p", 1 * GB, GroupPlacement(2, 1), c)
        assert t == pytest.approx(c.network.latency_s + GB / bw, rel=1e-6)


def test_dp_at_scale_costs_more_on_the_slow_network():
    # same GPUs (A100 compute), same layout: the RoCE cluster's exposed gradient reduction is the IB cluster's
    # scaled by the bandwidth ratio (24 / 17.5) when both are network-bound; compute is equal
    roce, ib = get_cluster("a800-roce"), get_cluster("dgx-a100-80g")
    par = dict(tp=8, pp=1, dp=16, sequence_parallel=True, recompute="full", zero_stage=1)
    r, i = _step(roce, **par), _step(ib, **par)
    assert r.exposed_comm_s["dp"] == pytest.approx(i.exposed_comm_s["dp"] * 24 / 17.5, rel=0.05)
    assert r.step_s > i.step_s


# ------------------------------------------------------------------------- DeepSeek-V3 on its own hardware

@pytest.mark.slow
def test_deepseek_v3_is_planned_on_the_h800s_it_used():
    # issue 13 item 5: DeepSeek-V3 (arXiv 2412.19437) pre-trained on 2,048 H800s, batch 15360 x 4096 tokens, FP8.
    # plan3d finds feasible layouts on dgx-h800 (its NVLink at 200 GB/s per direction keeps TP at 2 or less)
    from planner.search import run_search

    model, cluster = get_model("deepseek-v3"), get_cluster("dgx-h800")
    job = TrainingJob(global_batch_size=15360, seq_length=4096, precision="fp8")
    res = run_search(model, cluster, job, 2048, top_k=8)
    assert res.plans and all(e.feasible for e in res.plans)
    best = res.plans[0]
    assert best.parallel.tp <= 2 and best.parallel.ep >= 8
    # Published: 180K H800 GPU-hours per trillion tokens (Sec. 1) = 1543 tokens/s/GPU. The best plan is predicted
    # ~23% below it: DualPipe (bubble and all-to-all hidden) and FP8 activation caching are not modelled, so the
    # published layout (PP16, EP64, no TP) does not fit the memory model (93.7 vs 75.7 GiB usable). Dropless routing's
    # busiest EP rank (cost_models/moe_imbalance.py: 1.5x the balanced tokens at EP 64, Megatron-Bridge's DeepSeek-V3
    # sizing) makes the best layout recompute fully. With DeepSeek's own blockwise FP8 (plan3d's Hopper MoE default,
    # cost_models/fp8_recipe.py) the best layout is the paper's PP16 with ZeRO-1 data parallelism and no TP; with
    # per-tensor FP8's per-expert host cost it was pp 1, ZeRO-3, mbs 5. Its EP is 16, not the paper's 64: DeepSeek's
    # framework dispatches FP8 (Sec. 3.3.3, "Low-Precision Storage and Communication"); Megatron-LM, which plan3d
    # emits, dispatches bf16 (moe/fused_a2a.py), 4/3 the bytes. The paper's EP64 (with TP 2) follows within 4%
    # (3.3%, 6th, at PP 8: its MoE blocks' TP gather / scatter block in backward, collectives.tp_backward_shares;
    # with Megatron's DP reduction overlapped, as plan3d's launch runs it, the layouts with more data parallelism
    # gained), tied within the prediction interval.
    per_gpu = best.step.tokens_per_s / 2048
    assert (best.parallel.pp, best.parallel.zero_stage) == (16, 1) and best.parallel.ep >= 16
    ep64 = [e for e in res.plans if e.parallel.ep == 64]
    assert ep64 and ep64[0].step.step_s / best.step.step_s < 1.04
    assert per_gpu / (1e12 / 180e3 / 3600) - 1 == pytest.approx(-0.26, abs=0.05)
