"""Fused-attention occupancy: the share of a kernel's saturated rate one call reaches against its thread blocks per
SM (``attention.yaml`` ``occupancy``), measured by plan3d on one H200 on 2026-12-04 (``benchmarks/measure_device.py``
section ``attention_shape``; raw results ``benchmarks/data/measured_h200_20261204_attention_shape*.json``).

Expected values are those measurements: e.g. cuDNN at 256 work units (1.94 per SM) runs 0.67 of the forward rate of
the 16-head x 16,384-token benchmark shape at the same length, FlashAttention-2 0.58.
"""
from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import pytest

from cluster_specs.efficiency import _table, attention_occupancy, attention_sm_count, attention_tflops
from cluster_specs.loaders import get_cluster
from cost_models.attention import _kernel_tflops, attention_work_units
from cost_models.config import ParallelConfig
from model_zoo.loaders import get_model

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("measured_h200_20261204_attention_shape.json", "measured_h200_20261204_attention_shape_2.json")


def _measured_curve() -> dict[tuple[str, int], tuple[float, float]]:
    """(kernel, work units) -> (forward, backward) ratio to the benchmark shape, mean over lengths and both runs
    (head dim 128, micro-batch 1: the main sweep)."""
    per_run = []
    for name in RUNS:
        doc = json.loads((ROOT / "benchmarks" / "data" / name).read_text())
        rows = doc["attention_shape"]
        bench = {(r["backend"], r["seq"], r["head_dim"]): r for r in rows if r["shape"] == "benchmark"}
        agg = collections.defaultdict(list)
        for r in rows:
            if r["shape"] != "training" or r["batch"] != 1 or r["head_dim"] != 128:
                continue
            b = bench[(r["backend"], r["seq"], 128)]
            units = r["heads"] * math.ceil(r["seq"] / 128)
            agg[(r["backend"], units)].append((r["forward_tflops"] / b["forward_tflops"],
                                               r["backward_tflops"] / b["backward_tflops"]))
        per_run.append({k: (sum(x[0] for x in v) / len(v), sum(x[1] for x in v) / len(v)) for k, v in agg.items()})
    return {k: ((per_run[0][k][0] + per_run[1][k][0]) / 2, (per_run[0][k][1] + per_run[1][k][1]) / 2)
            for k in per_run[0]}


def test_shipped_curve_is_the_measurement():
    measured = _measured_curve()
    occ = _table("attention")["occupancy"]
    assert occ["query_tile"] == 128
    for kernel in ("cudnn", "flash2"):
        curve = occ["kernels"][kernel]
        for i, x in enumerate(occ["units_per_sm"][:-1]):  # the last point is held at 1 (saturated)
            units = round(x * 132)
            fwd, bwd = measured[(kernel, units)]
            assert curve["forward"][i] == pytest.approx(fwd, abs=0.01), (kernel, units)
            assert curve["backward"][i] == pytest.approx(bwd, abs=0.01), (kernel, units)
        # from 2048 units (15.5 per SM) on, every measured point is 1 within 6%
        for (k, units), (fwd, bwd) in measured.items():
            if k == kernel and units >= 2048:
                assert fwd == pytest.approx(1.0, abs=0.06) and bwd == pytest.approx(1.0, abs=0.06), (k, units)


def test_occupancy_reads_the_curve_and_holds_its_ends():
    assert attention_occupancy("cudnn", 256 / 132) == pytest.approx((0.67, 0.65), abs=0.002)
    assert attention_occupancy("flash2", 512 / 132) == pytest.approx((0.74, 0.91), abs=0.002)
    assert attention_occupancy("cudnn", 100.0) == (1.0, 1.0)
    assert attention_occupancy("flash2", 0.1) == (0.37, 0.31)
    assert attention_occupancy("no-such-kernel", 1.0) == (1.0, 1.0)
    assert attention_sm_count("H200") == 132 and attention_sm_count("GB200") == 148
    assert attention_sm_count("B300") == 160 and attention_sm_count("A800") == 108
    assert attention_sm_count("MI300X") is None


def test_a_saturated_benchmark_series_reads_as_published_at_its_own_units():
    # the FA3 paper's FlashAttention-2 series was measured at 2048 units (16 heads x 16,384 tokens): saturated
    assert attention_tflops("H100", "flash2", 8192, 128, units=2048) == pytest.approx((333.0, 299.0))
    fwd, bwd = attention_tflops("H100", "flash2", 8192, 128, units=256)
    assert (fwd / 333.0, bwd / 299.0) == pytest.approx(attention_occupancy("flash2", 256 / 132))


def test_a_low_occupancy_benchmark_point_is_first_brought_to_saturation():
    # cuDNN 9.19 at 2048 tokens was measured with 64 heads x 1 sequence = 1024 units (0.94 / 0.96 of saturated)
    fwd, bwd = attention_tflops("H100", "cudnn", 2048, 128, units=4096)
    assert fwd == pytest.approx(484.0 / 0.94, rel=1e-3) and bwd == pytest.approx(370.0 / 0.96, rel=1e-3)
    # at the benchmark's own units the published value comes back
    assert attention_tflops("H100", "cudnn", 2048, 128, units=1024) == pytest.approx((484.0, 370.0), rel=1e-3)
    # a GPU scaled from another's series reads its own SM count: A100 (108 SMs) at 256 units is 2.37 per SM
    a100 = attention_tflops("A100", "flash2", 8192, 128, units=256)
    sat = attention_tflops("A100", "flash2", 8192, 128)
    assert (a100[0] / sat[0], a100[1] / sat[1]) == pytest.approx(attention_occupancy("flash2", 256 / 108))


