"""Plans over pools of different GPUs (issue 12 part 1): the cost tables equal the step and memory models, the split
is the brute-force optimum, the search keeps every pool choice, memory-poor pools get fewer layers, the pool order
follows the end stages' imbalance, and the emitted layout passes Megatron-LM's own checks."""
from __future__ import annotations

import importlib.util
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from cluster_specs import ClusterSpecError, get_cluster
from cluster_specs.pools import load_mixed_cluster, mixed_cluster, parse_pools
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import parse_pipeline_layout, stage_layer_counts
from cost_models.activations import in_flight_microbatches
from cost_models.memory import estimate_memory
from cost_models.pools import estimate_pools
from cost_models.step_time import estimate_step
from model_zoo import get_model
from planner.pool_costs import layer_kinds, layer_times, stage_memory
from planner.pool_search import layout_string, search_pools
from planner.pool_split import StageSpec, best_split, brute_force_split

H100, A100 = get_cluster("dgx-h100"), get_cluster("dgx-a100-80g")
HAS_MCORE = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("megatron") is not None


def _layout(counts):
    return layout_string(counts)


@pytest.mark.parametrize("name,cluster,kw,precision", [
    ("llama3.1-8b", A100, dict(tp=2, cp=2, dp=2, sequence_parallel=True), "bf16"),
    ("mixtral-8x7b", H100, dict(tp=2, dp=4, ep=4, sequence_parallel=True, micro_batch_size=2), "bf16"),
    ("deepseek-v3", H100, dict(tp=2, dp=64, ep=32, sequence_parallel=True), "fp8"),
    ("gpt-oss-20b", H100, dict(dp=8, ep=8), "bf16"),  # sliding-window and full-attention layers alternate
])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_cost_tables_equal_the_step_and_memory_models(name, cluster, kw, precision, recompute):
    """Per-stage seconds from the tables equal estimate_step's per-stage forward + backward (to rounding), and the
    tables' memory is a lower bound of estimate_memory's per-stage peak (equal with one layer kind)."""
    m = get_model(name)
    job = TrainingJob(global_batch_size=1024, seq_length=4096, precision=precision)
    pp, L = 4, m.num_layers
    counts = [L // pp] * pp
    counts[-1] += L - sum(counts)
    par = ParallelConfig(pp=pp, recompute=recompute, pipeline_layout=_layout(counts), **kw)
    est = estimate_step(m, cluster, job, par)
    lt = layer_times(m, cluster, job, par)
    kinds = layer_kinds(m)
    mem = estimate_memory(m, cluster, job, par)
    facts = stage_memory(m, cluster, job, par)
    n_mb = par.num_microbatches(job.global_batch_size)
    start = 0
    for r, n in enumerate(counts):
        t = sum(lt.layer_s[kinds[i]] for i in range(start, start + n))
        t += (lt.first_s if r == 0 else 0.0) + (lt.last_s if r == pp - 1 else 0.0)
        assert t == pytest.approx(est.stage_forward_s[r] + est.stage_backward_s[r], rel=1e-12)
        f = in_flight_microbatches(par, r, n_mb)
        per = facts.per_layer(f)
        lb = facts.base(r, pp, f) + sum(per[kinds[i]] for i in range(start, start + n))
        assert lb <= mem.stages[r].total * (1 + 1e-12)
        if name not in ("deepseek-v3", "gpt-oss-20b"):  # one layer kind, Megatron ZeRO 0: the backward phase exactly
            assert lb == pytest.approx(mem.stages[r].total, rel=1e-9)
        start += n
    assert lt.p2p_s == pytest.approx(est.p2p_s)


@st.composite
def _instances(draw):
    p = draw(st.integers(1, 4))
    L = draw(st.integers(p, 9))
    mixed = draw(st.booleans())
    kinds = [draw(st.integers(0, 1)) for _ in range(L)] if mixed else None
    stages = []
    for _ in range(p):
        tau = draw(st.sampled_from([0.7, 1.0, 2.5]))
        layer_s = (tau, tau * draw(st.sampled_from([0.5, 1.0, 1.7])))
        stages.append(StageSpec(layer_s, draw(st.sampled_from([0, 0.3, 1.7])), draw(st.floats(0, 3)),
                                (1.0, draw(st.sampled_from([0.5, 1.0, 2.0]))), draw(st.floats(3, 12)),
                                draw(st.sampled_from([None, None, 2, 4]))))
    return stages, L, draw(st.integers(1, 12)), kinds


@settings(max_examples=300, deadline=None)
@given(_instances())
def test_split_is_the_brute_force_optimum(inst):
    """best_split minimises the 1F1B makespan model over every contiguous split with the memory and layer caps."""
    stages, L, m, kinds = inst
    a, b = best_split(stages, L, m, kinds), brute_force_split(stages, L, m, kinds)
    assert (a is None) == (b is None)
    if a is not None:
        assert a.makespan_model_s == pytest.approx(b.makespan_model_s, rel=1e-9)
        assert sum(a.layers) == L and min(a.layers) >= 1
        assert a.lower_bound_s <= a.makespan_model_s * (1 + 1e-12)


@pytest.mark.parametrize("counts", [[7, 9, 9, 9, 6], [80], [3, 6, 6, 6, 15, 15, 15, 14], [1, 1, 1], [5, 2, 2, 5]])
def test_layout_string_round_trips(counts):
    text = layout_string(counts)
    assert [c.count("t") for c in parse_pipeline_layout(text)] == counts
    if HAS_MCORE:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
        chunks = PipelineParallelLayerLayout.parse_str_to_list(text)
        assert [sum(1 for x in c if x.name == "decoder") for c in chunks] == counts


def test_identical_pools_price_as_one_cluster():
    """Two pools of the same hardware are one homogeneous cluster: same step time, throughput and memory."""
    twin = H100.model_copy(update={"name": "dgx-h100-b"})
    mc = mixed_cluster([(H100, 2), (twin, 2)])
    m = get_model("llama3.1-8b")
    job = TrainingJob(global_batch_size=256, seq_length=4096)
    par = ParallelConfig(tp=2, pp=4, dp=4, zero_stage=1, sequence_parallel=True, pipeline_layout=_layout([7, 9, 9, 7]))
    e = estimate_pools(m, mc, job, par, [0, 0, 1, 1])
    h = estimate_step(m, H100, job, par)
    assert e.step.step_s == pytest.approx(h.step_s, rel=1e-9)
    assert e.step.mfu == pytest.approx(h.mfu, rel=1e-9)
    assert [s.total for s in e.stages] == pytest.approx([s.total for s in estimate_memory(m, H100, job, par).stages])


def test_adding_a_slower_pool_never_lowers_the_best_throughput():
    """The H100 pool alone is one of the choices over H100 + A100, so the mixed answer is at least as fast as
    planning the H100s alone (plan3d plan, homogeneous space) and as the pools search over the H100s only."""
    kw = dict(global_batch_size=256, seq_length=4096, top_k=1)
    both = planner.plan_pools("llama3.1-8b", "dgx-h100:2,dgx-a100-80g:2", **kw)
    alone = planner.plan_pools("llama3.1-8b", "dgx-h100:2", **kw)
    homog = planner.plan("llama3.1-8b", "dgx-h100", nodes=2, **kw)
    best = both.plans[0].throughput.tokens_per_s
    assert best >= alone.plans[0].throughput.tokens_per_s
    assert best >= homog.plans[0].throughput.tokens_per_s
    sub = {tuple(s.pools): s for s in both.subsets}
    assert sub[("dgx-h100",)].tokens_per_s == pytest.approx(alone.plans[0].throughput.tokens_per_s)
    assert best == pytest.approx(max(s.tokens_per_s for s in both.subsets if s.tokens_per_s))
    for p in both.plans:  # every plan passes the independent checker on every pool it uses
        assert p.feasible and not p.violations


def test_memory_bound_pool_gets_fewer_layers():
    """Two pools of the same speed, one with half the memory: its stages hold fewer layers (70B, memory binds)."""
    small = H100.model_copy(update={"name": "h100-40g", "gpu": H100.gpu.model_copy(
        update={"memory_bytes": H100.gpu.memory_bytes // 2})})
    mc = mixed_cluster([(H100, 2), (small, 2)])
    res = search_pools(get_model("llama3.1-70b"), mc, TrainingJob(global_batch_size=256, seq_length=8192), top_k=3,
                       homogeneous=False)
    for p in res.plans:
        by_pool = {i: [s.num_layers for r, s in enumerate(p.estimate.stages) if p.stage_pool[r] == i] for i in (0, 1)}
        assert sum(by_pool[1]) / len(by_pool[1]) < sum(by_pool[0]) / len(by_pool[0])
        assert p.estimate.fits(0.05)


def _order_speed(model, mc, job, order):
    res = search_pools(model, mc, job, top_k=1, homogeneous=False, orders=[order])
    return res.plans[0]


def test_faster_pool_takes_the_heavy_logits_stage():
    """A 1M-token vocabulary makes the last stage (output layer, loss) the heavy end: the faster H100 pool is placed
    last, and the reverse order is slower; with equal speeds, the pool with more memory takes the first stage and
    its embedding table (the heavy end in memory)."""
    big = get_model("llama3.1-8b").model_copy(update={"name": "llama-1m-vocab", "vocab_size": 1024000})
    job = TrainingJob(global_batch_size=256, seq_length=4096)
    mc = mixed_cluster([(H100, 1), (A100, 1)])
    best = search_pools(big, mc, job, top_k=1, homogeneous=False).plans[0]
    assert best.stage_pool[-1] == 0  # H100 holds the last stage
    fast_last, fast_first = _order_speed(big, mc, job, (1, 0)), _order_speed(big, mc, job, (0, 1))
    assert fast_last.tokens_per_s > fast_first.tokens_per_s
    big_mem = H100.model_copy(update={"name": "h100-160g", "gpu": H100.gpu.model_copy(
        update={"memory_bytes": 2 * H100.gpu.memory_bytes})})
    mc2 = mixed_cluster([(H100, 1), (big_mem, 1)])
    emb = big.model_copy(update={"name": "llama-1m-vocab-untied", "tie_word_embeddings": False})
    b2 = search_pools(emb, mc2, job, top_k=1, homogeneous=False).plans[0]
    assert b2.stage_pool[0] == 1


@pytest.mark.skipif(not HAS_MCORE, reason="validators extra not installed (megatron-core)")
def test_emitted_layout_passes_megatron_checks():
    """The top plan's Megatron arguments pass validate_args' rules (commit 000c4ac24f61) and megatron-core's
    TransformerConfig; the layout object builds the plan's layers on every pipeline rank and validates."""
    import warnings

    from test_emit_support import megatron_core_config, megatron_layers_per_rank, megatron_validate_args, parse_argv
    doc = planner.plan_pools("llama3.1-70b", "dgx-h100:4,dgx-a100-80g:4", global_batch_size=256, seq_length=8192,
                             top_k=2)
    for p in doc.plans:
        args = parse_argv(p.launch.megatron)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vpp = megatron_validate_args(args, p.launch.world_size, p.launch.env["megatron"])  # with launch.env
            cfg = megatron_core_config(args, vpp)
            layers = megatron_layers_per_rank(cfg)
        assert [sum(x) for x in layers] == [s.num_layers for s in p.stages]
        par = ParallelConfig(pp=p.parallel.pp, pipeline_layout=p.parallel.pipeline_layout)
        assert stage_layer_counts(80, par) == [s.num_layers for s in p.stages]
        cfg.pipeline_model_parallel_layout.validate_layer_layout(num_layers=80, mtp_num_layers=None)


def test_pools_launch_env_holds_on_every_pool():
    # one launch script runs on the H100 and the A100 nodes alike: NCCL_NVLS_ENABLE=1 (which the H100 pool's TP
    # all-reduces would want) makes NCCL fail at start-up on the A100s, which have no NVLink SHARP; it is set only
    # where every pool's launch sets it, whichever pool holds the first stage
    doc = planner.plan_pools("llama3.1-70b", "dgx-h100:4,dgx-a100-80g:4", global_batch_size=256, seq_length=8192,
                             top_k=5)
    assert any(p.parallel.tp > 2 for p in doc.plans)
    for p in doc.plans:
        assert "NCCL_NVLS_ENABLE" not in p.launch.env["megatron"]
        assert p.launch.env["megatron"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" or p.parallel.tp == 1
    alone = planner.plan_pools("llama3.1-70b", "dgx-h100:4", global_batch_size=256, seq_length=8192, top_k=1)
    assert alone.plans[0].parallel.tp <= 2 or alone.plans[0].launch.env["megatron"]["NCCL_NVLS_ENABLE"] == "1"


def test_pools_launch_fp8_recipe_runs_on_every_pool():
    """One Megatron launch, one --fp8-recipe: the B200 pool alone would take MXFP8 (block-scaled tensor cores), which
    Transformer Engine refuses below compute capability 10.0, so a plan with H100 stages launches the recipe the H100
    runs (delayed per-tensor scaling for a dense model; blockwise for a MoE model, which TE runs on 9.0 and up);
    B200 with GB200 keeps MXFP8 (cost_models.fp8_recipe.shared_fp8_recipe)."""
    from cost_models.fp8_recipe import shared_fp8_recipe

    h100, b200, gb200 = get_cluster("dgx-h100"), get_cluster("dgx-b200"), get_cluster("gb200-nvl72")
    par = ParallelConfig(tp=8, pp=2)
    assert shared_fp8_recipe([b200, h100], get_model("llama3.1-70b"), par) == "delayed"
    assert shared_fp8_recipe([b200, h100], get_model("qwen3-30b-a3b"), par) == "blockwise"
    assert shared_fp8_recipe([b200, gb200], get_model("llama3.1-70b"), par) == "mxfp8"
    doc = planner.plan_pools("llama3.1-70b", "dgx-b200:2,dgx-h100:2", precision="fp8", global_batch_size=64,
                             top_k=3)
    for p in doc.plans:
        a = p.launch.megatron
        gpus = {u.gpu for u in p.pools}
        assert a[a.index("--fp8-recipe") + 1] == ("mxfp8" if gpus == {"B200"} else "delayed"), gpus


def test_pools_cli_tables_json_emit_and_timeline(run_cli, tmp_path):
    base = ["plan", "-m", "llama3.1-8b", "-c", "dgx-h100:1,dgx-a100-80g:1", "--global-batch-size", "128",
            "--seq-length", "4096", "--top-k", "2"]
    pytest.importorskip("matplotlib")
    out = tmp_path / "pools.png"
    r = run_cli(*base, "--timeline", str(out))
    assert r.exit_code == 0, r.stderr
    assert "pool subsets" in r.stdout and "dgx-a100-80g" in r.stdout
    assert out.stat().st_size > 1000
    a = run_cli(*base, "--format", "json")
    assert a.exit_code == 0
    api = planner.plan_pools("llama3.1-8b", "dgx-h100:1,dgx-a100-80g:1", global_batch_size=128, seq_length=4096,
                             top_k=2)
    assert a.stdout == api.model_dump_json()  # the CLI is the API's document, byte for byte (deterministic)
    doc = a.json()
    p = doc["plans"][0]
    assert p["parallel"]["pipeline_layout"] and sum(s["num_layers"] for s in p["stages"]) == 32
    assert {u["pool"] for u in p["pools"]} <= {"dgx-h100", "dgx-a100-80g"}
    assert {tuple(s["pools"]) for s in doc["subsets"]} == {("dgx-h100",), ("dgx-a100-80g",),
                                                           ("dgx-h100", "dgx-a100-80g")}
    e = run_cli(*base, "--emit", "megatron")
    assert e.exit_code == 0 and ("--pipeline-model-parallel-layout" in e.stdout or p["parallel"]["pp"] == 1)


@pytest.mark.parametrize("args,msg", [
    (["-c", "dgx-h100:0,dgx-a100-80g:1"], "positive node count"),
    (["-c", "dgx-h100:1,dgx-a100-80g"], "mixes names and NAME:NODES"),
    (["-c", "dgx-h100:1,dgx-h100:1"], "named twice"),
    (["-c", "dgx-h100:1,dgx-a100-80g:1", "--gpus", "16"], "--gpus"),
    (["-c", "dgx-h100:1,dgx-a100-80g:1", "--framework", "deepspeed"], "use megatron"),
    (["-c", "dgx-h100:1,no-such:1"], "no-such"),
    (["--timeline", "x.png"], "--timeline"),
])
def test_pools_bad_input_is_one_line_exit_2(run_cli, args, msg):
    r = run_cli("plan", "-m", "llama3.1-8b", *args)
    assert r.exit_code == 2, r.stdout
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_pools_yaml_file_with_network(tmp_path):
    f = tmp_path / "mixed.yaml"
    f.write_text("name: lab\npools:\n  - cluster: dgx-h100\n    nodes: 2\n  - cluster: dgx-a100-80g\n    nodes: 1\n"
                 "network:\n  nic_bandwidth_bytes_per_s: 12.5e+9\n  latency_s: 1.0e-5\n  bus_efficiency: 0.9\n"
                 "  source: one 100 Gb/s link per GPU between the rooms\n")
    mc = load_mixed_cluster(str(f))
    assert mc.name == "lab" and [p.num_gpus for p in mc.pools] == [16, 8]
    assert mc.network.achievable_bytes_per_s == pytest.approx(11.25e9)
    assert mc.link_cluster(1).network.nic_bandwidth_bytes_per_s == 12.5e9
    default = load_mixed_cluster("dgx-h100:2,dgx-a100-80g:1")
    assert default.network.nic_bandwidth_bytes_per_s == A100.network.nic_bandwidth_bytes_per_s  # the slower end
    assert parse_pools("a:1, b:2") == [("a", 1), ("b", 2)]
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - cluster: dgx-h100\n    nodes: -1\n")
    with pytest.raises(ClusterSpecError, match="nodes"):
        load_mixed_cluster(str(bad))


def test_pools_document_is_the_plan_format():
    doc = planner.plan_pools("llama3.1-8b", "dgx-h100:1,dgx-a100-80g:1", global_batch_size=128, seq_length=4096,
                             top_k=1)
    d = json.loads(doc.model_dump_json())
    p = d["plans"][0]
    for key in ("rank", "feasible", "violations", "parallel", "memory", "time", "throughput", "launch"):
        assert key in p
    assert p["idle_gpus"] == d["input"]["cluster"]["num_gpus"] - p["launch"]["world_size"]
    assert p["memory"]["capacity_bytes"] in {pool["memory_bytes_per_gpu"] for pool in d["input"]["cluster"]["pools"]}
    with pytest.raises(planner.PlanInputError, match="use megatron"):
        planner.plan_pools("llama3.1-8b", "dgx-h100:1,dgx-a100-80g:1", framework="deepspeed")


def test_moe_models_split_over_pools():
    """All-MoE layers (Mixtral) take the one-kind path with the MoE kind's costs; the mixed plan beats either pool."""
    mc = mixed_cluster([(H100, 2), (A100, 2)])
    res = search_pools(get_model("mixtral-8x7b"), mc, TrainingJob(global_batch_size=128, seq_length=4096), top_k=1,
                       homogeneous=False)
    best = res.plans[0]
    assert set(best.stage_pool) == {0, 1}
    by = {s.pools: s.plan.tokens_per_s for s in res.subsets if s.plan}
    assert best.tokens_per_s >= max(by[(0,)], by[(1,)])


def test_pools_of_different_vendors_are_refused(run_cli):
    # one torch.distributed job runs one collective library: NCCL (NVIDIA) or RCCL (AMD), not both
    r = run_cli("plan", "--model", "llama3.1-70b", "--cluster", "dgx-h100:2,mi300x:2", "--top-k", "1")
    assert r.exit_code == 2 and "GPUs of different vendors (dgx-h100 nvidia, mi300x amd)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_one_layout_reached_by_both_searches_is_listed_once():
    # the homogeneous search (first/last-stage layer counts) and the pools search (a layout string) can both reach
    # one layout on one pool; the table listed it twice (helper break-test, 2026-12-04)
    from types import SimpleNamespace

    from cost_models.config import ParallelConfig
    from planner.pool_search import _distinct
    a = ParallelConfig(tp=1, pp=9, dp=8, zero_stage=1, first_stage_layers=8, last_stage_layers=8)
    b = ParallelConfig(tp=1, pp=9, dp=8, zero_stage=1, pipeline_layout="|".join(["t" * 9] * 8 + ["t" * 8]))
    est = SimpleNamespace(step=SimpleNamespace(step_s=19.994))
    plans = [SimpleNamespace(parallel=a, stage_pool=[1] * 9, estimate=est, source="homogeneous search"),
             SimpleNamespace(parallel=b, stage_pool=[1] * 9, estimate=est, source="pools search"),
             SimpleNamespace(parallel=b, stage_pool=[0] + [1] * 8, estimate=est, source="pools search")]
    assert [p.source for p in _distinct(plans)] == ["homogeneous search", "pools search"]
