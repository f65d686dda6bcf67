"""Fuzz plan3d's command line with the four groups of hostile input of issue 14 (budget: ``PLAN3D_FUZZ_N``).

Each test runs its share of the budget in-process (``planner.cli.main``), checks every run against the invariants of
``fuzz_harness.check_outcome`` and fails listing every kind of broken invariant it met; ``test_console_script`` runs
a few inputs of each group through the installed ``plan3d`` script.
"""
from __future__ import annotations

from .fuzz_harness import check_outcome, run_console, run_inprocess
from .fuzz_strategies import argvs, cluster_files, model_files, valid_jobs
from .fuzz_tally import TALLY, assert_clean, fuzz_one, fuzz_settings
from hypothesis import given, settings
from hypothesis import strategies as st


def test_fuzz_argv(scratch):
    """Random argument vectors for every subcommand."""
    @fuzz_settings("argv")
    @given(argv=argvs(scratch))
    def run(argv):
        fuzz_one("argv", argv, scratch)
    run()
    assert_clean("argv")


def test_fuzz_model_files(scratch):
    """Malformed Hugging Face config.json and model YAML, planned on 8 or 64 H200s."""
    @fuzz_settings("model_files")
    @given(case=model_files(scratch))
    def run(case):
        fuzz_one("model_files", case[1], scratch)
    run()
    assert_clean("model_files")


def test_fuzz_cluster_files(scratch):
    """Cluster YAML mutated from ``plan3d clusters --show``."""
    @fuzz_settings("cluster_files")
    @given(case=cluster_files(scratch))
    def run(case):
        fuzz_one("cluster_files", case[1], scratch)
    run()
    assert_clean("cluster_files")


def test_fuzz_valid_jobs(scratch):
    """Valid jobs: the document's invariants, and byte-identical output on a re-run."""
    @fuzz_settings("valid_jobs")
    @given(argv=valid_jobs())
    def run(argv):
        fuzz_one("valid_jobs", argv, scratch, rerun=True)
    run()
    assert_clean("valid_jobs")


def test_console_script(scratch):
    """A few inputs of each group through the installed console script: the same invariants out of process."""
    found = []

    @settings(max_examples=3, deadline=None, derandomize=True, database=None)
    @given(argv=st.one_of(argvs(scratch), model_files(scratch).map(lambda c: c[1]),
                          cluster_files(scratch).map(lambda c: c[1]), valid_jobs()))
    def run(argv):
        found.extend(check_outcome(run_console(argv, cwd=str(scratch.root))))
    run()
    TALLY.runs.setdefault("console", 0)
    assert not found, "\n".join(f"{f.kind}: {f.detail} (plan3d {' '.join(f.argv)[:300]})" for f in found)


def test_plans_at_risk_rank_after_the_safe_ones():
    # found by the 10,000-input run (cluster_files, a dgx-b200 whose only changes did not touch the job): Llama-3.1-70B
    # on one B200 node lists three plans that clear the at-risk memory margin, then two faster ones within it, as
    # ``plan`` ranks them (planner.ranking); the invariant orders each part by throughput, not the whole list
    o = run_inprocess(["plan", "--model", "llama3.1-70b", "--cluster", "dgx-b200", "--nodes", "1", "--format", "json"])
    assert o.code == 0 and check_outcome(o) == []
    import json
    plans = json.loads(o.stdout)["plans"]
    risk = [p["memory"]["at_risk"] for p in plans]
    assert risk == sorted(risk) and any(risk) and not all(risk)
    # a plan out of order within one part is still a finding
    plans[0], plans[1] = plans[1], plans[0]
    doc = json.loads(o.stdout)
    doc["plans"] = [dict(p, rank=i + 1) for i, p in enumerate(plans)]
    o.stdout = json.dumps(doc)
    assert [f.kind for f in check_outcome(o)] == ["plans out of rank order"]
