"""MoE flex token dispatchers (DeepEP, HybridEP) timed from their measured in-domain throughput
(``cluster_specs/data/efficiency/ep_dispatch.yaml``: NVIDIA's Hybrid-EP tables in deepseek-ai/DeepEP
``Hybrid-EP_Implementation.md``) and DeepEP across NVLink domains from DeepSeek's internode figures (its README),
stated by the job and emitted as stated."""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cluster_specs.efficiency import ep_dispatch_bandwidth, ep_internode_bandwidth, flex_dispatcher_default_sms
from cost_models.collectives import ep_domain_copies
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.step_time import estimate_step
from model_zoo import get_model
from planner.emit.megatron import megatron_args
from planner.errors import PlanInputError

GB200 = get_cluster("gb200-nvl72")
Q30 = get_model("qwen3-30b-a3b")


def test_table_values_are_the_published_figures():
    # GB200, HybridEP, Torch API, BF16 dispatch / combine (GB/s): 16 ranks at 16 SMs 472.84 / 474.48, at 32 SMs
    # 523.48 / 521.55; 8 ranks at 32 SMs 545.71 / 568.94
    assert ep_dispatch_bandwidth("GB200", "hybridep", 16, 16) == pytest.approx((472.84e9, 474.48e9))
    assert ep_dispatch_bandwidth("GB200", "hybridep", 16, 32) == pytest.approx((523.48e9, 521.55e9))
    assert ep_dispatch_bandwidth("GB200", "hybridep", 8, 32) == pytest.approx((545.71e9, 568.94e9))
    # between measured rank counts: linear (12 ranks, 16 SMs: halfway between 8 and 16)
    assert ep_dispatch_bandwidth("GB200", "hybridep", 12, 16)[0] == pytest.approx((550.10e9 + 472.84e9) / 2)
    # beyond the last measured count (36 ranks) held: a 64-rank NVL72 group reads the 36-rank figure
    assert ep_dispatch_bandwidth("GB200", "hybridep", 64, 32) == pytest.approx((479.02e9, 447.89e9))
    # DeepEP on B200 at its default 20 SMs: between the 16- and 24-SM figures (348 / 302 and 494 / 420)
    # HybridEP's own default inside one NVLink domain: 32 SMs (DeepEP hybrid-ep 7febc6e2 hybrid_ep_buffer.py:
    # ``num_sms_dispatch_api = 32 if self.num_of_nodes == 1 else 8``; Megatron-LM passes None when unset)
    assert flex_dispatcher_default_sms("deepep") == 20 and flex_dispatcher_default_sms("hybridep") == 32
    assert ep_dispatch_bandwidth("GB200", "hybridep", 16) == ep_dispatch_bandwidth("GB200", "hybridep", 16, 32)
    assert ep_dispatch_bandwidth("B200", "deepep", 8) == pytest.approx((421e9, 361e9))
    # no published series: None (the caller keeps the NCCL all-to-all estimate)
    assert ep_dispatch_bandwidth("H100", "hybridep", 8) is None
    with pytest.raises(ValueError, match="allowed deepep, hybridep"):
        ep_dispatch_bandwidth("GB200", "nccl", 8)


def test_in_domain_hybridep_time_is_bytes_over_measured_throughput():
    par = ParallelConfig(dp=16, ep=16, micro_batch_size=4, zero_stage=1)
    plain = TrainingJob(global_batch_size=512, precision="fp8", expert_load_imbalance=1.0)
    hybrid = plain.model_copy(update={"moe_flex_dispatcher_backend": "hybridep", "moe_flex_dispatcher_num_sms": 16})
    s_plain = estimate_step(Q30, GB200, plain, par, fp8_recipe="mx")
    s_hyb = estimate_step(Q30, GB200, hybrid, par, fp8_recipe="mx")
    # one micro-batch's 16384 tokens, each to its expected distinct destination ranks (128 experts over 16 ranks,
    # top-8: 6.44), 2048 x 2 bytes, dispatched and combined forward and again backward, on 48 MoE layers and
    # 32 / 4 = 8 micro-batches; EP is not overlapped here, so all of it is exposed
    ranks = ep_domain_copies(128, 8, 16)
    assert ranks == pytest.approx(16 * (1 - (15 / 16) ** 8))
    nbytes = 16384 * ranks * 2048 * 2
    per_layer = 2 * (nbytes / 472.84e9 + nbytes / 474.48e9)
    assert s_hyb.exposed_comm_s["ep"] == pytest.approx(per_layer * 48 * 8, rel=1e-6)
    # slower than the NCCL all-to-all estimate of all 8 copies at NVLink's bus rate, as measured (0.74 TB/s there)
    assert s_hyb.exposed_comm_s["ep"] > 1.2 * s_plain.exposed_comm_s["ep"]
    # more SMs: faster (523 / 522 GB/s at 32 SMs, HybridEP's own default inside one domain when none is set)
    for more in (hybrid.model_copy(update={"moe_flex_dispatcher_num_sms": 32}),
                 hybrid.model_copy(update={"moe_flex_dispatcher_num_sms": None})):
        assert estimate_step(Q30, GB200, more, par, fp8_recipe="mx").exposed_comm_s["ep"] == pytest.approx(
            2 * (nbytes / 523.48e9 + nbytes / 521.55e9) * 48 * 8, rel=1e-6)


