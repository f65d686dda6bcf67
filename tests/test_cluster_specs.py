"""Tests for cluster_specs: datasheet values, units, validation, loaders, error messages.

Expected numbers are the published ones from /work/shared/data/hardware.yaml (vendor datasheets,
nvidia-smi reports, stas00/ml-engineering MAMF measurements, NVIDIA nccl-tests figures).
"""
from __future__ import annotations

import copy

import pytest
import yaml

from cluster_specs import (
    DEFAULT_CLUSTER,
    Calibration,
    ClusterSpec,
    ClusterSpecError,
    dump_cluster,
    get_cluster,
    list_clusters,
    load_cluster,
    resolve_num_gpus,
)

BUILTINS = ["dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300", "gb200-nvl72",
            "gb300-nvl72", "mi300x", "dgx-h800", "a800-roce", "jean-zay-a100", "grand-teton-h100"]
MiB = 2**20
GiB = 2**30


def test_builtin_names_exact():
    assert sorted(list_clusters()) == sorted(BUILTINS)
    assert DEFAULT_CLUSTER == "dgx-h100"
    assert DEFAULT_CLUSTER in list_clusters()
    for name in BUILTINS:
        spec = get_cluster(name)
        assert spec.name == name
        assert spec.description.strip()
        assert load_cluster(name) == spec


# ---------------------------------------------------------------- datasheet values
def test_h100_dense_peaks_not_sparse():
    h100 = get_cluster("dgx-h100")
    assert h100.peak_flops("bf16") == 989.4e12  # dense; 1979 is the sparse headline
    assert h100.peak_flops("fp16") == 989.4e12
    assert h100.peak_flops("fp8") == 1978.9e12  # dense; 3958 is sparse
    assert h100.peak_flops("tf32") == 494.7e12
    assert h100.peak_flops("bfloat16") == 989.4e12  # alias


@pytest.mark.parametrize(
    "name, mib",
    [
        ("dgx-a100-40g", 40441),  # deviceQuery 40441 MBytes
        ("dgx-a100-80g", 81920),  # nvidia-smi 81920 MiB
        ("dgx-h100", 81559),  # nvidia-smi "NVIDIA H100 80GB HBM3, 81559 MiB"
        ("dgx-h200", 143771),  # nvidia-smi "NVIDIA H200, 143771 MiB"
        ("dgx-b200", 183359),  # nvidia-smi "NVIDIA B200, 183359 MiB"
        ("gb200-nvl72", 189471),  # nvidia-smi "NVIDIA GB200, 189471 MiB"
        ("dgx-b300", 275040),  # nvidia-smi "NVIDIA B300 SXM6 AC, 275040 MiB"
        ("gb300-nvl72", 275040),  # the B300's figure: same 288 GB of HBM3e (verda reports 279 GB usable)
        ("mi300x", 196288),  # rocm-smi 205822885888 B
        ("dgx-h800", 81559),  # assumed as H100 80GB HBM3 (no H800 nvidia-smi quote read)
        ("a800-roce", 81920),  # assumed as A100 80GB
        ("jean-zay-a100", 81920),  # A100 SXM4 80GB
        ("grand-teton-h100", 97871),  # 96 GB GH100 parts (GH200 96 GB, H20) report 97871 MiB
    ],
)
def test_visible_memory(name, mib):
    assert get_cluster(name).gpu.memory_bytes == mib * MiB


def test_memory_exact_values():
    assert get_cluster("dgx-h100").gpu.memory_bytes == 81559 * 2**20
    assert get_cluster("mi300x").gpu.memory_bytes == 205822885888
    # the 80GB label is not 80e9 and not 80 GiB on H100
    assert get_cluster("dgx-h100").gpu.memory_bytes != 80 * GiB


