"""FP8 physics that the cost model takes from the frameworks' source and plan3d's own H200 measurement: the forward
GEMMs' fast accumulation (``gemm.FP8_FAST_ACCUM_SPEEDUP``) and the amax pass of per-tensor current scaling
(``elementwise.FP8_AMAX_PASS_BYTES``)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model

ROOT = Path(__file__).resolve().parents[1]
H100, B200, MI300X = get_cluster("dgx-h100"), get_cluster("dgx-b200"), get_cluster("mi300x")
L8, QWEN = get_model("llama3.1-8b"), get_model("qwen3-30b-a3b")
FP8 = TrainingJob(global_batch_size=128, seq_length=8192, precision="fp8")
BF16 = TrainingJob(global_batch_size=128, seq_length=8192, precision="bf16")


def test_fast_accumulation_speedup_is_the_shipped_h200_measurement():
    # benchmarks/measure_device.py section fp8_accumulation: split / fast accumulation time, median over the shapes
    # with every dimension >= 2048 (32 of 44), 0.955 -> FP8_FAST_ACCUM_SPEEDUP = 1 / 0.955
    from cost_models.gemm import FIT_RANGES, FP8_FAST_ACCUM_SPEEDUP
    doc = json.loads((ROOT / "benchmarks" / "data" / "measured_h200_20261204_fp8_accumulation.json").read_text())
    assert doc["environment"]["gpu"] == "NVIDIA H200"
    rows = [r for r in doc["fp8_accumulation"] if min(r["m"], r["n"], r["k"]) >= 2048]
    ratios = [r["fp8_fast_s"] / r["fp8_split_s"] for r in rows]
    assert len(rows) == 32
    assert statistics.median(ratios) == pytest.approx(0.955, abs=0.0005)
    assert all(0.86 < x < 1.0 for x in ratios)  # the split accumulator is never faster at these shapes
    assert FP8_FAST_ACCUM_SPEEDUP == pytest.approx(1 / 0.955)
    assert "FP8_FAST_ACCUM_SPEEDUP" not in FIT_RANGES  # measured, not fitted


def test_forward_fp8_gemms_run_at_the_fast_rate_only_where_that_was_measured():
    from cost_models.gemm import FP8_FAST_ACCUM_SPEEDUP, fprop_rate_factor
    par = ParallelConfig(dp=8)
    assert fprop_rate_factor(L8, H100, FP8, par) == FP8_FAST_ACCUM_SPEEDUP  # Hopper, per-tensor (delayed) recipe
    tensorwise = FP8.model_copy(update={"fp8_recipe": "tensorwise"})
    assert fprop_rate_factor(QWEN, H100, tensorwise, par) == FP8_FAST_ACCUM_SPEEDUP  # a MoE model, per-tensor too
    assert fprop_rate_factor(L8, H100, BF16, par) == 1.0
    assert fprop_rate_factor(L8, B200, FP8, par) == 1.0  # Blackwell (MXFP8 by default): not measured
    assert fprop_rate_factor(L8, B200, tensorwise, par) == 1.0
    assert fprop_rate_factor(QWEN, H100, FP8, par) == 1.0  # MoE on Hopper: blockwise by default, not measured
    assert fprop_rate_factor(L8, MI300X, FP8, par) == 1.0  # not NVIDIA


def test_backward_gemms_keep_the_split_accumulator_rate(monkeypatch):
    # TE _2X_ACC_DGRAD / _2X_ACC_WGRAD: the two backward GEMMs per forward GEMM at the MAMF (split) rate; only the
    # forward's compute term is faster, so in BF16 the backward is exactly twice the forward, in Hopper FP8 more
    from cost_models.gemm import FP8_FAST_ACCUM_SPEEDUP, KAPPA, gemm_rate, hbm_rate, layer_gemms_s
    par = ParallelConfig(dp=8)
    fwd, _, _, bwd, _ = layer_gemms_s(L8, H100, BF16, par, 0, "megatron")
    assert bwd == pytest.approx(2 * fwd)
    fwd8, _, _, bwd8, _ = layer_gemms_s(L8, H100, FP8, par, 0, "megatron")
    import cost_models.gemm as gemm_mod
    monkeypatch.setattr(gemm_mod, "FP8_FAST_ACCUM_SPEEDUP", 1.0)
    fwd_split, _, _, bwd_split, _ = layer_gemms_s(L8, H100, FP8, par, 0, "megatron")
    monkeypatch.undo()
    assert bwd8 == pytest.approx(bwd_split) and bwd_split == pytest.approx(2 * fwd_split)  # backward: split rate
    assert fwd_split / FP8_FAST_ACCUM_SPEEDUP < fwd8 < fwd_split  # only the compute term speeds up
    # one GEMM: QKV of Llama 3.1 8B at 8192 tokens (k 4096, n 4096 + 2 x 1024), 1-byte operands
    m, k, n = 8192, 4096, 6144
    rate, hbm = gemm_rate(H100, "fp8"), hbm_rate(H100)
    stream = KAPPA * (m * k + k * n + m * n) / hbm
    assert bwd8 / fwd8 > 2.0
    from cost_models.gemm import gemm_time
    assert gemm_time(m, k, n, rate * FP8_FAST_ACCUM_SPEEDUP, hbm, 1.0) == pytest.approx(
        2 * m * k * n / rate / FP8_FAST_ACCUM_SPEEDUP + stream)


def test_expert_gemms_and_the_tp_backward_window_follow_the_two_rates():
    # the per-expert host time subtracts each expert GEMM's own duration: forward at the fast rate, dgrad / wgrad at
    # the split rate; the backward TP collectives hide under the weight-gradient GEMMs (half the backward's)
    from cost_models.collectives import TP_BACKWARD_OVERLAP_WINDOW
    from cost_models.gemm import FP8_FAST_ACCUM_SPEEDUP, expert_gemms_s
    from cost_models.layer_cost import LayerCost
    par = ParallelConfig(dp=2, ep=8)
    tensorwise = FP8.model_copy(update={"fp8_recipe": "tensorwise"})
    f1, f2, b1, b2 = expert_gemms_s(QWEN, H100, tensorwise, par, "megatron")
    assert b1 / FP8_FAST_ACCUM_SPEEDUP < f1 < b1 and b2 / FP8_FAST_ACCUM_SPEEDUP < f2 < b2
    assert expert_gemms_s(QWEN, H100, BF16, par, "megatron")[:2] == expert_gemms_s(QWEN, H100, BF16, par,
                                                                                   "megatron")[2:]
    assert expert_gemms_s(L8, H100, FP8, par, "megatron") == (0.0, 0.0, 0.0, 0.0)
    # a layer with 3 ms of forward and 8 ms of backward GEMMs (FP8 forward faster) and 1.8 ms of overlapped TP
    # communication: the window is 0.5 x the 4 ms of weight-gradient GEMMs (2 ms), so only the GEMMs' slowdown is
    # charged; 0.5 x the forward's 3 ms would have left 0.3 ms exposed
    x = LayerCost(gemm=3e-3, gemm_backward=8e-3, tp=1.8e-3)
    from cost_models.data_parallel import OVERLAP_COMPUTE_SLOWDOWN, overlapped_exposed_s
    assert x.tp_backward_s((0.0, 1.0)) == pytest.approx(OVERLAP_COMPUTE_SLOWDOWN * 1.8e-3)
    moe = LayerCost(gemm=3e-3, gemm_mlp=2e-3, gemm_backward=8e-3, gemm_backward_mlp=6e-3, tp=1e-3, moe=True)
    assert moe.tp_backward_s((0.0, 1.0)) == pytest.approx(
        overlapped_exposed_s(1e-3, TP_BACKWARD_OVERLAP_WINDOW * 1e-3))  # the attention block's wgrad GEMMs only
    assert TP_BACKWARD_OVERLAP_WINDOW == 0.5


def test_current_scaling_reads_each_cast_tensor_once_more():
    # TE Float8CurrentScalingQuantizer: amax kernel, then the cast (read 2 + write 1); delayed scaling records the amax
    # inside the cast: 5 bytes against 3 per cast element
    from cost_models.elementwise import FP8_AMAX_PASS_BYTES, FP8_CAST_BYTES, fp8_cast_s
    from cost_models.fp8_recipe import job_fp8_recipe
    par = ParallelConfig(dp=8)
    delayed = fp8_cast_s(L8, H100, FP8, par, 0, "megatron")
    current = fp8_cast_s(L8, H100, FP8.model_copy(update={"fp8_recipe": "tensorwise"}), par, 0, "megatron")
    assert (FP8_CAST_BYTES, FP8_AMAX_PASS_BYTES) == (3.0, 2.0)
    assert current == pytest.approx(delayed * 5 / 3)
    # defaults: Megatron dense Hopper delayed (Megatron-LM examples/llama), torchtitan's float8 dynamic tensorwise
    assert job_fp8_recipe(FP8, H100, L8, par, "megatron") == "delayed"
    assert job_fp8_recipe(FP8, H100, L8, par, "torchtitan_compile") == "tensorwise"
    assert fp8_cast_s(L8, H100, FP8, par, 0, "torchtitan") == pytest.approx(current)
    # the block-scaled recipes compute their block amaxes inside the cast
    mx = FP8.model_copy(update={"fp8_recipe": "mxfp8"})
    assert fp8_cast_s(L8, B200, mx, par, 0, "megatron") == pytest.approx(
        fp8_cast_s(L8, B200, FP8.model_copy(update={"fp8_recipe": "delayed"}), par, 0, "megatron"))


def test_a_rows_precision_names_its_fp8_recipe():
    from planner.row_options import row_fp8_recipe

    def row(precision, features=None):
        return {"parallel": {"precision": precision, "other": {"features": features} if features else None}}

    assert row_fp8_recipe(row("FP8-CS")) == "tensorwise"
    assert row_fp8_recipe(row("bf16 + float8 tensorwise linears")) == "tensorwise"
    assert row_fp8_recipe(row("FP8-MX")) == "mxfp8"
    assert row_fp8_recipe(row("fp8", "blockwise scaling")) == "blockwise"
    assert row_fp8_recipe(row("fp8 (hybrid format)")) is None  # the framework's default
    assert row_fp8_recipe(row("bf16")) is None


def test_the_emitted_megatron_flags_name_the_jobs_recipe():
    from planner.emit.megatron import megatron_args
    par = ParallelConfig(dp=8)
    args = megatron_args(L8, FP8.model_copy(update={"fp8_recipe": "tensorwise"}), par, H100)
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    args = megatron_args(L8, FP8, par, H100)
    assert args[args.index("--fp8-recipe") + 1] == "delayed"


def test_the_host_cost_class_follows_the_recipe_the_job_runs():
    # torchtitan's float8 is per-tensor (tensorwise) also for a MoE model on Hopper, where Megatron's default is
    # blockwise: its per-expert quantize host time is the per-tensor class
    from cost_models.fp8_recipe import job_host_cost_class
    par = ParallelConfig(dp=8, ep=8)
    assert job_host_cost_class(FP8, H100, QWEN, par, "megatron") == "mx"
    assert job_host_cost_class(FP8, H100, QWEN, par, "torchtitan") == "cs"
    assert job_host_cost_class(FP8.model_copy(update={"fp8_recipe": "tensorwise"}), H100, QWEN, par) == "cs"


def test_row_recipe_words_match_whole_words_only():
    from planner.row_options import row_fp8_recipe
    assert row_fp8_recipe({"parallel": {"precision": "fp8", "other": {"features": "mxnet-style loader"}}}) is None
    assert row_fp8_recipe({"parallel": {"precision": "fp8 delayed scaling"}}) == "delayed"
