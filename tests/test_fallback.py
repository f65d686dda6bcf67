"""Fallback plans after node loss (issue 12 part 2): keep_layout changes only DP, best is the exact optimum of plan's
space over every world size that fits, and the table, JSON, plot and CLI behave."""
from __future__ import annotations

import json

import pytest

import planner
from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model
from planner.fallback_search import _world_bounds, best_fallbacks, keep_layout, min_gpus
from planner.search import run_search
from planner.space import SearchSpace

H100 = get_cluster("dgx-h100")


def test_min_gpus_is_megatron_grid_rule():
    """PP x max(TP x CP, EP x ETP) (Megatron-Bridge PR #3509)."""
    assert min_gpus(ParallelConfig(tp=8, pp=16, cp=2, dp=64)) == 256
    assert min_gpus(ParallelConfig(tp=2, pp=2, dp=8, ep=8, etp=1)) == 16
    assert min_gpus(ParallelConfig(tp=4, pp=1, dp=2, ep=2, etp=4)) == 8


def test_keep_layout_changes_only_dp_and_stops_below_the_grid():
    m = get_model("mixtral-8x7b")
    # balanced routing (--moe-router-force-load-balancing): with the default dropless imbalance the busiest of 8 EP
    # ranks holds 1.61x the routed tokens and dp 4 no longer fits; the layout rules are what this test is about
    job = TrainingJob(global_batch_size=256, seq_length=4096, expert_load_imbalance=1.0)
    par = ParallelConfig(tp=2, pp=2, dp=8, ep=8, etp=1, zero_stage=1, sequence_parallel=True)
    ev, why = keep_layout(m, H100, job, par, 24, 0.05, "megatron", "megatron")
    assert why is None and ev.feasible
    q = ev.parallel
    assert (q.tp, q.pp, q.cp, q.ep, q.etp, q.vpp, q.micro_batch_size, q.zero_stage) == (2, 2, 1, 8, 1, 1, 1, 1)
    assert q.dp == 4  # 24 GPUs: dp 6 breaks the expert grid (6*2 % 8) and the batch; dp 4 is the largest that runs
    ev, why = keep_layout(m, H100, job, par, 8, 0.05, "megatron", "megatron")
    assert ev is None and "pp x max(tp x cp, ep x etp) = 2 x max(2, 8) = 16" in why


def _brute_best(model, cluster, job, g):
    best = None
    gpn = cluster.node.gpus_per_node
    for w in [x for x in range(1, g + 1) if x % gpn == 0 or gpn % x == 0]:
        r = run_search(model, cluster, job, w, 1)
        if r.plans and (best is None or r.plans[0].step.tokens_per_s > best.step.tokens_per_s):
            best = r.plans[0]
    return best


@pytest.mark.parametrize("gbs", [64, 96])
def test_best_is_the_exact_optimum_over_every_world_size(gbs):
    """best_fallbacks equals planning every world size up to the healthy GPUs and keeping the fastest, and its
    step-time bounds stay below the plans' (the pruning is safe)."""
    m = get_model("llama3.1-8b")
    job = TrainingJob(global_batch_size=gbs, seq_length=4096)
    counts = [24, 16]
    res = best_fallbacks(m, H100, job, counts, SearchSpace(), 0.05, "megatron", "megatron")
    bounds = _world_bounds(m, H100, job, 24, SearchSpace(), "megatron")
    for g in counts:
        want = _brute_best(m, H100, job, g)
        got = res.best[g]
        assert got.step.tokens_per_s == pytest.approx(want.step.tokens_per_s, rel=1e-9)
        w = want.parallel.world_size
        assert min(lb for lb, _ in bounds[w]) <= want.step.step_s * (1 + 1e-9)


@pytest.fixture(scope="module")
def plans_json(tmp_path_factory):
    doc = planner.plan("llama3.1-8b", "dgx-h100", nodes=4, global_batch_size=64, seq_length=4096, top_k=2)
    path = tmp_path_factory.mktemp("fb") / "plans.json"
    path.write_text(doc.model_dump_json())
    return path


