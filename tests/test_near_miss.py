"""Near-miss global batches and GPU counts (issue 11 item 2).

5,128 A100s are 641 nodes of 8, and 641 is prime: every layout of MT-NLG 530B there has a data-parallel size that
is a multiple of 641 (tp x pp x cp <= 8 x 105 layers cannot absorb the factor), so a global batch of 2,520 has no
layout. The error names the nearest batches that plan (1,923 = 3 x 641 below, 2,564 = 4 x 641 above) and the
nearest whole-node GPU counts (640 and 648 nodes), each with its predicted throughput, and
``--global-batch-size-tolerance`` lets ``plan`` take the nearest batch itself.
"""
from __future__ import annotations

import re

import planner
from cluster_specs import get_cluster
from cost_models.config import TrainingJob
from model_zoo import get_model
from planner.checks import DEFAULT_AT_RISK_MARGIN
from planner.near_miss import choose_batch, nearest_batches, nearest_gpu_counts

JOB = ("--model", "gpt-530b", "--cluster", "dgx-a100-80g", "--gpus", "5128", "--seq-length", "2048")
M, C = get_model("gpt-530b"), get_cluster("dgx-a100-80g")


def test_5128_gpus_get_the_nearest_batches_and_gpu_counts(run_cli):
    r = run_cli("plan", *JOB, "--global-batch-size", "2520")
    assert r.exit_code == 1
    msg = r.stderr
    assert "no layout satisfies the divisibility and framework rules" in msg
    batches = re.search(r"nearest feasible global batches: 1,923 \(([\d,]+) tokens/s, step [\d.]+ s\) below, "
                        r"2,564 \(([\d,]+) tokens/s, step [\d.]+ s\) above", msg)
    assert batches, msg
    gpus = re.search(r"nearest feasible GPU counts: 5,120 \(640 nodes; ([\d,]+) tokens/s, step [\d.]+ s\) below, "
                     r"5,184 \(648 nodes; ([\d,]+) tokens/s, step [\d.]+ s\) above", msg)
    assert gpus, msg
    # each throughput is that of the best plan of the changed job (what plan prints for it)
    below, above = nearest_batches(M, C, TrainingJob(global_batch_size=2520, seq_length=2048), 5128,
                                   at_risk_margin=DEFAULT_AT_RISK_MARGIN)  # as plan searches
    assert (below.global_batch_size, above.global_batch_size) == (1923, 2564)
    assert f"{below.tokens_per_s:,.0f}" == batches.group(1)
    best = planner.plan(M, C, gpus=5128, global_batch_size=1923, seq_length=2048, top_k=1).plans[0]
    assert best.throughput.tokens_per_s == float(f"{below.tokens_per_s:.6g}")


def test_nearest_gpu_counts_are_whole_nodes_where_the_batch_divides():
    below, above = nearest_gpu_counts(M, C, TrainingJob(global_batch_size=2520, seq_length=2048), 5128)
    assert (below.num_gpus, above.num_gpus) == (5120, 5184)
    for h in (below, above):
        assert h.num_gpus % 8 == 0 and 2520 % h.plan.parallel.dp == 0 and h.plan.feasible


def test_tolerance_plans_the_nearest_batch_and_reports_it(run_cli):
    r = run_cli("plan", *JOB, "--global-batch-size", "2520", "--global-batch-size-tolerance", "0.02", "--top-k", "1",
                "--format", "json")
    assert r.exit_code == 0, r.stderr
    job = r.json()["input"]["job"]
    # 2,564 is 1.7% above the request; 1,923 is 24% below, outside the tolerance
    assert (job["global_batch_size"], job["requested_global_batch_size"]) == (2564, 2520)
    t = run_cli("plan", *JOB, "--global-batch-size", "2520", "--global-batch-size-tolerance", "0.02", "--top-k", "1")
    assert "GBS 2564 (requested 2520, tolerance 0.02)" in t.stdout
    # a batch that plans is kept as asked; the request is still recorded
    ok = run_cli("plan", *JOB, "--global-batch-size", "2564", "--global-batch-size-tolerance", "0.02", "--top-k", "1",
                 "--format", "json").json()["input"]["job"]
    assert (ok["global_batch_size"], ok["requested_global_batch_size"]) == (2564, 2564)
    # without a tolerance the field is null
    assert run_cli("plan", "--format", "json").json()["input"]["job"]["requested_global_batch_size"] is None
    # nothing within 1%: exit 1 with the near misses
    assert run_cli("plan", *JOB, "--global-batch-size", "2520", "--global-batch-size-tolerance", "0.01").exit_code == 1


def test_choose_batch_prefers_the_nearer_side_then_the_faster():
    job = TrainingJob(global_batch_size=2520, seq_length=2048)
    assert choose_batch(M, C, job, 5128, 0.3) == 2564       # 44 above beats 597 below
    assert choose_batch(M, C, job, 5128, 0.01) is None


def test_tolerance_input_errors(run_cli):
    for bad in ("-0.1", "1", "1.5"):
        r = run_cli("plan", "--global-batch-size-tolerance", bad)
        assert r.exit_code == 2 and "--global-batch-size-tolerance" in r.stderr
    r = run_cli("plan", "--global-batch-size-tolerance", "0.1", "--objective", "min-gpus", "--target-step-s", "5")
    assert r.exit_code == 2 and "--global-batch-size-tolerance applies to" in r.stderr


def test_near_misses_stop_at_the_time_budget(run_cli):
    """The near-miss searches are steps of plan's --time-budget (issue 14): none starts once it is spent, and the
    error says the search stopped rather than that nothing plans nearby."""
    from planner.progress import Budget
    spent = Budget(0.0)
    job = TrainingJob(global_batch_size=2520, seq_length=2048)
    assert nearest_batches(M, C, job, 5128, budget=spent) == (None, None)
    assert nearest_gpu_counts(M, C, job, 5128, budget=spent) == (None, None)
    r = run_cli("plan", *JOB, "--global-batch-size", "2520", "--time-budget", "0.001")
    assert r.exit_code == 1
    assert "no feasible global batches nearby" in r.stderr and "the time budget; raise --time-budget" in r.stderr