@pytest.mark.parametrize(
    "name, bf16, fp8",
    [
        ("dgx-a100-40g", 312e12, None),
        ("dgx-a100-80g", 312e12, None),
        ("dgx-h100", 989.4e12, 1978.9e12),
        ("dgx-h200", 989.4e12, 1978.9e12),
        ("dgx-b200", 2250e12, 4500e12),
        ("gb200-nvl72", 2500e12, 5000e12),
        ("dgx-b300", 2250e12, 4500e12),  # DGX B300: 72 PF FP8 sparse / 8 GPUs / 2
        ("gb300-nvl72", 2500e12, 5000e12),  # rack 360 PF FP8 dense / 72
        ("mi300x", 1307.4e12, 2614.9e12),
        ("dgx-h800", 989.4e12, 1978.9e12),  # H100 compute (hardware.yaml H800 compute_note)
        ("a800-roce", 312e12, None),  # A100 compute, no FP8
        ("jean-zay-a100", 312e12, None),
        ("grand-teton-h100", 989.4e12, 1978.9e12),  # peaks at the boost clock; the power cap is a clock fraction
    ],
)
def test_dense_peaks(name, bf16, fp8):
    spec = get_cluster(name)
    assert spec.peak_flops("bf16") == pytest.approx(bf16)
    assert spec.peak_flops("fp16") == pytest.approx(bf16)
    if fp8 is None:
        assert "fp8" not in spec.supported_precisions
        with pytest.raises(ClusterSpecError):
            spec.peak_flops("fp8")
    else:
        assert spec.peak_flops("fp8") == pytest.approx(fp8)
        assert spec.supported_precisions == ["bf16", "fp16", "fp8", "fp32"]  # fp32 on the TF32 tensor cores


def test_a100_has_no_fp8():
    a100 = get_cluster("dgx-a100-80g")
    assert a100.supported_precisions == ["bf16", "fp16", "fp32"]
    with pytest.raises(ClusterSpecError) as ei:
        a100.peak_flops("fp8")
    msg = str(ei.value)
    assert msg == "cluster 'dgx-a100-80g': GPU A100 has no dense fp8 peak; allowed precisions: bf16, fp16, fp32"
    assert "\n" not in msg
    with pytest.raises(ClusterSpecError):
        a100.effective_flops("fp8")
    with pytest.raises(ClusterSpecError):
        get_cluster("dgx-a100-40g").peak_flops("fp8")


@pytest.mark.parametrize(
    "name, nvlink, domain, gpn, nic",
    [
        ("dgx-a100-40g", 300e9, 8, 8, 25e9),  # NVLink 3, 600 GB/s bidir; 200 Gb/s HDR
        ("dgx-a100-80g", 300e9, 8, 8, 25e9),
        ("dgx-h100", 450e9, 8, 8, 50e9),  # NVLink 4, 900 GB/s bidir; 400 Gb/s CX-7
        ("dgx-h200", 450e9, 8, 8, 50e9),
        ("dgx-b200", 900e9, 8, 8, 50e9),  # NVLink 5, 1.8 TB/s bidir
        ("gb200-nvl72", 900e9, 72, 4, 50e9),  # tray of 4, 72-GPU NVLink domain
        ("dgx-b300", 900e9, 8, 8, 100e9),  # ConnectX-8 800 Gb/s per GPU
        ("gb300-nvl72", 900e9, 72, 4, 100e9),  # 72 ConnectX-8 800 Gb/s, one per GPU
        ("mi300x", 448e9, 8, 8, 50e9),  # 7 x 64 GB/s per direction (896 is bidir)
        ("dgx-h800", 200e9, 8, 8, 50e9),  # NVLink 400 GB/s bidir; 8 x 400 Gb/s IB (DeepSeek-V3)
        ("a800-roce", 200e9, 8, 8, 25e9),  # 8 NVLink 3 links; 200 Gb/s RoCE per GPU
        ("jean-zay-a100", 300e9, 8, 8, 6.25e9),  # 4 x 100 Gb/s Omni-Path per 8 GPUs
        ("grand-teton-h100", 450e9, 8, 8, 50e9),  # 400 Gb/s RDMA per GPU
    ],
)
def test_interconnect_per_direction(name, nvlink, domain, gpn, nic):
    spec = get_cluster(name)
    assert spec.node.nvlink_bandwidth_bytes_per_s == nvlink
    assert spec.node.nvlink_domain_size == domain
    assert spec.node.gpus_per_node == gpn
    assert spec.network.nic_bandwidth_bytes_per_s == nic