def test_fallback_document(plans_json):
    fb = planner.fallback(plan=plans_json, max_lost_nodes=2)
    d = json.loads(fb.model_dump_json())
    assert fb.model_dump_json() == planner.fallback(plan=plans_json, max_lost_nodes=2).model_dump_json()
    assert [e["lost_nodes"] for e in d["fallbacks"]] == [1, 2]
    base = d["original"]["throughput"]["tokens_per_s"]
    for e in d["fallbacks"]:
        assert e["healthy_gpus"] == 8 * (4 - e["lost_nodes"])
        k, b = e["keep_layout"], e["best"]
        if k is not None:
            o, q = d["original"]["parallel"], k["parallel"]
            assert all(o[x] == q[x] for x in ("tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "zero_stage",
                                              "first_stage_layers", "last_stage_layers", "pipeline_layout"))
            assert k["idle_gpus"] == e["healthy_gpus"] - k["launch"]["world_size"]
            assert k["throughput_retained"] == pytest.approx(k["throughput"]["tokens_per_s"] / base, rel=1e-4)
            assert k["resharding"].startswith("none")
        if b is not None:  # listed only when it beats keep_layout, and says how to reshard
            assert k is None or b["throughput"]["tokens_per_s"] > k["throughput"]["tokens_per_s"]
            assert "torch_dist" in b["resharding"]
        pick = b or k
        assert e["choice"] == ("best" if b else "keep_layout")
        assert e["throughput_retained"] == pick["throughput_retained"]


def test_fallback_from_job_options_equals_from_document(plans_json):
    a = planner.fallback(plan=plans_json, max_lost_nodes=1)
    b = planner.fallback("llama3.1-8b", "dgx-h100", nodes=4, global_batch_size=64, seq_length=4096,
                         max_lost_nodes=1)
    assert a.model_dump_json() == b.model_dump_json()
    # the document fixes the job: the API refuses job options next to it, as the CLI does
    with pytest.raises(planner.PlanInputError, match="--gpus, --seq-length: taken from --plan's document"):
        planner.fallback(plan=plans_json, max_lost_nodes=1, gpus=64, seq_length=8192)


