"""benchmarks/measure_device.py (the GPU efficiency measurements) on the CPU: every section's code path on tiny
shapes, and the FLOP / byte accounting its figures rest on; and the shipped H200 measurements it produced."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str):
    """A script of benchmarks/ imported by path (its sibling imports resolve through sys.path)."""
    import sys
    pytest.importorskip("torch")
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _module():
    return _bench("measure_device")


def test_dry_run_measures_every_section_with_its_flop_accounting(tmp_path):
    mod = _module()
    out = tmp_path / "m.json"
    assert mod.main(["--dry-run", "--out", str(out),
                     "--sections", "gemm,attention,grouped_gemm,hbm,memory_bound,sustained_gemm,attention_gqa,"
                     "attention_shape,layer_step,fp8_accumulation"]) == 0
    doc = json.loads(out.read_text())
    for section in ("gemm", "attention", "grouped_gemm", "hbm", "memory_bound", "sustained_gemm", "attention_gqa",
                    "attention_shape", "layer_step", "fp8_accumulation"):
        assert isinstance(doc[section], list) and doc[section], section
        assert not [r for r in doc[section] if "error" in r], section  # every code path ran
    for r in doc["gemm"]:  # 2 M N K FLOPs per product
        assert r["tflops"] == pytest.approx(2.0 * r["m"] * r["n"] * r["k"] / r["seconds"] / 1e12)
    for r in doc["attention"]:  # FlashAttention-2 paper Sec. 4.1: 4 s^2 d h per sequence, halved causal; bwd 2.5x
        fwd = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] / (2.0 if r["causal"] else 1.0)
        assert r["forward_tflops"] == pytest.approx(fwd / r["forward_s"] / 1e12)
        assert r["backward_tflops"] == pytest.approx(2.5 * fwd / r["backward_s"] / 1e12)
        assert r["batch"] * r["seq"] == 256  # the dry run's tokens per batch, as the papers hold 16k fixed
    for r in doc["attention_shape"]:  # causal FLOPs of the call's own shape: batch x heads, halved
        fwd = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] / 2.0
        assert r["forward_tflops"] == pytest.approx(fwd / r["forward_s"] / 1e12)
    assert {r["shape"] for r in doc["attention_shape"]} == {"benchmark", "training"}
    for r in doc["fp8_accumulation"]:  # each timing's TFLOP/s key, 2 M N K over its seconds (no FP8 on the CPU)
        assert r["bf16_tflops"] == pytest.approx(2.0 * r["m"] * r["n"] * r["k"] / r["bf16_s"] / 1e12)
    copy = next(r for r in doc["hbm"] if r["kernel"] == "copy")
    assert copy["bytes_moved"] == 2 * copy["buffer_bytes"]  # read + write
    adam = next(r for r in doc["memory_bound"] if r["kernel"] == "adamw_fused_fp32")
    assert adam["bytes_per_param"] == 28  # p, g, m, v read (16) + p, m, v written (12), FP32


def test_dry_run_needs_no_gpu_and_a_real_run_refuses_without_one(tmp_path, capsys):
    mod = _module()
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert mod.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_shipped_h200_measurements_are_what_the_attention_table_quotes():
    # cluster_specs/data/efficiency/attention.yaml takes causal / non-causal backward ratios from this file
    doc = json.loads((ROOT / "benchmarks" / "data" / "measured_h200_20261204.json").read_text())
    assert doc["environment"]["gpu"] == "NVIDIA H200" and doc["environment"]["cudnn"] == 91900

    def bwd(backend, seq, causal):
        return next(r["backward_tflops"] for r in doc["attention"] if r["backend"] == backend and r["head_dim"] == 128
                    and r["seq"] == seq and r["causal"] is causal)

    import yaml
    table = yaml.safe_load((ROOT / "cluster_specs" / "data" / "efficiency" / "attention.yaml").read_text())
    h100 = table["gpus"]["H100"]["kernels"]
    seqs = table["sequence_lengths"]
    published_non_causal = {"flash2": [214, 260, 291, 310, 318, 322], "cudnn": [305, 408, 465, 499, 518, 516]}
    shipped = {"flash2": h100["flash2"]["backward"], "cudnn": h100["cudnn"]["earlier"][0]["backward"]}
    for kernel, nc in published_non_causal.items():
        for s, published, value in zip(seqs, nc, shipped[kernel]):
            ratio = min(1.0, bwd(kernel, s, True) / bwd(kernel, s, False))
            assert value == round(published * ratio), (kernel, s)
            assert 0.6 < ratio <= 1.0 and (s < 16384 or math.isclose(ratio, 1.0, abs_tol=0.03))


def test_host_time_per_expert_gemm_call_is_the_measured_median():
    # moe_overhead.HOST_GEMM_S is measured, not fitted: the median host time per call of the looped expert GEMMs that
    # were host-bound (the loop over 1.5x the grouped GEMM's GPU time) on the H200 machine (benchmarks/gemm_measured.py)
    import statistics

    from cost_models.moe_overhead import FIT_RANGES, HOST_GEMM_S
    doc = json.loads((ROOT / "benchmarks" / "data" / "measured_h200_20261204.json").read_text())
    host = [r["loop_s"] / r["local_experts"] for r in doc["grouped_gemm"] if r["loop_s"] > 1.5 * r["grouped_s"]]
    assert len(host) == 27
    assert HOST_GEMM_S == pytest.approx(statistics.median(host), abs=0.05e-6)
    assert "HOST_GEMM_S" not in FIT_RANGES


def test_an_unknown_section_is_refused_in_one_line(tmp_path, capsys):
    mod = _module()
    assert mod.main(["--dry-run", "--out", str(tmp_path / "x.json"), "--sections", "gemm,nccl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --sections nccl: allowed hbm, memory_bound, gemm,") and "\n" not in err
    assert not (tmp_path / "x.json").exists()


def test_moe_routing_dry_run_times_every_pytorch_path(tmp_path):
    # benchmarks/moe_routing_device.py on the CPU: Megatron-LM's unfused router and permutation, top-k and the copy
    # (the Triton path needs a GPU or TRITON_INTERPRET=1 and is skipped here)
    mod = _bench("moe_routing_device")
    out = tmp_path / "r.json"
    assert mod.main(["--dry-run", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["moe_routing"]
    assert {r["path"] for r in rows} >= {"router", "unfused", "topk", "copy"}
    assert not [r for r in rows if "error" in r]
    for r in rows:
        assert r["routed_copies"] == r["tokens"] * r["top_k"]
        if r["path"] == "copy":  # read + write of the routed copies, BF16
            assert r["bytes_moved"] == 2 * 2 * r["routed_copies"] * r["hidden"]


def test_moe_routing_chunk_orders_invert_each_other():
    # MoEAlltoAllTokenDispatcher sorts the received (rank, local expert) chunks to (local expert, rank) and back
    mod = _bench("moe_routing_device")
    order, back = mod.chunk_order(128)
    assert order.tolist()[:3] == [0, 16, 32]  # 8 ranks x 16 local experts: expert 0 of ranks 0, 1, 2 first
    assert order[back].tolist() == list(range(128))


def test_routing_constants_are_what_the_shipped_h200_measurement_gives():
    # moe_overhead.PERMUTE_HBM_FRACTION and ROUTER_KERNEL_S are measured, not fitted
    # (benchmarks/moe_routing_measured.py)
    import statistics

    from cost_models.moe_overhead import FIT_RANGES, PERMUTE_HBM_FRACTION, ROUTER_KERNEL_S
    mod = _bench("moe_routing_measured")
    env, rows, peak = mod.load()
    assert env["gpu"] == "NVIDIA H200" and peak == 4.8e12
    shares = mod.hbm_shares(rows, "fused", peak) + mod.hbm_shares(rows, "fused_nosort", peak)
    assert len(shares) == 27  # 4 models x 4 token counts, with and without the chunk sort, one compile failure
    large = [r for r in rows if r["tokens"] >= 4096]  # training micro-batches
    train = mod.hbm_shares(large, "fused", peak) + mod.hbm_shares(large, "fused_nosort", peak)
    assert len(train) == 21 and PERMUTE_HBM_FRACTION == pytest.approx(statistics.median(train), abs=0.0005)
    copy = mod.hbm_shares(rows, "copy", peak)
    assert max(shares) < min(copy) + 0.01 < 0.9  # the permutation kernels stay below a plain copy of the same bytes
    coef, worst = mod.router_fit(rows)
    assert list(ROUTER_KERNEL_S) == pytest.approx(list(coef), rel=0.01) and worst < 0.15
    assert "PERMUTE_HBM_FRACTION" not in FIT_RANGES and "ROUTER_KERNEL_S" not in FIT_RANGES