def test_work_units_follow_tensor_and_context_parallelism():
    model = get_model("llama3.1-70b")  # 64 query heads
    assert attention_work_units(model, ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1), 4096) == 2048
    assert attention_work_units(model, ParallelConfig(tp=8, pp=1, dp=1, micro_batch_size=1), 4096) == 256
    assert attention_work_units(model, ParallelConfig(tp=8, pp=1, dp=1, micro_batch_size=2), 4096 / 2) == 256
    # 70B at TP 8 and 4k tokens: cuDNN at 0.67 / 0.65 of the rate it has at TP 1 (newest series, 4096 tokens)
    cluster = get_cluster("dgx-h100")
    tp8 = _kernel_tflops(model, cluster, "megatron", 4096, None, 256)
    tp1 = _kernel_tflops(model, cluster, "megatron", 4096, None, 2048)
    assert (tp8[0] / tp1[0], tp8[1] / tp1[1]) == pytest.approx((0.67, 0.65), abs=0.003)


def test_occupancy_holds_inside_a_training_step():
    # benchmarks/data/measured_h200_20261204_layer_step.json: FlashAttention-2 kernel time inside the forward +
    # backward of two 4-layer stacks on one H200: Llama 3 8B at 8k tokens (32 heads: 2048 blocks, saturated) and one
    # TP-8 rank's share of Llama 3 70B at 4k tokens (8 heads: 256 blocks, 1.94 per SM). The model, which reads the
    # occupancy curve, must give the same ratio between the two as the step measured.
    doc = json.loads((ROOT / "benchmarks" / "data" / "measured_h200_20261204_layer_step.json").read_text())
    step = {r["model"]: r for r in doc["layer_step"]}

    def measured(name):
        k = step[name]["attention_kernels_s"]
        fwd = sum(v for n, v in k.items() if "fwd" in n)
        return fwd, sum(k.values()) - fwd

    from cost_models.attention import attention_core_s
    from cost_models.config import TrainingJob
    cluster = get_cluster("dgx-h200")

    def model(name, tp, seq):
        return attention_core_s(get_model(name), cluster, TrainingJob(global_batch_size=8, seq_length=seq),
                                ParallelConfig(tp=tp, pp=1, dp=8 // tp, micro_batch_size=1), "torchtitan")

    m8, m70 = measured("llama3-8b-layer"), measured("llama3-70b-layer-tp8-rank")
    p8, p70 = model("llama3.1-8b", 1, 8192), model("llama3.1-70b", 8, 4096)
    for i in (0, 1):  # forward, backward
        assert p70[i] / p8[i] == pytest.approx(m70[i] / m8[i], rel=0.05), i
    # without the occupancy (both calls at the saturated rate) the 70B rank's share would be 0.58 / 0.71 of that
    occ = attention_occupancy("flash2", 256 / 132)
    for i in (0, 1):
        assert p70[i] / p8[i] * occ[i] < 0.8 * m70[i] / m8[i], i


def test_non_causal_ratio_is_the_h200_measurement():
    # benchmarks/data/measured_h200_20261204.json, section attention: 16 heads x 16,384 tokens, head dim 128
    from cluster_specs.efficiency import attention_non_causal_ratio
    doc = json.loads((ROOT / "benchmarks" / "data" / "measured_h200_20261204.json").read_text())
    for kernel in ("cudnn", "flash2"):
        rows = {(r["seq"], r["causal"]): r for r in doc["attention"]
                if r["backend"] == kernel and r["head_dim"] == 128 and "error" not in r}
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            fwd = rows[(seq, False)]["forward_tflops"] / rows[(seq, True)]["forward_tflops"]
            bwd = rows[(seq, False)]["backward_tflops"] / rows[(seq, True)]["backward_tflops"]
            assert attention_non_causal_ratio(kernel, seq) == pytest.approx((fwd, bwd), abs=0.006), (kernel, seq)
    assert attention_non_causal_ratio("cudnn", 65536) == (1.09, 1.0)  # held at the longest measured length
    assert attention_non_causal_ratio("no-such-kernel", 4096) == (1.0, 1.0)


def test_ring_calls_are_the_load_balanced_ring_of_te_and_pytorch():
    from cost_models.attention import ring_attention_calls
    assert ring_attention_calls(8192, 1) == ((1.0, 8192, 8192, True),)
    # CP 4 at 8k: 2048 tokens a rank; the diagonal (causal) call, then calls from lower ranks (all 2048 queries
    # against the first 1024-key chunk) and from higher ranks (the second 1024-query chunk against all 2048 keys)
    calls = ring_attention_calls(8192, 4)
    assert calls == ((0.25, 2048, 2048, True), (0.375, 1024, 2048, False), (0.375, 2048, 1024, False))
    assert sum(c[0] for c in calls) == pytest.approx(1.0)