def test_fallback_cli(run_cli, plans_json, tmp_path):
    r = run_cli("fallback", "--plan", str(plans_json), "--max-lost-nodes", "2")
    assert r.exit_code == 0, r.stderr
    assert "keep layout" in r.stdout and "restart with" in r.stdout
    j = run_cli("fallback", "--plan", str(plans_json), "--max-lost-nodes", "2", "--format", "json")
    assert j.exit_code == 0 and len(j.json()["fallbacks"]) == 2
    for args, msg in ((["--max-lost-nodes", "4"], "lose at most 3"),
                      (["--max-lost-nodes", "1", "--rank", "9"], "--rank 9"),
                      (["--max-lost-nodes", "1", "--gpus", "16"], "taken from --plan")):
        e = run_cli("fallback", "--plan", str(plans_json), *args)
        assert e.exit_code == 2 and msg in e.stderr and len(e.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    e = run_cli("fallback", "--plan", str(bad), "--max-lost-nodes", "1")
    assert e.exit_code == 2 and "not a plan document" in e.stderr and "input: Field required" in e.stderr
    # schema versions: another major, or a newer minor (it may carry fields this plan3d does not know), are refused
    # by name; an older minor reads (minor versions only add fields: document.py's version notes)
    doc = json.loads(plans_json.read_text())
    from planner.document import SCHEMA_VERSION
    newer = f"1.{int(SCHEMA_VERSION.split('.')[1]) + 1}"
    for version, msg in (("9.9", f"reads 1.0 to {SCHEMA_VERSION}"), (newer, "upgrade plan3d"), ("v1", "reads 1.0")):
        bad.write_text(json.dumps({**doc, "schema_version": version}))
        e = run_cli("fallback", "--plan", str(bad), "--max-lost-nodes", "1")
        assert e.exit_code == 2 and f"schema_version: '{version}'" in e.stderr and msg in e.stderr, e.stderr
    bad.write_text(json.dumps({**doc, "schema_version": "1.4"}))
    assert run_cli("fallback", "--plan", str(bad), "--max-lost-nodes", "1").exit_code == 0
    # an edited document is an input error naming the field (once exit 3 from ParallelConfig), read strictly
    # (a plan3d document has exact types) and checked against its own layout
    def edited(path: str, value) -> dict:
        d = json.loads(json.dumps(doc))
        *keys, last = path.split(".")
        cur = d
        for k in keys:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        if value is KeyError:
            del cur[last]
        else:
            cur[last] = value
        return d
    for path, value, msg in (("plans.0.parallel.tp", 0, "plans.0.parallel.tp: Input should be greater than 0"),
                             ("plans.0.parallel.zero_stage", 5, "plans.0.parallel.zero_stage"),
                             ("plans.0.parallel.pipeline_schedule", "zz", "plans.0.parallel.pipeline_schedule"),
                             ("plans.0.parallel.tp", True, "plans.0.parallel.tp: Input should be a valid integer"),
                             ("input.cluster.num_gpus", 33, "disagrees with plan #1's tp*pp*dp*cp"),
                             ("input.cluster.num_nodes", 3, "disagrees with plan #1's tp*pp*dp*cp"),
                             ("input.job.global_batch_size", 4096, "disagree with input.job.global_batch_size 4096"),
                             ("plans.0.parallel.num_microbatches", 99, "num_microbatches 99 disagree"),
                             ("schema_version", KeyError, "schema_version: Field required"),
                             ("schema_version", "01.5", "schema_version: '01.5'"),
                             ("plans", [], "the document has no plans")):
        bad.write_text(json.dumps(edited(path, value)))
        e = run_cli("fallback", "--plan", str(bad), "--max-lost-nodes", "1")
        assert e.exit_code == 2 and msg in e.stderr and len(e.stderr.strip().splitlines()) == 1, (path, e.stderr)
    pytest.importorskip("matplotlib")
    out = tmp_path / "fb.png"
    p = run_cli("fallback", "--plan", str(plans_json), "--max-lost-nodes", "2", "--plot", str(out))
    assert p.exit_code == 0 and out.stat().st_size > 1000


@pytest.mark.slow
def test_llama3_405b_on_16384_h100s_fallback():
    """The issue's case: GBS 2048 is a power of two, so after losing a node no world size close to 16,376 GPUs keeps
    interleaving; keep_layout halves DP (8,192 GPUs) and the best plan reshards onto ~15k GPUs with an odd pp."""
    doc = planner.plan("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048, seq_length=8192, top_k=1)
    fb = planner.fallback(plan=doc, max_lost_nodes=8)
    for e in fb.fallbacks:
        assert e.keep_layout.launch.world_size == 8192
        assert e.best is not None and e.best.parallel.pp % 2 == 1 and e.best.parallel.vpp == 1
        assert e.best.throughput_retained > e.keep_layout.throughput_retained


def test_checkpoint_advice_follows_the_checkpoint_format():
    # Megatron-FSDP plans (ZeRO-2/3) launch with --ckpt-format fsdp_dtensor; the distributed optimizer's torch_dist
    # advice does not load them (Megatron-LM docs/user-guide/features/megatron_fsdp.md)
    from cost_models.config import ParallelConfig
    from planner.fallback_plans import KEEP_LAYOUT_LOAD, RESHARDING, checkpoint_load
    z1, z2, z3 = (ParallelConfig(dp=8, zero_stage=z) for z in (1, 2, 3))
    assert checkpoint_load("megatron", z1, z1, True) == KEEP_LAYOUT_LOAD["megatron"]
    assert checkpoint_load("megatron", z1, z1, False) == RESHARDING["megatron"]
    assert "fsdp_dtensor" in checkpoint_load("megatron", z2, z3, True) and "dp_reshardable" not in \
        checkpoint_load("megatron", z2, z2, True)
    assert "convert it first" in checkpoint_load("megatron", z1, z3, False)
    assert "does not document" in checkpoint_load("megatron", z3, z1, False)
    assert checkpoint_load("torchtitan", z3, z3, False) == RESHARDING["torchtitan"]


def test_plan_document_inputs_of_every_kind(plans_json):
    # the parsed dict is a plan document too; JSON text and other types are one-line input errors
    doc = json.loads(plans_json.read_text())
    assert planner.fallback(plan=doc, max_lost_nodes=1).model_dump_json() == \
        planner.fallback(plan=plans_json, max_lost_nodes=1).model_dump_json()
    for bad, says in ((json.dumps(doc), "not its JSON text"), (123, "--plan int: give"),
                      ({"schema_version": "1.5", "fallbacks": []}, "a fallback document"),
                      ({"schema_version": "1.5", "rows": []}, "a comparison of clusters")):
        with pytest.raises(planner.PlanInputError, match=says):
            planner.fallback(plan=bad, max_lost_nodes=1)
    with pytest.raises(planner.PlanInputError, match="--model 123: give a built-in name"):
        planner.plan(123, gpus=8)
