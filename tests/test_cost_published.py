"""Predicted GPU-hours of two published pre-training runs, from the step-time model and the goodput model
(``planner.evaluate(..., train_tokens=...)``), against what the teams report.

Llama 3.1 405B (Meta): 30.84M H100-80GB GPU-hours (Llama 3.1 model card, "Training Time (GPU hours)"), 15.6T
pre-training tokens (Llama 3 paper, Sec. 3.4). Assumptions, each from the paper where it says:

* 16,384 H100s throughout (the 54-day snapshot's size; Table 4's 8,192-GPU configuration of the early phase is not
  modelled);
* 8K stage: 14.8T tokens at seq 8192, 16M tokens per step (GBS 2048), TP 8 / PP 16 / DP 128 (Table 4); the early
  batch ramp (4M tokens per step at seq 4096 for 252M tokens, 8M to 2.87T tokens; Sec. 3.4.1) is counted at 16M;
* long-context stage: "approximately 800B training tokens" (Sec. 3.4.2) at seq 131,072, 16M tokens per step
  (GBS 128), TP 8 / CP 16 / PP 16 / DP 8 (Table 4); its six steps of growing length are counted at 128K;
* interleaved 1F1B with 8 chunks per stage: 126 layers = 16 x 8 - 2, one layer fewer on the first and last stage
  (Sec. 3.3.2; Megatron --account-for-embedding/loss-in-pipeline-split), micro-batch 1, sequence parallel;
* gradients reduced once per step with the optimizer states sharded over DP (Megatron's distributed optimizer,
  ZeRO-1). Meta's FSDP also shards the gradients (ZeRO-2 memory, Sec. 3.3.2); plan3d's ZeRO-2 reduce-scatters them
  in every micro-batch, exposed (2.2 s of an 8.0 s step), which gives 325 TFLOP/s per GPU where Meta measured 400
  (Table 4) and 37.0M GPU-hours (+20%). With ZeRO-1 the 8K step gives 441 TFLOP/s, 10.3% above the measured 400
  (435, +8.7%, with the constants of the coarser fit grid before 2026-12-04; 415 while the planner costed Megatron's
  DP reduction exposed; plan3d's launch overlaps it, ``planner/launch_options.py``), and that is the step the
  GPU-hours below use (``test_llama31_405b_step_matches_meta_tflops``);
* failures: Meta's 419 interruptions in 54 days (1.97e-5 per GPU-hour), 6.47-min restarts, synchronous checkpoints
  to Tectonic (2 TB/s) at the Young/Daly interval (the cluster spec's defaults).

The 30.84M may include work beyond pre-training (the model card gives one figure for "training"); plan3d's memory
model predicts the published 8K layout over capacity (it ran), which does not change its step time.

DeepSeek-V3: 2,664K H800 GPU-hours for pre-training on 14.8T tokens (arXiv 2412.19437, Table 1), 2,048 H800s, PP 16,
EP 64 over 8 nodes, ZeRO-1 DP, no TP, FP8 GEMMs, seq 4096, 15,360 sequences per step (Sec. 3.2, 4.2; the batch ramp
from 3,072 over the first 469B tokens is counted at 15,360), DualPipe.
"""
from __future__ import annotations

import pytest

import planner

LLAMA_PUBLISHED_GPU_HOURS = 30.84e6
DEEPSEEK_PUBLISHED_GPU_HOURS = 2.664e6
LLAMA_LAYOUT = dict(gpus=16384, tp=8, pp=16, vpp=8, sequence_parallel=True, zero_stage=1)


@pytest.fixture(scope="module")
def llama_stages():
    short = planner.evaluate("llama3.1-405b", "dgx-h100", global_batch_size=2048, seq_length=8192,
                             train_tokens=14.8e12, **LLAMA_LAYOUT).plans[0]
    long = planner.evaluate("llama3.1-405b", "dgx-h100", global_batch_size=128, seq_length=131072, cp=16,
                            train_tokens=0.8e12, **LLAMA_LAYOUT).plans[0]
    return short, long


def test_llama31_405b_gpu_hours_within_20pct(llama_stages):
    short, long = llama_stages
    assert short.parallel.account_for_embedding_in_pipeline_split  # 126 = 16 x 8 - 2
    predicted = short.cost.gpu_hours + long.cost.gpu_hours
    error = predicted / LLAMA_PUBLISHED_GPU_HOURS - 1
    assert abs(error) <= 0.20, f"predicted {predicted / 1e6:.2f}M GPU-hours, {error:+.1%}"
    # the numbers the report quotes: 27.8M GPU-hours (-10.0%; 28.2M, -8.6%, with the constants of the coarser fit grid
    # before 2026-12-04; 29.6M, -4.0%, with the DP reduction costed exposed; plan3d's Megatron launch overlaps it)
    assert predicted == pytest.approx(27.75e6, rel=0.02)
    days = short.cost.effective_days + long.cost.effective_days
    assert 60 < days < 90


