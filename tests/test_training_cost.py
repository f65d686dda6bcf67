"""The physics of a whole training run (cost_models/training_cost.py) and the operations figures of the cluster
specs (cluster_specs/operations.py), against the published numbers they come from."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_specs import get_cluster, list_clusters
from cluster_specs.operations import OperationsSpec, PowerSpec, ReliabilitySpec
from cost_models.config import ParallelConfig
from cost_models.training_cost import (
    async_snapshot_s,
    checkpoint_bytes,
    checkpoint_period_s,
    checkpoint_write_s,
    goodput_fraction,
    job_mtbf_s,
    training_cost,
)
from model_zoo import get_model


def test_meta_interruption_rate_and_job_mtbf():
    # Llama 3 paper Sec. 3.3.4, Table 5: 419 unexpected interruptions in a 54-day snapshot on 16,384 H100s
    rate = ReliabilitySpec().interruptions_per_gpu_hour
    assert rate == pytest.approx(419 / (54 * 24 * 16384))
    assert rate == pytest.approx(1.973e-5, rel=1e-3)
    # one interruption every 54 x 24 / 419 = 3.09 hours on the whole 16,384-GPU job
    assert job_mtbf_s(rate, 16384) / 3600 == pytest.approx(54 * 24 / 419)


def test_restart_phases_sum_to_meta_average():
    # TrainMover (arXiv 2412.12636): Meta's restart averages 6.47 min; rescheduling 23%, checkpoint load 24%,
    # NCCL set-up 17%, warm-up 28% (the 8% left is detection and the rest)
    r = ReliabilitySpec()
    assert r.restart_s == pytest.approx(6.47 * 60, abs=0.05)
    assert r.restart_phases_s["checkpoint_load"] == pytest.approx(0.24 * 6.47 * 60, abs=0.01)
    assert r.restart_phases_s["nccl_setup"] == pytest.approx(0.17 * 6.47 * 60, abs=0.01)


def test_every_builtin_cluster_has_power_and_a_sourced_operations_section():
    for name in list_clusters():
        ops = get_cluster(name).operations
        assert ops.power.gpu_board_w is not None, name
        assert ops.storage.host_link_bytes_per_s is not None, name
        for section in (ops.power, ops.storage, ops.reliability):
            assert section.source.strip(), name
        if ops.price is not None:
            assert ops.price.source and ops.price.date.year >= 2024, name


def test_datasheet_power_figures():
    h100 = get_cluster("dgx-h100").operations.power
    assert h100.gpu_board_w == 700  # H100 SXM5 TDP
    assert 8 * h100.gpu_board_w + h100.node_overhead_w == 10_200  # DGX H100 maximum system input 10.2 kW
    b200 = get_cluster("dgx-b200").operations.power
    assert 8 * b200.gpu_board_w + b200.node_overhead_w == 14_300  # DGX B200 maximum 14.3 kW
    assert get_cluster("dgx-a100-80g").operations.power.gpu_board_w == 400


def test_operations_values_need_their_source():
    with pytest.raises(ValueError, match="source is required"):
        PowerSpec(gpu_board_w=700)
    assert PowerSpec(gpu_board_w=700, source="my datasheet").gpu_board_w == 700
    assert OperationsSpec().power.pue == 1.58  # Uptime Institute 2023 industry average


@pytest.mark.parametrize("framework,bytes_per_param", [("megatron", 14), ("deepspeed", 14), ("torchtitan", 12)])
def test_checkpoint_bytes_are_weights_plus_optimizer_states(framework, bytes_per_param):
    # Megatron / DeepSpeed mixed precision: bf16 weights 2 + fp32 master 4 + Adam moments 8; torchtitan: fp32
    # weights 4 + moments 8 (cost_models.memory.state_bytes)
    m = get_model("llama3.1-405b")
    assert checkpoint_bytes(m, framework, ParallelConfig()) == m.num_parameters() * bytes_per_param


def test_checkpoint_bytes_follow_the_recipe_not_the_offload():
    m = get_model("llama3.1-8b")
    n = m.num_parameters()
    assert checkpoint_bytes(m, "megatron", ParallelConfig(fp8_param_gather=True)) == 13 * n
    assert checkpoint_bytes(m, "megatron", ParallelConfig(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")) == 10 * n
    # offloaded optimizer states still go to the checkpoint
    assert checkpoint_bytes(m, "megatron", ParallelConfig(optimizer_cpu_offload_fraction=1.0)) == 14 * n


def test_write_and_snapshot_times():
    # 405B: 5.68 TB written by 16,384 GPUs at Tectonic's 2 TB/s = 2.84 s
    b = checkpoint_bytes(get_model("llama3.1-405b"), "megatron", ParallelConfig())
    assert checkpoint_write_s(b, 2e12 / 16384, 16384) == pytest.approx(b / 2e12)
    # async: each GPU copies its 347 MB shard over PCIe Gen5 (64 GB/s) in ~5 ms
    assert async_snapshot_s(b, 16384, 64e9) == pytest.approx(b / 16384 / 64e9)


def test_young_daly_interval():
    # T_s + sqrt(2 (T_f + T_r) T_s + T_s^2): with T_s = 10 s, T_f = 6000 s, T_r = 600 s -> 10 + sqrt(132100)
    assert checkpoint_period_s(10, 6000, 600) == pytest.approx(10 + math.sqrt(2 * 6600 * 10 + 100))
    # without restart and for T_s << T_f it is Young's sqrt(2 T_f T_s)
    assert checkpoint_period_s(1.0, 1e6, 0) == pytest.approx(math.sqrt(2e6), rel=1e-3)
    with pytest.raises(ValueError):
        checkpoint_period_s(0, 6000, 600)


@settings(max_examples=200, deadline=None)
@given(blocking=st.floats(0.01, 300), mtbf=st.floats(600, 1e7), restart=st.floats(0, 1800))
def test_young_daly_interval_is_near_the_goodput_optimum(blocking, mtbf, restart):
    """Daly's interval (a first-order optimum) is within 1% goodput of intervals half and twice as long."""
    if blocking > mtbf / 20:  # the first-order optimum assumes checkpoints much shorter than the MTBF
        return
    tau = checkpoint_period_s(blocking, mtbf, restart) - blocking
    g = goodput_fraction(tau, blocking, mtbf, restart)
    assert 0 < g < 1
    for other in (tau / 2, tau * 2):
        assert g >= goodput_fraction(other, blocking, mtbf, restart) - 0.01


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(1e-7, 1e-3), gpus=st.integers(1, 100_000), extra=st.floats(1.01, 10))
def test_goodput_falls_as_failures_rise(rate, gpus, extra):
    def g(r):
        m = job_mtbf_s(r, gpus)
        tau = checkpoint_period_s(5.0, m, 300.0) - 5.0
        return goodput_fraction(tau, 5.0, m, 300.0)
    assert g(rate * extra) <= g(rate) + 1e-12


