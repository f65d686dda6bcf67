"""Regressions found by trying plan3d as a new user from the README alone (helper breaker1): each test is one
finding, with the command that showed it and the answer the README promises."""
from __future__ import annotations

import pytest

import planner
from cluster_specs import ClusterSpecError
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model


# --- a one-cluster command given what only `plan` reads --------------------------------------------------------

@pytest.mark.parametrize("cmd", ["evaluate", "memory", "explain"])
@pytest.mark.parametrize("cluster,form", [("dgx-h100:1,dgx-a100-80g:1", "pools"), ("dgx-h100,dgx-b200", "several")])
def test_one_cluster_commands_name_the_pools_and_comparison_forms(run_cli, cmd, cluster, form):
    """`plan3d evaluate --cluster dgx-h100:1,dgx-a100-80g:1 --tp 8` said "unknown cluster ...; did you mean:
    dgx-a100-80g?": the README's own --cluster forms must be named, with the command that takes them (exit 2)."""
    r = run_cli(cmd, "--cluster", cluster, "--tp", "8")
    assert r.exit_code == 2
    assert "unknown cluster" not in r.stderr and "did you mean" not in r.stderr
    assert form in r.stderr and "give one cluster here" in r.stderr
    assert ("planner.plan_pools" if form == "pools" else "planner.compare") in r.stderr


def test_api_plan_with_a_pools_string_points_to_plan_pools():
    with pytest.raises(ClusterSpecError, match="plan_pools"):
        planner.plan("llama3.1-8b", "dgx-h100:1,dgx-a100-80g:1")


def test_pools_yaml_to_a_one_cluster_command(run_cli, tmp_path):
    """A pools YAML (`pools:` list) given to evaluate listed every ClusterSpec field as missing."""
    f = tmp_path / "mixed.yaml"
    f.write_text("pools:\n  - cluster: dgx-h100\n    nodes: 2\n  - cluster: dgx-a100-80g\n    nodes: 2\n")
    r = run_cli("evaluate", "--cluster", str(f), "--tp", "8")
    assert r.exit_code == 2
    assert "mixed cluster (pools:)" in r.stderr and "required field is missing" not in r.stderr


@pytest.mark.parametrize("opt", [("--train-tokens", "1e12"), ("--gpus", "16"), ("--capacity-factor", "2"),
                                 ("--expert-load-imbalance", "2")])
def test_pools_say_which_option_they_refuse(run_cli, opt):
    """`plan3d plan --cluster dgx-h100:8,dgx-a100-80g:8 --train-tokens 1e12` answered "--train-tokens: a plan over
    pools takes the pools' node counts ..., chooses pp and the layout itself and maximises throughput", which reads
    as an explanation, not as a refusal: it must say the option is not available and to drop it (exit 2)."""
    r = run_cli("plan", "--cluster", "dgx-h100:1,dgx-a100-80g:1", *opt)
    assert r.exit_code == 2
    assert f"{opt[0]}: not available over pools" in r.stderr and f"drop {opt[0]}" in r.stderr


# --- plan3d fallback --plan re-evaluates the job the document was planned for -----------------------------------

@pytest.mark.parametrize("opts", [dict(framework="deepspeed"), dict(framework="torchtitan"),
                                  dict(flash_attention=False)])
def test_fallback_from_a_document_keeps_the_job_options(tmp_path, opts):
    """`plan3d plan ... --framework deepspeed --format json -o p.json; plan3d fallback --plan p.json` re-planned under
    Megatron's rules (context parallelism under DeepSpeed, "resharding (megatron)"); with --framework torchtitan it
    called the original infeasible, and with --no-flash-attention it retained 111.5% after losing a node. The
    document now records the job's framework, flash attention and dropout, and the table equals the one planned from
    the same options."""
    job = dict(gpus=32, global_batch_size=256, seq_length=4096, **opts)
    doc = planner.plan("llama3.1-8b", "dgx-h100", top_k=1, **job)
    assert doc.input.job.framework == opts.get("framework", "megatron")
    assert doc.input.job.flash_attention is opts.get("flash_attention", True)
    path = tmp_path / "plan.json"
    path.write_text(doc.model_dump_json())
    from_doc = planner.fallback(plan=str(path), max_lost_nodes=1)
    from_opts = planner.fallback("llama3.1-8b", "dgx-h100", max_lost_nodes=1, **job)
    assert from_doc.framework == opts.get("framework", "megatron")
    assert from_doc.model_dump_json() == from_opts.model_dump_json()
    for e in from_doc.fallbacks:
        assert e.throughput_retained is None or e.throughput_retained <= 1.0


def test_fallback_of_a_pools_document_says_so(run_cli, tmp_path):
    """`plan3d fallback --plan pools.json` (a plan over pools) said "not a plan document ...: 27 validation errors"."""
    doc = planner.plan_pools("llama3.1-8b", "dgx-h100:1,dgx-a100-40g:1", global_batch_size=256, top_k=1)
    path = tmp_path / "pools.json"
    path.write_text(doc.model_dump_json())
    r = run_cli("fallback", "--plan", str(path), "--max-lost-nodes", "1")
    assert r.exit_code == 2 and "a plan over pools" in r.stderr and "validation error" not in r.stderr


