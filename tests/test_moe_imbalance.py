"""Dropless MoE token imbalance over expert-parallel ranks (cost_models/moe_imbalance.py) and its memory effect."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.activations import expert_buffer_factor
from cost_models.memory import estimate_memory
from cost_models.moe_imbalance import (DEFAULT_EXPERT_LOAD_CV, default_expert_imbalance, expected_max_normal,
                                       rank_load_ratio)
from model_zoo import get_model, load_model_file

HF = Path(__file__).parent / "data" / "hf_configs"
GiB = 2**30


@pytest.mark.parametrize("m,expected", [(2, 0.56419), (3, 0.84628), (4, 1.02938), (5, 1.16296), (10, 1.53875),
                                        (20, 1.86748), (50, 2.24907), (100, 2.50759)])
def test_expected_maximum_of_normals_matches_harter_1961(m, expected):
    # H. L. Harter, "Expected values of normal order statistics", Biometrika 48 (1961), Table 1 (largest of n)
    assert expected_max_normal(m) == pytest.approx(expected, abs=2e-5)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)


def test_default_reproduces_megatron_bridge_deepseek_v3_rank_capacity():
    # Megatron-Bridge perf recipes size the per-EP-rank expert buffers of dropless DeepSeek-V3 (256 experts) at EP 64
    # to 1.5x the balanced case (perf_recipes/deepseek/common.py: moe_expert_rank_capacity_factor = 1.5)
    assert rank_load_ratio(256, 64) == pytest.approx(1.5, abs=1e-3)
    assert DEFAULT_EXPERT_LOAD_CV == pytest.approx(0.5 / (math.sqrt(252 / (255 * 4)) * expected_max_normal(64)),
                                                   abs=1e-3)


@pytest.mark.parametrize("experts", [8, 64, 128, 256])
def test_rank_ratio_grows_with_ep_from_one_to_the_busiest_expert(experts):
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if experts % e == 0]
    ratios = [rank_load_ratio(experts, ep) for ep in eps]
    assert ratios[0] == 1.0  # one rank holds every expert: it receives every copy, no more
    assert ratios == sorted(ratios) and len(set(ratios)) == len(ratios)
    assert ratios[-1] == pytest.approx(default_expert_imbalance(experts))  # one expert per rank: the busiest expert
    # a measured per-expert ratio is taken as given; forced balance (ratio 1) is the balanced case at every ep
    assert rank_load_ratio(experts, experts, 1.8) == pytest.approx(1.8)
    assert all(rank_load_ratio(experts, ep, 1.0) == 1.0 for ep in eps)


def test_expert_buffers_are_the_busiest_ranks_and_a_capacity_factor_pads_them():
    m = get_model("mixtral-8x7b")
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    for ep in (1, 2, 4, 8):
        par = ParallelConfig(dp=64, ep=ep, zero_stage=1)
        assert expert_buffer_factor(m, job, par) == rank_load_ratio(8, ep)
        # the job's drop-and-pad capacity (plan / evaluate / memory --capacity-factor): padded to it, exactly that
        padded = job.model_copy(update={"moe_expert_capacity_factor": 1.25})
        assert expert_buffer_factor(m, padded, par) == 1.25
    with pytest.raises(ValueError):
        TrainingJob(expert_load_imbalance=0.9)


def test_raising_ep_does_not_always_save_memory_when_fsdp_already_shards_the_experts():
    # issue 10: "Today a higher EP always predicts less memory, even for a small MoE whose expert weights FSDP
    # already shards." Qwen3-30B-A3B (128 experts, top-8) on 16 H100 under torchtitan FSDP2, micro-batch 1 x 4096
    # tokens: the expert states are world-sharded at every ep (ep x expert-FSDP = 16), the gathered FSDP unit shrinks
    # with ep, and the busiest rank's routed tokens grow with it. Memory falls to ep 4 and rises after it.
    m = load_model_file(HF / "qwen3-30b-a3b.json")
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=64, seq_length=4096, framework="torchtitan")
    est = {ep: estimate_memory(m, c, job, ParallelConfig(dp=16, ep=ep, zero_stage=3)).stages[0]
           for ep in (1, 2, 4, 8, 16)}
    assert len({round(st.model_states) for st in est.values()}) == 1
    peaks = [est[ep].total for ep in (1, 2, 4, 8, 16)]
    assert peaks[2] < peaks[1] < peaks[0]  # ep 1 -> 4: the gathered experts shrink faster than the imbalance grows
    assert peaks[2] < peaks[3] < peaks[4]  # ep 4 -> 16: fewer experts per rank, a busier busiest rank
    # forced balanced routing (Megatron --moe-router-force-load-balancing): more ep always saves memory again
    flat = TrainingJob(global_batch_size=64, seq_length=4096, framework="torchtitan", expert_load_imbalance=1.0)
    bal = [estimate_memory(m, c, flat, ParallelConfig(dp=16, ep=ep, zero_stage=3)).peak_bytes for ep in (1, 4, 16)]
    assert bal == sorted(bal, reverse=True)


def test_plan_document_records_the_imbalance_the_plans_were_sized_for():
    # schema 1.4: input.job.expert_load_imbalance, read back by plan3d fallback --plan (planner/fallback_plans.py)
    from planner.document import input_info
    m, c = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    assert input_info(m, c, TrainingJob(expert_load_imbalance=1.0), 64).job.expert_load_imbalance == 1.0
    assert input_info(m, c, TrainingJob(), 64).job.expert_load_imbalance is None