def test_meta_effective_training_time():
    """Meta: "higher than 90% effective training time" over the 54-day snapshot of the 405B run (Llama 3 paper
    Sec. 3.3.4). The goodput model for that run (16,384 GPUs, Meta's interruption rate and restart, the 405B
    checkpoint written to Tectonic at 2 TB/s, synchronous saves at the Young/Daly interval, a 6.2 s step) agrees
    within 5 points, and is above 90%."""
    m = get_model("llama3.1-405b")
    c = get_cluster("dgx-h100")
    t = training_cost(train_tokens=15.6e12, tokens_per_s=2.69e6, step_s=6.23, tokens_per_step=2048 * 8192,
                      num_gpus=16384, gpus_per_node=8, ckpt_bytes=checkpoint_bytes(m, "megatron", ParallelConfig()),
                      ops=c.operations)
    assert t.goodput_fraction > 0.90
    assert abs(t.goodput_fraction - 0.90) <= 0.05
    assert t.goodput_fraction == pytest.approx(0.944, abs=0.002)


def test_async_checkpoint_blocks_less_and_keeps_more():
    m = get_model("llama3.1-70b")
    ops = get_cluster("dgx-h100").operations
    kw = dict(train_tokens=1e12, tokens_per_s=3e5, step_s=14.0, tokens_per_step=512 * 8192, num_gpus=512,
              gpus_per_node=8, ckpt_bytes=checkpoint_bytes(m, "megatron", ParallelConfig()), ops=ops)
    sync, asyn = training_cost(**kw), training_cost(**kw, async_checkpoint=True)
    assert asyn.checkpoint_blocking_s < sync.checkpoint_blocking_s == sync.checkpoint_write_s
    assert asyn.checkpoint_interval_s >= asyn.checkpoint_write_s  # one save in flight at a time
    assert asyn.goodput_fraction > sync.goodput_fraction


def test_energy_counts_boards_nodes_pue_and_the_effective_time():
    ops = get_cluster("dgx-h100").operations
    t = training_cost(train_tokens=1e11, tokens_per_s=1e5, step_s=10.0, tokens_per_step=10**6, num_gpus=16,
                      gpus_per_node=8, ckpt_bytes=1e11, ops=ops)
    assert t.it_power_w == 16 * 700 + 2 * 4600
    assert t.energy_mwh == pytest.approx(t.it_power_w * 1.58 * t.effective_s / 3600 / 1e6)
    assert t.gpu_hours == pytest.approx(16 * t.effective_s / 3600)
    assert t.usd is None
    no_overhead = get_cluster("mi300x").operations
    t2 = training_cost(train_tokens=1e11, tokens_per_s=1e5, step_s=10.0, tokens_per_step=10**6, num_gpus=16,
                       gpus_per_node=8, ckpt_bytes=1e11, ops=no_overhead)
    assert t2.it_power_w == 16 * 750 and "boards at datasheet power only" in t2.energy_scope


@settings(max_examples=100, deadline=None)
@given(p1=st.floats(0.01, 100), p2=st.floats(0.01, 100), tokens=st.floats(1e9, 1e14))
def test_cost_never_decreases_as_the_price_rises(p1, p2, tokens):
    lo, hi = sorted((p1, p2))
    ops = get_cluster("dgx-h100").operations
    kw = dict(train_tokens=tokens, tokens_per_s=2e6, step_s=8.0, tokens_per_step=2048 * 8192, num_gpus=1024,
              gpus_per_node=8, ckpt_bytes=1e12, ops=ops)
    assert training_cost(**kw, usd_per_gpu_hour=lo).usd <= training_cost(**kw, usd_per_gpu_hour=hi).usd


def test_goodput_is_finite_far_past_the_mtbf():
    """Daly's goodput with the restart (or the interval) many MTBFs long: exp() of it overflowed; in logs it is a
    positive number that underflows to 0, and it still equals the direct formula where that is finite."""
    import math
    from cost_models.training_cost import goodput_fraction
    assert goodput_fraction(600.0, 60.0, 2.2, 86400.0) == 0.0
    c, d, m, r = 1800.0, 30.0, 7200.0, 600.0
    direct = c / (m * math.exp(r / m) * math.expm1((c + d) / m))
    assert goodput_fraction(c, d, m, r) == pytest.approx(direct, rel=1e-12)
