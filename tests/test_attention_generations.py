"""Fused-attention throughput by kernel-library generation (``cluster_specs/data/efficiency/attention.yaml``).

Expected values are the published measurements the table holds: cuDNN 9.19 on H200 (NVIDIA cudnn-frontend
``results/h200_919_only_cudnn/llama3.1_20260227_034703.csv``, causal, head dim 128: 8192 tokens forward 644,
backward 541 TFLOP/s) and the FA3 paper's 2024 cuDNN on H100 (Shah et al. 2024, Fig. 5 / 6: 529 / 518 at 8k);
cuDNN 9.19 on GB200 (``results/gb200_919_only_cudnn``: 1598 / 1311 at 8k).
"""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster_specs.efficiency import attention_tflops
from cluster_specs.loaders import get_cluster
from cost_models.attention import attention_core_s
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.loaders import get_model
from planner.errors import PlanInputError
from planner.row_options import row_options


def test_undated_run_reads_the_newest_generation():
    assert attention_tflops("H100", "cudnn", 8192, 128) == pytest.approx((644.0, 541.0))
    assert attention_tflops("H200", "cudnn", 16384, 128) == pytest.approx((673.0, 579.0))


def test_dated_run_reads_its_generation():
    assert attention_tflops("H100", "cudnn", 8192, 128, "2024-07") == pytest.approx((529.0, 518.0))
    # before the first measured generation: held at it; after the last: the last
    assert attention_tflops("H100", "cudnn", 8192, 128, "2024-03") == pytest.approx((529.0, 518.0))
    assert attention_tflops("H100", "cudnn", 8192, 128, "2026-08") == pytest.approx((644.0, 541.0))


def test_between_generations_interpolates_in_time():
    # 2025-04 is 9 of the 19 months from 2024-07 to 2026-02
    fwd, bwd = attention_tflops("H100", "cudnn", 8192, 128, "2025-04")
    assert fwd == pytest.approx(529 + 9 / 19 * (644 - 529))
    assert bwd == pytest.approx(518 + 9 / 19 * (541 - 518))


def test_single_generation_ignores_the_date():
    assert attention_tflops("GB200", "cudnn", 8192, 128, "2024-07") == pytest.approx((1598.0, 1311.0))
    assert attention_tflops("H100", "flash2", 8192, 128, "2026-02") == pytest.approx((333.0, 318.0))


def test_bad_software_date_is_refused():
    with pytest.raises(ValueError, match="YYYY-MM"):
        attention_tflops("H100", "cudnn", 8192, 128, "2025-13")
    with pytest.raises(ValidationError):
        TrainingJob(software_date="Nov 2025")


def test_step_attention_follows_the_generation():
    """One layer's attention core on H100 (Megatron: cuDNN) takes longer with 2024 software by the table's ratio."""
    model, cluster = get_model("llama3.1-8b"), get_cluster("dgx-h100")
    par = ParallelConfig(tp=1, pp=1, dp=8, micro_batch_size=1)
    new = attention_core_s(model, cluster, TrainingJob(global_batch_size=8, seq_length=8192), par, "megatron")
    old = attention_core_s(model, cluster, TrainingJob(global_batch_size=8, seq_length=8192, software_date="2024-07"),
                           par, "megatron")
    assert old[0] / new[0] == pytest.approx(644 / 529)
    assert old[1] / new[1] == pytest.approx(541 / 518)


def _row(setup):
    return {"id": "r", "parallel": {}, "setup": setup}


def test_row_states_its_software_date_with_a_source():
    o = row_options(_row({"software_date": "2025-11", "sources": {"software_date": "NeMo 25.11 container"}}))
    assert o.job["software_date"] == "2025-11"
    with pytest.raises(PlanInputError, match="software_date"):
        row_options(_row({"software_date": "2025-11"}))
    with pytest.raises(PlanInputError, match="setup.software_date"):
        row_options(_row({"software_date": "11/2025", "sources": {"software_date": "x"}}))
