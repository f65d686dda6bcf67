"""fp32 training (--precision fp32): 4-byte states and activations, GEMMs at the TF32 peak, MFU against it, emitted."""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.activations import activation_terms_per_layer
from cost_models.memory import estimate_memory, model_state_terms
from cost_models.step_time import _gemm_rate, estimate_step
from model_zoo import get_model
from planner.emit.env import launch_env
from planner.emit.deepspeed import deepspeed_config, megatron_deepspeed_args
from planner.emit.megatron import megatron_args
from planner.emit.torchtitan import torchtitan_settings

P = 1e9


@pytest.mark.parametrize("d", [1, 8, 64])
def test_megatron_fp32_states_match_the_distributed_optimizer_table(d):
    # Megatron-LM docs/user-guide/features/dist_optimizer.md (formulas.md Sec. 1.3): "fp32 param, fp32 grad":
    # 16 bytes per parameter, 8 + 8/d with the distributed optimizer; "bf16 param, fp32 grad": 18, 6 + 12/d
    fp32 = sum(model_state_terms("megatron", 1 if d > 1 else 0, P, d, fp32=True)) / P
    bf16 = sum(model_state_terms("megatron", 1 if d > 1 else 0, P, d)) / P
    assert fp32 == pytest.approx(16 if d == 1 else 8 + 8 / d)
    assert bf16 == pytest.approx(18 if d == 1 else 6 + 12 / d)


def test_fp32_activations_are_four_bytes_except_the_fp32_statistics():
    m = get_model("llama3.1-8b")
    par = ParallelConfig(dp=8)
    t16 = activation_terms_per_layer(m, TrainingJob(precision="bf16"), par, 0)
    t32 = activation_terms_per_layer(m, TrainingJob(precision="fp32", framework="torchtitan"), par, 0, "torchtitan")
    for k, v in t16.items():
        # the attention's log-sum-exp is fp32 in both; every other tensor doubles
        assert t32[k] == pytest.approx(v if k == "softmax_stats" else 2 * v), k


def test_fp32_gemms_run_at_the_tf32_peak_and_mfu_is_against_it():
    h100 = get_cluster("dgx-h100")
    # H100 SXM5 dense TF32 494.7 TFLOP/s (datasheet / 2, cluster YAML) x the 16-bit MAMF efficiency 0.803
    assert _gemm_rate(h100, "fp32") == pytest.approx(494.7e12 * 0.803)
    assert _gemm_rate(h100, "bf16") == pytest.approx(2 * _gemm_rate(h100, "fp32"))
    m = get_model("llama3.1-8b")
    par = ParallelConfig(dp=8, zero_stage=3)
    st32 = estimate_step(m, h100, TrainingJob(precision="fp32", framework="torchtitan"), par)
    st16 = estimate_step(m, h100, TrainingJob(precision="bf16", framework="torchtitan"), par)
    assert st32.mfu_peak_dtype == "tf32" and st32.peak_flops_per_gpu == pytest.approx(494.7e12)
    assert st32.mfu == pytest.approx(st32.model_flops / (st32.step_s * 8 * 494.7e12))
    # twice the GEMM time, twice the bytes moved: about 2x slower, about the same MFU against its own peak
    assert 1.8 < st32.step_s / st16.step_s < 2.5 and st32.mfu == pytest.approx(st16.mfu, rel=0.1)
    e32 = estimate_memory(m, h100, TrainingJob(precision="fp32", framework="torchtitan"), par).peak_stage
    e16 = estimate_memory(m, h100, TrainingJob(precision="bf16", framework="torchtitan"), par).peak_stage
    assert e32.model_states == pytest.approx(e16.model_states)  # FSDP2's sharded states are fp32 either way
    # the gathered FSDP units (blocks, and the output layer at the start of backward) are fp32
    # (mixed_precision_param float32)
    for ph, name in (("forward", "fsdp_param_gather"), ("backward", "fsdp_param_gather"),
                     ("backward", "fsdp_unsharded_grads")):
        assert e32.buffer_terms[ph][name] == pytest.approx(2 * e16.buffer_terms[ph][name])
    assert e32.activations > 1.8 * e16.activations


def test_fp32_is_emitted_without_16bit_flags_and_with_tf32_enabled():
    m = get_model("llama3.1-8b")
    job = TrainingJob(precision="fp32", flash_attention=False)
    par = ParallelConfig(dp=8, zero_stage=1)
    a = megatron_args(m, job, par)
    assert "--bf16" not in a and "--fp16" not in a  # Megatron's default is fp32
    cfg = deepspeed_config(job, par, m)
    assert "bf16" not in cfg and "fp16" not in cfg
    assert "--bf16" not in megatron_deepspeed_args(get_model("llama2-7b"), job, par)
    tt = torchtitan_settings(m, TrainingJob(precision="fp32"), ParallelConfig(dp=8, zero_stage=3))
    assert tt["training"]["mixed_precision_param"] == "float32"
    # torch's matmuls run TF32 only when allowed: at::Context reads TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
    assert launch_env("megatron", par, job=job) == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    assert launch_env("torchtitan", par, job=job)["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
    assert launch_env("megatron", par, job=TrainingJob()) == {}


def test_fp32_needs_a_tf32_peak_and_an_fp32_attention_kernel(run_cli):
    assert "fp32" in get_cluster("dgx-h100").supported_precisions
    r = run_cli("plan", "--precision", "fp32")
    assert r.exit_code == 2 and "--no-flash-attention" in r.stderr and "fp32" in r.stderr
    ok = run_cli("evaluate", "--precision", "fp32", "--framework", "torchtitan", "--zero-stage", "3", "--format",
                 "json").json()
    assert ok["plans"][0]["throughput"]["mfu_peak_dtype"] == "tf32"