def test_nvls_flags():
    assert get_cluster("dgx-h100").node.nvls
    assert get_cluster("gb200-nvl72").node.nvls
    assert not get_cluster("dgx-a100-80g").node.nvls
    assert not get_cluster("mi300x").node.nvls


def test_gb200_node_semantics():
    gb = get_cluster("gb200-nvl72")
    assert gb.gpus_per_node == 4
    assert gb.nvlink_domain_size == 72
    assert resolve_num_gpus(gb, None, None) == 72  # one rack by default
    assert resolve_num_gpus(gb, nodes=2) == 8


@pytest.mark.parametrize(
    "name, dtype, measured_tflops, peak_tflops",
    [
        ("dgx-a100-80g", "bf16", 271.2, 312),
        ("dgx-a100-40g", "bf16", 271.2, 312),
        ("dgx-h100", "bf16", 794.5, 989.4),
        ("dgx-h100", "fp8", 1402.6, 1978.9),
        ("dgx-h200", "bf16", 794.5, 989.4),
        ("dgx-h200", "fp8", 1453.4, 1978.9),
        ("dgx-b200", "bf16", 1745.0, 2250),
        ("dgx-b200", "fp8", 3432.5, 4500),
        ("gb200-nvl72", "bf16", 1822.0, 2500),
        ("gb200-nvl72", "fp8", 3615.6, 5000),
        ("dgx-b300", "bf16", 1769.0, 2250),
        ("dgx-b300", "fp8", 3353.3, 4500),
        ("mi300x", "bf16", 668.4, 1307.4),
        ("dgx-h800", "bf16", 794.5, 989.4),  # assumed: H100 silicon
        ("a800-roce", "bf16", 271.2, 312),  # assumed: A100 silicon
        ("jean-zay-a100", "bf16", 271.2, 312),
        ("grand-teton-h100", "bf16", 794.5, 989.4),  # MAMF at 700 W; the 500 W cap lowers the clock (cost model)
    ],
)
def test_gemm_efficiency_from_mamf(name, dtype, measured_tflops, peak_tflops):
    spec = get_cluster(name)
    assert spec.calibration.gemm_efficiency[dtype] == pytest.approx(measured_tflops / peak_tflops, abs=1e-3)
    # achievable rate at the TDP clock: the MAMF figure (a lower power limit is the step-time model's clock law)
    assert spec.effective_flops(dtype) == pytest.approx(measured_tflops * 1e12, rel=1e-3)


def test_named_efficiencies():
    assert get_cluster("dgx-h100").calibration.gemm_efficiency["bf16"] == pytest.approx(0.803, abs=5e-4)
    assert get_cluster("dgx-h100").calibration.gemm_efficiency["fp8"] == pytest.approx(0.709, abs=5e-4)
    assert get_cluster("dgx-a100-80g").calibration.gemm_efficiency["bf16"] == pytest.approx(0.869, abs=5e-4)
    # NCCL busbw / line rate
    assert get_cluster("dgx-a100-80g").calibration.nvlink_bus_efficiency == pytest.approx(230 / 300, abs=1e-3)
    assert get_cluster("dgx-h100").calibration.nvlink_bus_efficiency == pytest.approx(370 / 450, abs=1e-3)
    assert get_cluster("dgx-h100").calibration.network_bus_efficiency == pytest.approx(47 / 50, abs=1e-3)
    assert get_cluster("dgx-a100-80g").calibration.network_bus_efficiency == pytest.approx(24 / 25, abs=1e-3)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_calibration_field_has_a_source(name):
    spec = get_cluster(name)
    # power_limit_clock_fraction is optional: only a power-capped cluster sets it (and must source it)
    fields = [f for f in Calibration.model_fields if f != "sources" and
              (f != "power_limit_clock_fraction" or spec.calibration.power_limit_clock_fraction is not None)]
    for f in fields:
        assert spec.calibration.sources.get(f, "").strip(), f"{name}: no source for calibration.{f}"
    for part in (spec.gpu, spec.node, spec.network):
        assert len(part.source) > 40
    # every supported precision is calibrated; efficiencies are fractions
    for d in spec.supported_precisions:
        if d != "fp32":  # fp32 training uses the 16-bit GEMM efficiency on the TF32 peak
            assert 0 < spec.calibration.gemm_efficiency[d] <= 1


