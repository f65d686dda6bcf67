"""CPU offload: the host link and host DRAM figures of the cluster specs, the optimizer-offload step time
(cost_models/optimizer_offload.py), activation offloading (cost_models/activation_offload.py), and their emission."""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.activation_offload import OFFLOAD_RESIDENT_LAYERS, transfer_exposed_s
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.activations import activation_terms_per_layer
from cost_models.memory import estimate_memory
from cost_models.optimizer_offload import (COPY_BYTES_PER_PARAM, CPU_ADAM_HOST_BYTES_PER_PARAM,
                                           offloaded_optimizer_step)
from cost_models.step_time import estimate_step
from model_zoo import get_model
from planner.emit.megatron import EmitError, megatron_args

GiB = 2**30


def test_host_link_and_host_memory_figures_of_the_specs():
    h100, gb200 = get_cluster("dgx-h100"), get_cluster("gb200-nvl72")
    # PCIe Gen5 x16: 64 GB/s per direction per GPU (H100 SXM5 host link "128 GB/s (bidirectional)")
    assert h100.host_link_bytes_per_s == 64e9
    # NVLink-C2C 900 GB/s bidirectional per GB200 superchip (1 Grace + 2 GPUs): 450 GB/s per direction for two GPUs
    assert gb200.host_link_bytes_per_s == 900e9 / 2 / 2
    # 2 sockets x 8 channels x DDR5-4800 x 8 bytes over 8 GPUs; 2 Grace x 512 GB/s LPDDR5X over a 4-GPU tray
    assert h100.host_memory_bandwidth_per_gpu == pytest.approx(2 * 8 * 4800e6 * 8 / 8)
    assert gb200.host_memory_bandwidth_per_gpu == pytest.approx(2 * 512e9 / 4)


def test_zero_offload_moves_four_bytes_per_parameter():
    # ZeRO-Offload (Ren et al., USENIX ATC 2021, Sec. 4.1): "4M" bytes per step over PCIe for M parameters, 16-bit
    # gradients to the CPU and 16-bit parameters back; Megatron's HybridDeviceOptimizer copies fp32 both ways
    assert sum(COPY_BYTES_PER_PARAM["deepspeed"]) == 4
    assert sum(COPY_BYTES_PER_PARAM["megatron"]) == 8
    # CPU Adam streams the fp32 parameter, gradient and two moments (16 B read, 12 B written; +2 B fp16 copy)
    assert CPU_ADAM_HOST_BYTES_PER_PARAM == {"megatron": 28, "deepspeed": 30}


def test_megatron_optimizer_offload_pipelines_copies_and_cpu_adam():
    h100 = get_cluster("dgx-h100")
    p = 1.0e9  # local optimizer partition, parameters
    st = offloaded_optimizer_step(h100, "megatron", p, 1.0, gpu_adam_s=0.01)
    assert st.d2h_s == pytest.approx(4 * p / 64e9) and st.h2d_s == pytest.approx(4 * p / 64e9)
    assert st.cpu_s == pytest.approx(28 * p / 76.8e9)  # 0.365 s: CPU Adam binds on a DGX H100
    assert st.exposed_s == pytest.approx(max(st.d2h_s, st.cpu_s, st.h2d_s))
    half = offloaded_optimizer_step(h100, "megatron", p, 0.5, gpu_adam_s=0.01)
    assert half.exposed_s == pytest.approx(st.exposed_s / 2) and half.gpu_s == pytest.approx(0.005)
    # GB200: C2C and Grace LPDDR5X, 3.4x less
    gb = offloaded_optimizer_step(get_cluster("gb200-nvl72"), "megatron", p, 1.0, gpu_adam_s=0.01)
    assert gb.exposed_s == pytest.approx(28 * p / 256e9)
    with pytest.raises(ValueError, match="no optimizer CPU offload"):
        offloaded_optimizer_step(h100, "torchtitan", p, 1.0, gpu_adam_s=0.01)


def test_deepspeed_zero_offload_step_is_serial_after_overlapped_gradient_copies():
    h100 = get_cluster("dgx-h100")
    p = 1.0e9
    st = offloaded_optimizer_step(h100, "deepspeed", p, 1.0, gpu_adam_s=0.01, num_microbatches=4, backward_s=0.01)
    per_mb = 2 * p / 64e9  # 31 ms of gradient copy per micro-batch, 10 ms hidden under its backward
    assert st.d2h_s == pytest.approx(4 * per_mb)
    assert st.exposed_s == pytest.approx(4 * (per_mb - 0.01) + 30 * p / 76.8e9 + 2 * p / 64e9)