def test_fallback_on_one_node(run_cli):
    """`plan3d fallback --gpus 8 --max-lost-nodes 1` said "the cluster has 1 nodes; lose at most 0"."""
    r = run_cli("fallback", "--gpus", "8", "--max-lost-nodes", "1")
    assert r.exit_code == 2 and "1 node;" in r.stderr and "at most 0" not in r.stderr


def test_comparison_marks_energy_that_leaves_out_the_node(run_cli):
    """`plan3d plan --cluster dgx-h100,mi300x --train-tokens ...` put MI300X's MWh (GPU boards only: its cluster
    file has no node-overhead figure) next to DGX H100's (boards + 4.6 kW node overhead, DGX H100 user guide) with
    the caption "upper bound": MI300X looked half as hungry. The cell is marked and the caption says why."""
    r = run_cli("plan", "--model", "llama3.1-8b", "--cluster", "dgx-h100,mi300x", "--gpus", "8",
                "--train-tokens", "1e11")
    assert r.exit_code == 0, r.stderr
    rows = {line.split("│")[3].strip(): line for line in r.stdout.splitlines() if line.count("│") > 10}
    assert rows["mi300x"].rstrip(" │").endswith("*") and not rows["dgx-h100"].rstrip(" │").endswith("*")
    assert "GPU boards only" in " ".join(r.stdout.split())


def test_emit_refusal_says_what_to_do_when_no_listed_plan_can_run(run_cli):
    """`plan3d plan --model llama3.1-405b --gpus 1024 ... --emit colossalai`: every one of the top 5 plans has cp with
    Megatron-style SP, which Colossal-AI cannot combine; the refusal named no way forward (the README promises a rank
    that can run). It now says none of the top K can and what to change."""
    r = run_cli("plan", "--gpus", "16", "--cp", "2", "--tp", "2", "--top-k", "2", "--emit", "colossalai")
    assert r.exit_code == 1 and "cp 2 with sequence_parallel" in r.stderr
    assert "none of the top 2 plans can: raise --top-k, or pin the knob" in r.stderr


def test_emit_refuses_a_job_no_layout_can_run_before_the_search(run_cli):
    """`plan3d plan --precision fp8 --emit torchtitan` searched, ranked five FP8 plans, then refused each and advised
    raising --top-k or pinning --tp/--pp: no layout can help, torchtitan has no FP8 setting plan3d costs. The job is
    now refused before the search, naming the option and the framework that runs it; a job every framework runs
    passes the check (planner.emit.job_refusal: the one-GPU layout passes every rule about a layout)."""
    from planner.emit import FRAMEWORKS, job_refusal

    r = run_cli("plan", "--gpus", "8", "--precision", "fp8", "--emit", "torchtitan")
    assert r.exit_code == 1 and "precision fp8" in r.stderr and "no parallel layout changes that" in r.stderr
    assert "--emit megatron, which runs it" in r.stderr and "--top-k" not in r.stderr and r.stdout == ""
    plain = TrainingJob(global_batch_size=1024, seq_length=4096)
    assert [job_refusal(fw, get_model("llama3.1-8b"), plain) for fw in FRAMEWORKS] == [None] * len(FRAMEWORKS)
    assert "attention_sinks" in job_refusal("megatron", get_model("gpt-oss-20b"), plain)


def test_context_parallelism_needs_fused_attention(run_cli):
    """`plan3d plan --gpus 32 --dropout --no-flash-attention --emit megatron` ranked cp 2 plans and emitted
    --context-parallel-size 2 with --attention-backend unfused, which cannot start: megatron-core's local
    DotProductAttention asserts context_parallel_size == 1, Transformer Engine disables its unfused backend under CP.
    The search now leaves cp > 1 out without fused attention and evaluate names the rule; DeepSpeed-Ulysses (cp as
    head scattering) runs any attention and keeps it. Colossal-AI's ring_attn once turned flash attention on in the
    emitted plugin while the plan was costed unfused: refused, as is dropout (no plugin keyword)."""
    from planner.emit import EmitError
    from planner.emit.colossalai import check_colossalai

    doc = planner.plan("llama3.1-8b", gpus=32, flash_attention=False, dropout=True, top_k=3)
    assert all(p.parallel.cp == 1 for p in doc.plans)
    ev = planner.evaluate(gpus=8, tp=2, cp=2, flash_attention=False).plans[0]
    assert "cp 2 runs ring attention over fused (flash) attention kernels: not with --no-flash-attention" in \
        ev.violations
    ds = planner.evaluate(gpus=8, cp=2, flash_attention=False, framework="deepspeed").plans[0]
    assert not any("ring attention" in v for v in ds.violations)
    m = get_model("llama3.1-8b")
    for job, says in ((TrainingJob(global_batch_size=8, flash_attention=False), "cp 2 with unfused attention"),
                      (TrainingJob(global_batch_size=8, dropout=True), "dropout")):
        with pytest.raises(EmitError, match=says):
            check_colossalai(m, job, ParallelConfig(dp=4, cp=2))