@pytest.mark.parametrize("name", BUILTINS)
def test_usable_memory_and_reserve(name):
    spec = get_cluster(name)
    reserve = spec.calibration.memory_reserve_bytes
    assert GiB <= reserve < 0.1 * spec.gpu.memory_bytes
    assert spec.usable_memory_bytes == spec.gpu.memory_bytes - reserve


def test_hbm_bandwidths():
    assert get_cluster("dgx-h100").gpu.hbm_bandwidth_bytes_per_s == 3350e9
    assert get_cluster("dgx-h200").gpu.hbm_bandwidth_bytes_per_s == 4800e9
    assert get_cluster("dgx-a100-40g").gpu.hbm_bandwidth_bytes_per_s == 1555e9
    assert get_cluster("dgx-a100-80g").gpu.hbm_bandwidth_bytes_per_s == 2039e9
    assert get_cluster("mi300x").gpu.hbm_bandwidth_bytes_per_s == 5.3e12


def test_attention_efficiency_falls_back_to_gemm():
    # dgx-h100 now carries a fitted attention_efficiency (plan3d validate); dgx-a100-80g has none
    a100 = get_cluster("dgx-a100-80g")
    assert a100.calibration.attention_efficiency is None
    assert a100.attention_efficiency("bf16") == a100.gemm_efficiency("bf16")


# ---------------------------------------------------------------- loaders and round trip
@pytest.mark.parametrize("name", BUILTINS)
def test_yaml_round_trip(tmp_path, name):
    spec = get_cluster(name)
    path = tmp_path / f"{name}-copy.yaml"
    dump_cluster(spec, path)
    back = load_cluster(str(path))
    assert back == spec
    # plain yaml.safe_dump of to_dict() works too
    path2 = tmp_path / "plain.yaml"
    path2.write_text(yaml.safe_dump(spec.to_dict()))
    assert load_cluster(str(path2)) == spec


def _h100_dict():
    return copy.deepcopy(get_cluster("dgx-h100").to_dict())