def test_stated_backend_is_emitted():
    par = ParallelConfig(dp=16, ep=16, micro_batch_size=4, zero_stage=1)
    job = TrainingJob(global_batch_size=512, moe_flex_dispatcher_backend="hybridep", moe_flex_dispatcher_num_sms=32)
    args = megatron_args(Q30, job, par, GB200)
    i = args.index("--moe-token-dispatcher-type")
    assert args[i + 1] == "flex"
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    assert args[args.index("--moe-flex-dispatcher-num-sms") + 1] == "32"
    # not stated, inside one domain: the NCCL all-to-all dispatcher, as before
    plain = megatron_args(Q30, TrainingJob(global_batch_size=512), par, GB200)
    assert plain[plain.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    assert "--moe-flex-dispatcher-num-sms" not in plain


@pytest.mark.parametrize("kwargs, msg", [
    ({"moe_flex_dispatcher_backend": "nccl"}, "must be one of deepep, hybridep"),
    ({"moe_flex_dispatcher_num_sms": 24}, "without --moe-flex-dispatcher-backend"),
    ({"moe_flex_dispatcher_backend": "deepep", "moe_flex_dispatcher_num_sms": 0}, "positive integer"),
    # GB200 reads B200's SM count (attention.yaml: 148, 74 of each die's 80 enabled)
    ({"moe_flex_dispatcher_backend": "deepep", "moe_flex_dispatcher_num_sms": 149}, "the GB200 has 148 SMs"),
    ({"moe_flex_dispatcher_backend": "deepep", "capacity_factor": 1.25}, "routes dropless"),
    ({"moe_flex_dispatcher_backend": "deepep", "framework": "torchtitan"}, "--framework torchtitan"),
])
def test_bad_dispatcher_options_are_one_line_errors(kwargs, msg):
    from planner.api_options import load_inputs
    with pytest.raises(PlanInputError, match=msg):
        load_inputs("qwen3-30b-a3b", "gb200-nvl72", gpus=16, **kwargs)
    with pytest.raises(PlanInputError, match="has no experts"):
        load_inputs("llama3.1-8b", "gb200-nvl72", gpus=16, moe_flex_dispatcher_backend="hybridep")


def test_cli_option_reaches_the_document_and_the_step(run_cli):
    import json
    base = ["evaluate", "-m", "qwen3-30b-a3b", "-c", "gb200-nvl72", "--gpus", "16", "--global-batch-size", "512",
            "--ep", "16", "--micro-batch-size", "4", "--precision", "fp8", "--zero-stage", "1", "--format", "json"]
    plain = json.loads(run_cli(*base).stdout)
    hyb = json.loads(run_cli(*base, "--moe-flex-dispatcher-backend", "hybridep", "--moe-flex-dispatcher-num-sms",
                             "16").stdout)
    assert hyb["input"]["job"]["moe_flex_dispatcher_backend"] == "hybridep"
    assert hyb["input"]["job"]["moe_flex_dispatcher_num_sms"] == 16
    assert plain["input"]["job"]["moe_flex_dispatcher_backend"] is None
    assert hyb["plans"][0]["time"]["step_s"] > plain["plans"][0]["time"]["step_s"]


def test_backend_type_and_measured_tables_name_the_same_backends():
    # the job's Literal (cost_models) and the tables' backends (cluster_specs, which imports nothing of ours) are twins
    from typing import get_args
    from cluster_specs.efficiency import FLEX_DISPATCHER_BACKENDS
    from cost_models.config import FlexDispatcherBackend
    assert get_args(FlexDispatcherBackend) == FLEX_DISPATCHER_BACKENDS


def test_moe_runs_are_emitted_with_the_fused_routing_kernels_the_model_charges():
    """Megatron-LM's MoE recipes set moe_router_fusion and moe_permute_fusion (examples/moe_recipes/*.yaml at
    d48bd6be); moe_overhead.moe_routing_s charges those kernels, so the emitted run must ask for them (Megatron-LM's
    defaults are False: the unfused PyTorch permutation, measured 3-7x slower on an H200)."""
    par = ParallelConfig(dp=16, ep=16, micro_batch_size=4, zero_stage=1)
    args = megatron_args(Q30, TrainingJob(global_batch_size=512), par, GB200)
    assert "--moe-router-fusion" in args and "--moe-permute-fusion" in args  # names: test_emit's parser check
    dense = megatron_args(get_model("llama3.1-8b"), TrainingJob(global_batch_size=512), ParallelConfig(dp=8), GB200)
    assert "--moe-router-fusion" not in dense and "--moe-permute-fusion" not in dense


def test_internode_table_values_are_deepseeks_published_figures():
    # deepseek-ai/DeepEP README "Normal kernels with NVLink and RDMA forwarding" (hybrid-ep branch 7febc6e2): H800,
    # CX7 400 Gb/s, 24 SMs; EP 16 / 32 / 64 over 2 / 4 / 8 nodes: 43 / 43, 58 / 57, 51 / 50 GB/s (dispatch / combine)
    assert ep_internode_bandwidth("deepep", 2) == pytest.approx((43e9, 43e9))
    assert ep_internode_bandwidth("deepep", 4) == pytest.approx((58e9, 57e9))
    assert ep_internode_bandwidth("deepep", 8) == pytest.approx((51e9, 50e9))
    # between measured node counts linear, beyond them held
    assert ep_internode_bandwidth("deepep", 3) == pytest.approx((50.5e9, 50e9))
    assert ep_internode_bandwidth("deepep", 16) == pytest.approx((51e9, 50e9))
    # DeepEP's one measured SM count (24) holds for any
    assert ep_internode_bandwidth("deepep", 2, 8) == ep_internode_bandwidth("deepep", 2, 64)
    # HybridEP across H100 nodes (DeepEP hybrid-ep docs/README_Hybrid-EP.md, Torch API, BF16 dispatch / combine): 16
    # ranks at 8 SMs 57.74 / 56.96, 64 ranks at 16 SMs 41.24 / 46.57; its default across domains: 8 SMs
    assert ep_internode_bandwidth("hybridep", 2, 8) == pytest.approx((57.74e9, 56.96e9))
    assert ep_internode_bandwidth("hybridep", 8, 16) == pytest.approx((41.24e9, 46.57e9))
    assert ep_internode_bandwidth("hybridep", 2) == ep_internode_bandwidth("hybridep", 2, 8)
    # 3 nodes at 12 SMs: halfway in both
    assert ep_internode_bandwidth("hybridep", 3, 12)[0] == pytest.approx(((57.74 + 54.47) / 2 + (46.54 + 47.36) / 2)
                                                                          / 2 * 1e9)
    # inside one domain: None
    assert ep_internode_bandwidth("deepep", 1) is None and ep_internode_bandwidth("hybridep", 1) is None
    with pytest.raises(ValueError, match="allowed deepep, hybridep"):
        ep_internode_bandwidth("nccl", 2)


B200 = get_cluster("dgx-b200")


def test_deepep_across_nodes_is_no_faster_than_its_measured_kernels():
    # Qwen3-30B-A3B at EP 16 over two 8-GPU B200 nodes, dropless: Megatron-LM's flex dispatcher (DeepEP by default)
    par = ParallelConfig(dp=16, ep=16, micro_batch_size=4, zero_stage=1)
    job = TrainingJob(global_batch_size=512, precision="bf16", expert_load_imbalance=1.0)
    step = estimate_step(Q30, B200, job, par)
    # each of the micro-batch's 16384 tokens goes once to each of the 2 nodes holding any of its 8 experts
    # (2 x (1 - 0.5^8) = 1.99 counted, the own node included: the measurement's byte count), 2048 x 2 bytes, at
    # 43 GB/s each way; forward and backward, 48 MoE layers, 512 / (16 x 4) = 8 micro-batches, none of it overlapped
    copies = ep_domain_copies(128, 8, 2)
    assert copies == pytest.approx(2 * (1 - 0.5 ** 8))
    nbytes = 16384 * copies * 2048 * 2
    kernel = 2 * (nbytes / 43e9 + nbytes / 43e9) * 48 * 8
    assert step.exposed_comm_s["ep"] == pytest.approx(kernel, rel=1e-6)
    # HybridEP named instead: its own measured internode series, at its default 8 SMs across domains
    hybrid = estimate_step(Q30, B200, job.model_copy(update={"moe_flex_dispatcher_backend": "hybridep"}), par)
    assert hybrid.exposed_comm_s["ep"] == pytest.approx(2 * (nbytes / 57.74e9 + nbytes / 56.96e9) * 48 * 8, rel=1e-6)
    # the NCCL-style estimate (the remote half at 0.94 x 50 GB/s) would be 2.2x faster: DeepEP's pipeline, not the
    # NIC, bounds it at 2 nodes
    remote = 2 * nbytes * 8 / 16 / (50e9 * 0.94) + 1 * B200.network.latency_s + 7 * B200.network.nvlink_latency_s
    assert 2 * remote * 48 * 8 < kernel / 2
    # on a slow network the NIC binds: the same H100 nodes with 100 Gb/s per GPU (11.75 GB/s at 0.94 bus efficiency
    # for the remote half, below the 21.5 GB/s DeepEP's 43 GB/s counted puts on the wire at 2 nodes)
    h100 = get_cluster("dgx-h100")
    slow_net = h100.model_copy(
        update={"network": h100.network.model_copy(update={"nic_bandwidth_bytes_per_s": 12.5e9})})
    slow = estimate_step(Q30, slow_net, job, par)
    wire = 2 * nbytes * 8 / 16 / (12.5e9 * 0.94) + h100.network.latency_s + 7 * h100.network.nvlink_latency_s
    assert slow.exposed_comm_s["ep"] == pytest.approx(2 * wire * 48 * 8, rel=1e-6)


def test_deepep_internode_figures_apply_only_where_deepep_runs_as_measured():
    # the NIC-bound all-to-all alone (the figures do not apply) where the flex dispatcher's internode kernels do not
    # run as measured: a framework that launches no flex dispatcher (torchtitan, DeepSpeed), a GPU without them (A100:
    # no SM90 features), or NVLink domains that are not 8-GPU nodes (GB200 NVL72)
    par = ParallelConfig(dp=16, ep=16, micro_batch_size=4, zero_stage=1)
    job = TrainingJob(global_batch_size=512, precision="bf16", expert_load_imbalance=1.0)
    copies = ep_domain_copies(128, 8, 2)

    def network(c, p=par):
        nbytes = 16384 * copies * 2048 * 2
        ranks, per_domain = p.ep, c.node.nvlink_domain_size
        inter = 2 * nbytes * (ranks - per_domain) / ranks / (c.network.nic_bandwidth_bytes_per_s
                                                             * c.calibration.network_bus_efficiency)
        return 2 * (inter + c.network.latency_s + (per_domain - 1) * c.network.nvlink_latency_s) * 48 * 8

    for fw in ("torchtitan", "deepspeed"):
        assert estimate_step(Q30, B200, job, par, framework=fw).exposed_comm_s["ep"] == pytest.approx(
            network(B200), rel=1e-6)
    a100 = get_cluster("dgx-a100-80g")
    assert estimate_step(Q30, a100, job, par).exposed_comm_s["ep"] == pytest.approx(network(a100), rel=1e-6)
    # 128 ranks over two 72-GPU NVLink domains (64 each)
    wide = ParallelConfig(dp=128, ep=128, micro_batch_size=4, zero_stage=1)
    nvl = estimate_step(Q30, GB200, job.model_copy(update={"global_batch_size": 1024}), wide)
    assert nvl.exposed_comm_s["ep"] == pytest.approx(network(GB200, wide) / 48 / 8 * 48 * 2, rel=1e-6)