def test_llama31_405b_step_matches_meta_tflops(llama_stages):
    """The step the GPU-hours rest on: Meta measured 400 TFLOP/s per GPU (BF16 MFU 41%) on this 8K layout and 380
    at 128K (Llama 3 paper Table 4)."""
    short, long = llama_stages
    # held out of the fit: +10.3% (441 TFLOP/s) since the constants were refitted on the finer grid (2026-12-04), which
    # took the dev rows' leave-one-group-out MAPE from 6.67% to 6.54% and in-sample from 5.34% to 5.26% (with this
    # step as a 92nd row, 5.38% -> 5.31%); +8.7% (435) before. The ZeRO-1 assumption above leaves out the gradient
    # sharding Meta's FSDP ran, which would slow the step.
    assert short.throughput.tflops_per_gpu == pytest.approx(441.4, rel=0.01)
    assert abs(short.throughput.tflops_per_gpu / 400 - 1) <= 0.11
    # at 128K attention is 65% of the compute and the FLOP convention decides the figure: 305 TFLOP/s counting the
    # causal attention at half (Megatron's logger, used here), 428 counting it in full (PaLM); Meta's 380 lies between.
    # The stage is 10% of the GPU-hours.
    assert 0.75 * 380 < long.throughput.tflops_per_gpu < 380


def test_llama31_405b_goodput_matches_meta(llama_stages):
    """Meta: more than 90% effective training time; the model's goodput for the run agrees within 5 points."""
    for p in llama_stages:
        assert 0.90 < p.cost.goodput_fraction <= 0.95
        assert p.cost.expected_interruptions > 0 and p.cost.mtbf_s == pytest.approx(54 * 24 / 419 * 3600, rel=1e-3)


@pytest.fixture(scope="module")
def deepseek_plan():
    """DeepSeek-V3's layout on the built-in dgx-h800 (H100 compute, NVLink 200 GB/s per direction, 8 x 400 Gb/s IB)
    at the cluster's default price, DeepSeek's own $2 per GPU-hour."""
    return planner.evaluate("deepseek-v3", "dgx-h800", gpus=2048, global_batch_size=15360, seq_length=4096,
                            tp=1, pp=16, ep=64, zero_stage=1, precision="fp8", train_tokens=14.8e12).plans[0]


@pytest.mark.xfail(strict=True, reason="under 1F1B the EP all-to-all DeepSeek overlaps with compute (DualPipe) is "
                                       "exposed (5.7 s of a 28.7 s step) and the pipeline bubble (2.6 s) is 1F1B's, "
                                       "so the GPU-hours come out 49% high (3.97M against 2.664M)")
def test_deepseek_v3_gpu_hours_within_20pct(deepseek_plan):
    error = deepseek_plan.cost.gpu_hours / DEEPSEEK_PUBLISHED_GPU_HOURS - 1
    assert abs(error) <= 0.20, f"predicted {deepseek_plan.cost.gpu_hours / 1e6:.3f}M GPU-hours, {error:+.1%}"


def test_deepseek_v3_miss_is_the_exposed_expert_all_to_all(deepseek_plan):
    """Without the exposed EP all-to-all (what DualPipe hides behind the paired micro-batch's compute) and the
    pipeline bubble (which DualPipe's bidirectional schedule shrinks; DeepSeek-V3 Sec. 3.2.1) the same plan's
    GPU-hours fall within 20% of the published figure (2.83M, +6.1%; the last stage, 2 layers + MTP + two bf16 output
    heads, is the busiest): the miss is the missing schedule, not the goodput model (96.7% here: one interruption
    every 24.7 h on 2,048 GPUs)."""
    p = deepseek_plan
    t = p.time
    hidden = (t.step_s - t.exposed_comm_s["ep"] - t.bubble_s) / t.step_s
    error = p.cost.gpu_hours * hidden / DEEPSEEK_PUBLISHED_GPU_HOURS - 1
    assert abs(error) <= 0.20, f"{error:+.1%}"
    assert 0.96 < p.cost.goodput_fraction < 0.98
    assert p.cost.usd_per_gpu_hour == 2.0 and p.cost.price_date == "2024-12-27"