def test_plan_names_the_rule_a_pinned_schedule_breaks(run_cli):
    """`plan --pipeline-schedule combined-1f1b` on a dense model said "no structural rule (memory or the search
    bounds)" where explain names schedule_combined_ep: the closest layout now carries the pinned schedule (and a
    pinned stage split)."""
    r = run_cli("plan", "-m", "llama3.1-70b", "--gpus", "64", "--global-batch-size", "512", "--top-k", "1",
                "--pipeline-schedule", "combined-1f1b")
    assert r.exit_code == 1 and "schedule_combined_ep" in r.stderr and "no structural rule" not in r.stderr


def test_min_gpus_miss_says_by_how_much_and_what_is_pinned(run_cli):
    """`--objective min-gpus --target-step-s 30 --pp 2` on 128 GPUs said only "no GPU count up to 128 meets the
    target": the fastest plan there (30.78 s) and the pin that holds it back are named now, as the --deadline-days
    miss does."""
    r = run_cli("plan", "-m", "llama3.1-70b", "--gpus", "128", "--global-batch-size", "1024", "--top-k", "1",
                "--objective", "min-gpus", "--target-step-s", "30", "--pp", "2")
    assert r.exit_code == 1 and "the fastest on 128 GPUs (tp 4 pp 2" in r.stderr
    assert "x the target; raise --gpus, unpin --pp, or relax the target" in r.stderr
    # a global batch that leaves each replica one micro-batch, not the GPU count, caps the speed: said so
    r = run_cli("plan", "-m", "llama3.1-8b", "--gpus", "64", "--global-batch-size", "64", "--objective", "min-gpus",
                "--target-tokens-per-day", "1e12")
    assert r.exit_code == 1 and "with 1 micro-batch(es) of 1 per replica (pp 1): the global batch 64 caps" in r.stderr


def test_batch_tolerance_hint_says_when_the_tolerance_given_is_too_small(run_cli):
    """With --global-batch-size-tolerance 0.01 the infeasibility line still ended "(--global-batch-size-tolerance lets
    plan pick the batch)": it now says the given tolerance (+-25 of 2,520 sequences) does not reach the batches it
    names (2,564 above)."""
    r = run_cli("plan", "--model", "gpt-530b", "--cluster", "dgx-a100-80g", "--gpus", "5128", "--global-batch-size",
                "2520", "--seq-length", "2048", "--global-batch-size-tolerance", "0.01")
    assert r.exit_code == 1 and "2,564 (" in r.stderr
    assert "--global-batch-size-tolerance 0.01 allows +-25 sequences: not enough" in r.stderr
    assert "lets plan pick the batch" not in r.stderr


def test_comparison_where_no_cluster_has_a_plan_exits_1(run_cli):
    """`plan3d plan --model llama3.1-70b --cluster dgx-h100,dgx-b200 --gpus 512 ... --deadline-days 30` printed an
    all-dash table and exited 0, where one cluster with the same answer exits 1 (README: exit 1 = no feasible
    plan). The table and the reasons are still printed; JSON still carries them."""
    args = ("plan", "--model", "llama3.1-70b", "--cluster", "dgx-a100-40g,dgx-h100", "--gpus", "8",
            "--train-tokens", "1e12")
    r = run_cli(*args)
    assert r.exit_code == 1 and "no plan on any of the 2 clusters" in r.stderr
    assert "dgx-a100-40g: no feasible plan" in " ".join(r.stdout.split())
    j = run_cli(*args, "--format", "json")
    assert j.exit_code == 1 and all(row["document"] is None for row in j.json()["rows"])


def _header(stdout: str) -> list[str]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("┃ #"))
    return [c.strip() for c in line.strip("┃").split("┃")]


def test_plan_table_shows_the_knobs_that_tell_plans_apart(run_cli):
    """`plan3d plan --model deepseek-v3 -c dgx-h800 --gpus 2048 --precision fp8 --framework torchtitan` listed plans
    #1 and #3 with every column equal (tp 2 pp 1 dp 1024 ep 256 mbs 1 zero 3 selective) but 47.8 vs 57.6 GiB: they
    differ in etp (1 vs 2), which the table did not show; a pinned or searched non-default pipeline schedule was not
    shown either. A MoE model's table has an etp column, and a schedule column appears when a plan uses one."""
    # balanced routing: with the default dropless imbalance the best plan is combined 1F1B (a schedule column)
    r = run_cli("plan", "--model", "mixtral-8x7b", "--gpus", "16", "--top-k", "2", "--expert-load-imbalance", "1")
    assert r.exit_code == 0 and "etp" in _header(r.stdout) and "schedule" not in _header(r.stdout)
    r = run_cli("plan", "--gpus", "16", "--top-k", "2")
    assert "etp" not in _header(r.stdout)
    r = run_cli("plan", "--gpus", "16", "--top-k", "1", "--framework", "torchtitan", "--pipeline-schedule", "zb-v")
    assert r.exit_code == 0, r.stderr
    head = _header(r.stdout)
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("│ 1 "))
    assert [c.strip() for c in row.strip("│").split("│")][head.index("schedule")] == "zb-v"