def _write(tmp_path, data, name="custom.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_custom_cluster_file(tmp_path):
    d = _h100_dict()
    d["name"] = "my-h100-pod"
    d["default_num_nodes"] = 4
    spec = load_cluster(str(_write(tmp_path, d)))
    assert spec.name == "my-h100-pod"
    assert resolve_num_gpus(spec, None, None) == 32


def test_unknown_name_suggests():
    with pytest.raises(ClusterSpecError) as ei:
        load_cluster("dgx-h10")
    msg = str(ei.value)
    assert msg.startswith("unknown cluster 'dgx-h10'; did you mean: dgx-h100")
    assert "dgx-h200" in msg
    assert "(see `plan3d clusters`)" in msg
    assert "\n" not in msg
    with pytest.raises(ClusterSpecError, match="unknown cluster 'zzz'; known clusters: "):
        get_cluster("zzz")


def test_missing_file():
    with pytest.raises(ClusterSpecError, match="cluster file 'nope/x.yaml' not found"):
        load_cluster("nope/x.yaml")


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ngpu:\n  name: [unclosed\n  memory_bytes: 1\n")
    with pytest.raises(ClusterSpecError) as ei:
        load_cluster(str(p))
    msg = str(ei.value)
    assert str(p) in msg
    assert "malformed YAML" in msg
    assert f"{p}:" in msg and any(f"{p}:{n}:" in msg for n in range(1, 6))
    assert "\n" not in msg


def test_yaml_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ClusterSpecError, match="must be a YAML mapping"):
        load_cluster(str(p))


def test_missing_field_named(tmp_path):
    d = _h100_dict()
    del d["gpu"]["memory_bytes"]
    with pytest.raises(ClusterSpecError) as ei:
        load_cluster(str(_write(tmp_path, d)))
    msg = str(ei.value)
    assert "custom.yaml" in msg
    assert "field 'gpu.memory_bytes': required field is missing" in msg
    assert "\n" not in msg


def test_bad_value_named(tmp_path):
    d = _h100_dict()
    d["calibration"]["nvlink_bus_efficiency"] = 1.5
    with pytest.raises(ClusterSpecError, match=r"field 'calibration.nvlink_bus_efficiency' = 1.5 is outside \[0.01, 1\]"):
        load_cluster(str(_write(tmp_path, d)))


def test_extra_field_rejected(tmp_path):
    d = _h100_dict()
    d["node"]["nvlink_gbps"] = 900
    with pytest.raises(ClusterSpecError, match=r"field 'node.nvlink_gbps': unknown field"):
        load_cluster(str(_write(tmp_path, d)))


def test_sources_must_cover_calibration(tmp_path):
    d = _h100_dict()
    del d["calibration"]["sources"]["memory_reserve_bytes"]
    with pytest.raises(ClusterSpecError) as ei:
        load_cluster(str(_write(tmp_path, d)))
    msg = str(ei.value)
    assert "field 'calibration'" in msg and "memory_reserve_bytes" in msg and "sources" in msg


def test_optional_calibration_field_needs_source_when_set(tmp_path):
    d = _h100_dict()
    d["calibration"]["attention_efficiency"] = None  # dgx-h100 ships a fitted value; unset it for this test
    del d["calibration"]["sources"]["attention_efficiency"]
    assert load_cluster(str(_write(tmp_path, d))).calibration.attention_efficiency is None  # unset: ok
    d["calibration"]["attention_efficiency"] = {"bf16": 0.6}
    with pytest.raises(ClusterSpecError, match="attention_efficiency"):
        load_cluster(str(_write(tmp_path, d, "with_attn.yaml")))


def test_gemm_efficiency_must_cover_precisions(tmp_path):
    d = _h100_dict()
    del d["calibration"]["gemm_efficiency"]["fp8"]
    with pytest.raises(ClusterSpecError, match="gemm_efficiency has no entry for precision"):
        load_cluster(str(_write(tmp_path, d)))


def test_nvlink_domain_multiple_of_node(tmp_path):
    d = _h100_dict()
    d["node"]["nvlink_domain_size"] = 12
    with pytest.raises(ClusterSpecError, match="multiple of gpus_per_node"):
        load_cluster(str(_write(tmp_path, d)))


def test_reserve_below_memory():
    d = _h100_dict()
    d["calibration"]["memory_reserve_bytes"] = d["gpu"]["memory_bytes"]
    with pytest.raises(Exception):
        ClusterSpec.model_validate(d)


def test_specs_are_frozen():
    spec = get_cluster("dgx-h100")
    with pytest.raises(Exception):
        spec.name = "x"


# ---------------------------------------------------------------- --gpus / --nodes
def test_resolve_num_gpus():
    h100 = get_cluster("dgx-h100")
    assert resolve_num_gpus(h100, None, None) == 8
    assert resolve_num_gpus(h100, 16, None) == 16
    assert resolve_num_gpus(h100, None, 4) == 32
    assert resolve_num_gpus(h100, 16, 2) == 16


def test_resolve_gpus_not_multiple():
    h100 = get_cluster("dgx-h100")
    with pytest.raises(ClusterSpecError) as ei:
        resolve_num_gpus(h100, 12, None)
    assert str(ei.value) == ("--gpus 12 is not a multiple of the node size 8 GPUs (dgx-h100) nor a divisor of it; "
                             "use 8 or 16")
    with pytest.raises(ClusterSpecError, match=r"--gpus 3 is not a multiple .*; use 1, 2, 4 \(part of a node\) or 8$"):
        resolve_num_gpus(h100, 3, None)


def test_jobs_smaller_than_a_node():
    # issue 10: 1, 2 or 4 GPUs of an 8-GPU node plan on part of that node (no hand-written cluster file)
    h100 = get_cluster("dgx-h100")
    assert [resolve_num_gpus(h100, g, None) for g in (1, 2, 4)] == [1, 2, 4]
    assert resolve_num_gpus(h100, 4, 1) == 4
    with pytest.raises(ClusterSpecError, match="part of one node"):
        resolve_num_gpus(h100, 4, 2)
    assert resolve_num_gpus(get_cluster("gb200-nvl72"), 2, None) == 2  # half a 4-GPU compute tray


@pytest.mark.parametrize("gpus, nodes", [(0, None), (-8, None), (None, 0), (None, -1)])
def test_resolve_non_positive(gpus, nodes):
    with pytest.raises(ClusterSpecError, match="positive"):
        resolve_num_gpus(get_cluster("dgx-h100"), gpus, nodes)


def test_resolve_inconsistent():
    with pytest.raises(ClusterSpecError, match="--gpus 16 and --nodes 1 disagree"):
        resolve_num_gpus(get_cluster("dgx-h100"), 16, 1)


# ---------------------------------------------------------------- machines named by published runs (issue 9 item 6)
def test_power_capped_h100_is_a_physical_input():
    from cost_models.gemm import FIT_RANGES, UNCORE_POWER_FRACTION, clock_fraction
    gt = get_cluster("grand-teton-h100")
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 96GB HBM2e, 2.4 TB/s, default 500 W power limit (700 W TDP)
    assert gt.gpu.power_limit_w == 500 and gt.gpu.tdp_w == 700 and gt.gpu.hbm_bandwidth_bytes_per_s == 2.4e12
    assert gt.power_limit_ratio == pytest.approx(5 / 7)
    # not measured: the power law with the exponent inside its fitted range gives 0.67-0.87 of the TDP clock
    assert gt.calibration.power_limit_clock_fraction is None
    rng = FIT_RANGES["POWER_CLOCK_EXPONENT"]
    dyn = (5 / 7 - UNCORE_POWER_FRACTION) / (1 - UNCORE_POWER_FRACTION)
    assert dyn ** (1 / rng.low) == pytest.approx(2 / 3) and 0.87 <= dyn ** (1 / rng.high) <= 0.875
    assert dyn ** (1 / rng.low) <= clock_fraction(gt) <= dyn ** (1 / rng.high)
    h100 = get_cluster("dgx-h100")
    assert clock_fraction(h100) == 1.0 and h100.gpu.power_limit_w is None and h100.power_limit_ratio == 1.0


def test_a_kernel_below_the_power_cap_runs_at_the_full_clock():
    # dynamic power ~ switching activity x f^n: the cap throttles a kernel only as far as its own draw exceeds it.
    # FlashAttention-2 (FA3 paper Fig. 5: 335 TFLOP/s at 16k on H100) runs at 0.42 of H100's MAMF GEMM rate (~795
    # TFLOP/s), so it draws 1/7 + 6/7 x 0.42 = 0.50 of the 700 W TDP at the full clock, under Grand Teton's 500 W (0.71)
    from cost_models.attention import attention_core_s
    from cost_models.config import ParallelConfig, TrainingJob
    from cost_models.gemm import POWER_CLOCK_EXPONENT, UNCORE_POWER_FRACTION, clock_fraction, mamf_rate
    from model_zoo import get_model
    gt, h100 = get_cluster("grand-teton-h100"), get_cluster("dgx-h100")
    n, u = POWER_CLOCK_EXPONENT, UNCORE_POWER_FRACTION
    dyn = (5 / 7 - u) / (1 - u)
    assert clock_fraction(gt) == pytest.approx(dyn ** (1 / n))
    assert clock_fraction(gt, 0.8) == pytest.approx((dyn / 0.8) ** (1 / n))
    fa2 = 335e12 / mamf_rate(gt, "bf16")
    assert fa2 == pytest.approx(0.42, abs=0.01) and clock_fraction(gt, fa2) == 1.0
    # so torchtitan's attention (PyTorch SDPA's FlashAttention-2) takes as long on the capped H100 as uncapped
    m, job, par = get_model("llama3.1-8b"), TrainingJob(global_batch_size=8, seq_length=32768), ParallelConfig(dp=8)
    assert attention_core_s(m, gt, job, par, "torchtitan") == pytest.approx(attention_core_s(m, h100, job, par,
                                                                                              "torchtitan"))
    # while Megatron's cuDNN kernel (539 TFLOP/s) is throttled, less than a GEMM
    cap, full = attention_core_s(m, gt, job, par, "megatron"), attention_core_s(m, h100, job, par, "megatron")
    assert full[0] < cap[0] < full[0] / clock_fraction(gt)


def test_clock_fraction_needs_the_power_limit_it_belongs_to(tmp_path):
    from cost_models.gemm import clock_fraction
    d = _h100_dict()
    d["calibration"]["power_limit_clock_fraction"] = 0.8
    d["calibration"]["sources"]["power_limit_clock_fraction"] = "test"
    with pytest.raises(ClusterSpecError, match="power_limit_w is not set"):
        load_cluster(str(_write(tmp_path, d)))
    d["gpu"]["power_limit_w"] = 500
    with pytest.raises(ClusterSpecError, match="needs gpu.tdp_w"):
        load_cluster(str(_write(tmp_path, d, "capped.yaml")))
    d["gpu"]["tdp_w"] = 700
    # a measured clock fraction wins over the power law (under GEMMs; a lighter kernel is throttled less)
    capped = load_cluster(str(_write(tmp_path, d, "capped.yaml")))
    assert clock_fraction(capped) == pytest.approx(0.8) and 0.8 < clock_fraction(capped, 0.7) <= 1.0


def test_jean_zay_network_is_the_measured_omni_path_figure():
    jz = get_cluster("jean-zay-a100")
    # 4 x 100 Gb/s Omni-Path per 8-GPU node (tr11-176B-ml README) = 12.5 GB/s per port, 2 GPUs per port
    assert jz.network.nic_bandwidth_bytes_per_s * 2 == 12.5e9
    # BigScience experiments/bandwidth/n4_a100_all_reduce_bench.txt: busbw 39.87 Gb/s on one Omni-Path port
    assert jz.effective_nic_bandwidth_bytes_per_s * 2 == pytest.approx(39.87e9 / 8, rel=0.01)


def test_a_non_positive_gpu_count_names_the_part_node_sizes_too():
    """From Python (the CLI's range check stops 0 first) the message names every size ``resolve_num_gpus`` takes:
    multiples of the node and its divisors, a part of one node."""
    from cluster_specs.loaders import resolve_num_gpus
    with pytest.raises(ClusterSpecError, match=r"multiple of the node size 8 GPUs \(dgx-h100\) or a divisor of it "
                                               r"\(1, 2, 4: part of one node\); got 0"):
        resolve_num_gpus(get_cluster("dgx-h100"), gpus=0)