def test_optimizer_offload_in_the_step_and_the_memory():
    m, c = get_model("llama3.1-70b"), get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=256, seq_length=8192)
    base = ParallelConfig(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True)
    off = base.model_copy(update={"optimizer_cpu_offload_fraction": 1.0})
    s0, s1 = estimate_step(m, c, job, base), estimate_step(m, c, job, off)
    e0, e1 = estimate_memory(m, c, job, base), estimate_memory(m, c, job, off)
    # the 12 bytes of master weights and moments leave the GPU; the step pays CPU Adam on the host's share
    assert e0.peak_stage.optimizer_states > 0 and e1.peak_stage.optimizer_states == 0
    assert s1.optimizer_s > 10 * s0.optimizer_s
    assert s1.step_s - s0.step_s == pytest.approx(s1.optimizer_s - s0.optimizer_s)


def test_activation_offload_moves_the_named_tensors_and_keeps_two_layers():
    # Llama-3.1-8B, TP 1, 4096 tokens: core_attn moves Q, K, V and the fp32 LSE; attn_proj the attention output
    m, c = get_model("llama3.1-8b"), get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    par = ParallelConfig(dp=8, zero_stage=1)
    t = activation_terms_per_layer(m, job, par, 0)
    s, h, kv = 4096, 4096, 8 * 128
    assert t["qkv"] == 2 * s * (h + 2 * kv) and t["attn_out"] == 2 * s * h and t["softmax_stats"] == 4 * 32 * s
    moved = t["qkv"] + t["softmax_stats"] + t["attn_out"]
    off = par.model_copy(update={"offload_modules": ("core_attn", "attn_proj")})
    a0 = estimate_memory(m, c, job, par).stages[0].phase_terms["backward"]["activations"]
    a1 = estimate_memory(m, c, job, off).stages[0].phase_terms["backward"]["activations"]
    assert a0 - a1 == pytest.approx(m.num_layers * moved - OFFLOAD_RESIDENT_LAYERS * moved)
    with pytest.raises(ValueError, match="attn_proj needs core_attn"):
        ParallelConfig(offload_modules=("attn_proj",))


def test_activation_offload_pays_on_a_fast_host_link():
    # Mixtral-8x7B, EP 8, 8192 tokens per micro-batch: the experts' fc1 inputs and outputs (expert_fc1, moe_act) are
    # larger than PCIe Gen5 moves under the layer's compute on H100 and B200; NVLink-C2C on GB200 hides most of it
    m = get_model("mixtral-8x7b")
    job = TrainingJob(global_batch_size=64, seq_length=8192)
    par = ParallelConfig(dp=8, ep=8, zero_stage=1, offload_modules=("expert_fc1", "moe_act"))
    host = {cl: estimate_step(m, get_cluster(cl), job, par).exposed_comm_s["host"]
            for cl in ("dgx-h100", "dgx-b200", "gb200-nvl72")}
    assert host["gb200-nvl72"] < 0.2 * host["dgx-h100"] < host["dgx-h100"] < host["dgx-b200"]
    assert transfer_exposed_s(64e9, 0.5, 64e9) == pytest.approx(0.5) and transfer_exposed_s(1e9, 0.5, 64e9) == 0
    assert "host" not in estimate_step(m, get_cluster("dgx-h100"), job, par.model_copy(
        update={"offload_modules": None})).exposed_comm_s


def test_offload_knobs_are_emitted_for_megatron_and_refused_elsewhere():
    from planner.emit.deepspeed import deepspeed_config
    from planner.emit.torchtitan import torchtitan_settings
    m = get_model("llama3.1-8b")
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    par = ParallelConfig(dp=8, zero_stage=1, optimizer_cpu_offload_fraction=0.5,
                         offload_modules=("core_attn", "attn_proj"))
    a = megatron_args(m, job, par)
    # Megatron asserts the precision-aware optimizer with --optimizer-cpu-offload (arguments.py validate_args)
    for flag in ("--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                 "--fine-grained-activation-offloading"):
        assert flag in a
    i = a.index("--offload-modules")
    assert a[i + 1:i + 3] == ["core_attn", "attn_proj"]
    assert a[a.index("--optimizer-offload-fraction") + 1] == "0.5"
    with pytest.raises(EmitError, match="offload_modules"):
        deepspeed_config(job, par.model_copy(update={"optimizer_cpu_offload_fraction": 0.0}), m)
    with pytest.raises(EmitError, match="offload_modules"):
        torchtitan_settings(m, job, par.model_copy(update={"zero_stage": 3, "optimizer_cpu_offload_fraction": 0.0}))
