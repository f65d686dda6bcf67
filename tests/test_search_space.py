"""The search covers what the frameworks run (issue 11 item 1): the examples of the issue, with their answers.

Before, micro-batches were 1, 2, 4, 8 only and CP needed >= 2,048 tokens per rank, so ``plan`` returned layouts
that plan3d's own ``evaluate`` beat.
"""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model
from planner.evaluation import evaluate
from planner.solver import solve

H100 = get_cluster("dgx-h100")


def test_mtnlg_530b_on_5128_a100s_finds_micro_batch_3():
    # GBS 1923 = 3 x 641 over dp 641 (5,128 = 8 x 641): micro-batch 3 was outside the space; plan returned a 35.4 s
    # step at micro-batch 1 while evaluate predicted 24.3 s at micro-batch 3 with ZeRO-3
    m, c = get_model("gpt-530b"), get_cluster("dgx-a100-80g")
    job = TrainingJob(global_batch_size=1923, seq_length=2048)
    res = solve(m, c, job, 5128, top_k=5)
    best = res.plans[0]
    p = best.parallel
    # TP4 CP2 (24.20 s) and TP4 PP2 (24.22 s) edge out the TP8 layout the issue evaluated (24.23 s), which is in the
    # top 5 (TP4 PP2 first at 24.18 s with the constants fitted before the FP8 fast-accumulation and current-scaling
    # terms, 2026-12-04; TP4 CP2 first at 24.19 s with those fitted before DeepEP's internode throughput was charged;
    # 24.22 / 24.25 s with those of the coarser fit grid before): 0.2% apart, within any interval plan3d prints
    assert (p.tp, p.cp, p.pp, p.dp, p.micro_batch_size, p.zero_stage) == (4, 2, 1, 641, 3, 3)
    assert best.step.step_s == pytest.approx(24.20, abs=0.02)
    ev = evaluate(m, c, job, ParallelConfig(tp=8, pp=1, dp=641, micro_batch_size=3, zero_stage=3,
                                            sequence_parallel=True), 5128)
    assert ev.step.step_s == pytest.approx(24.23, abs=0.02)
    assert ev.parallel in [e.parallel for e in res.plans]


def test_llama_405b_on_131072_h100s_finds_cp_8():
    # GBS 2048 x 8192 tokens: CP 8 leaves 1,024 tokens per rank, below the old 2,048-token prune; plan returned
    # 2.15 s (TP8 PP64 CP4) while evaluate predicted 1.37 s for TP8 PP16 CP8. Now TP8 PP32 CP8 VPP4 is first and
    # TP8 PP16 CP8 VPP8 is in the top 5 (1.33 s / 1.38 s under the per-term step model with the DP reduction exposed;
    # 1.30 s / 1.34 s with it overlapped, as plan3d's Megatron launch runs it: planner/launch_options.py; 1.32 s /
    # 1.35 s with H100 attention read in cuDNN 9.19, whose causal backward at CP 8's 1,024-token chunks is slower than
    # the 2024 series' non-causal figure: attention.yaml; 1.35 s / 1.38 s since its 1,024-token point is measured,
    # backward 223 TFLOP/s, not 325 as assumed from the 2024 series' shape; 1.47 s / 1.48 s with each attention call
    # at its measured occupancy: 16 heads x 8 query tiles = 128 thread blocks on 132 SMs run cuDNN at 0.54 / 0.43 of
    # its saturated rate, attention.yaml ``occupancy``; 1.49 s / 1.50 s with the ring's calls as TE and PyTorch
    # run them: the diagonal causal, the others unmasked over half the keys or half the queries, 64 blocks; 1.45 s /
    # 1.47 s with the constants refitted on the finer grid, 2026-12-04: GEMMs' HBM passes KAPPA 2.25 -> 1.99; 1.47 s /
    # 1.48 s with them refitted after the MoE routing kernels were measured: KAPPA 1.99 -> 2.10; 1.44 s / 1.46 s with
    # them refitted once DeepEP's internode throughput was charged: KAPPA 2.10 -> 1.96, POWER_CLOCK_EXPONENT 2.25 ->
    # 2.12; 1.46 s / 1.47 s with the FP8 fast-accumulation and current-scaling terms: KAPPA 1.96 -> 2.03)
    job = TrainingJob(global_batch_size=2048, seq_length=8192)
    res = solve(get_model("llama3.1-405b"), H100, job, 131072, top_k=5)
    best = res.plans[0]
    assert (best.parallel.tp, best.parallel.cp) == (8, 8)
    assert best.step.step_s == pytest.approx(1.457, abs=0.01)
    pp16 = [e for e in res.plans if (e.parallel.tp, e.parallel.pp, e.parallel.cp) == (8, 16, 8)]
    assert pp16 and pp16[0].step.step_s == pytest.approx(1.474, abs=0.01)


def test_doubling_the_gpus_does_not_slow_llama_405b():
    # at fixed batch and sequence the best step time falls from 65,536 to 131,072 to 262,144 GPUs (it rose from
    # 2.06 s to 2.15 s before: CP 8 was pruned)
    job = TrainingJob(global_batch_size=2048, seq_length=8192)
    steps = [solve(get_model("llama3.1-405b"), H100, job, n, top_k=1).plans[0].step.step_s
             for n in (65536, 131072, 262144)]
    assert steps[0] > steps[1] > steps[2]
