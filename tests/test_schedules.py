"""ZB-V, DualPipe, DualPipeV and Megatron's combined 1F1B: op orders against the reference implementations, bubbles
and activation memory against the published figures (schedules_failures_costs.md; DeepSeek-V3 report Table 2)."""
from __future__ import annotations

import importlib.util
import types

import pytest

from cluster_specs import get_cluster
from cost_models.combined_1f1b import combined_1f1b_orders, interleaved_placement
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.dualpipe import dualpipe_orders, dualpipev_orders
from cost_models.activations import in_flight_microbatches
from cost_models.memory import estimate_memory
from cost_models.pipeline import bubble_ratio, in_flight_chunks, op_orders, simulate
from cost_models.pipeline_ops import fb_seconds, peak_in_flight
from cost_models.zero_bubble_v import zbv_orders
from model_zoo import get_model
from planner.evaluation import evaluate

HAS_TORCH = importlib.util.find_spec("torch") is not None
# F, B (full backward = input + weight gradient), W per chunk with F = B - W = W (the published "F = B = W" case)
F, B, W = 1.0, 2.0, 1.0


def _sim(schedule: str, p: int, m: int, n: int, f=F, b=B, w=W, hide=0.0, **kw):
    return simulate(schedule, p, m, [f] * n, [b] * n, wgt_s=[w] * n, hide_f_s=[hide] * n, hide_b_s=[hide] * n, **kw)


# ------------------------------------------------------------------------------------------- orders = references
def _torch_orders(cls, p: int, m: int) -> list[list[tuple]]:
    from torch.distributed.pipelining.schedules import _ComputationType as C
    kind = {C.FORWARD: "F", C.BACKWARD_INPUT: "I", C.BACKWARD_WEIGHT: "W", C.FULL_BACKWARD: "B"}
    fake = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    out = []
    for r in range(p):
        ops = []
        for a in cls._calculate_single_rank_operations(fake, r):
            if a is None:
                continue
            if a.computation_type == C.OVERLAP_F_B:
                f, b = a.sub_actions
                ops.append(("FB", f.stage_index, f.microbatch_index, b.stage_index, b.microbatch_index))
            else:
                ops.append((kind[a.computation_type], a.stage_index, a.microbatch_index))
        out.append(ops)
    return out


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed (validators extra)")
@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (3, 1), (4, 5), (4, 8), (4, 13), (8, 20)])
def test_zbv_order_is_torchs(p, m):
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble
    assert [list(o) for o in zbv_orders(p, m)] == _torch_orders(ScheduleZBVZeroBubble, p, m)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed (validators extra)")
@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 8), (4, 13), (8, 20)])
def test_dualpipev_order_is_torchs(p, m):
    # torch's ScheduleDualPipeV transcribes deepseek-ai/DualPipe dualpipev.py; DualPipe shares our step builder
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV
    assert [list(o) for o in dualpipev_orders(p, m)] == _torch_orders(ScheduleDualPipeV, p, m)


def test_every_order_runs_each_op_once():
    for orders, n_stage_mb in ((dualpipe_orders(4, 10), 4 * 2 * 5), (dualpipev_orders(3, 7), 6 * 7),
                               (zbv_orders(3, 7), 6 * 7), (combined_1f1b_orders(4, 8, 2), 8 * 8)):
        fwd = [(op[1], op[2]) for o in orders for op in o if op[0] in ("F", "FB")]
        bwd = [(op[-2], op[-1]) for o in orders for op in o if op[0] in ("B", "I", "FB")]
        assert len(fwd) == len(set(fwd)) == n_stage_mb == len(bwd) == len(set(bwd))


def test_orders_refuse_what_the_references_assert():
    with pytest.raises(ValueError, match="even number of pipeline ranks"):
        dualpipe_orders(3, 12)
    with pytest.raises(ValueError, match="even number of micro-batches >= 2\\*pp = 8"):
        dualpipe_orders(4, 6)
    with pytest.raises(ValueError, match=">= 2\\*pp = 8"):
        dualpipev_orders(4, 7)


# -------------------------------------------------------------------------------------------- bubbles: formulas
@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("k", [2, 3])
def test_dualpipe_bubble_is_deepseek_table_2(p, k):
    # DeepSeek-V3 report Table 2: (PP/2 - 1)(F&B + B - 3W); F&B = F + B without communication to hide
    m = k * p
    sim = _sim("dualpipe", p, m, p)
    assert sim.bubble_s == pytest.approx((p / 2 - 1) * ((F + B) + B - 3 * W))
    assert max(sim.busy) == pytest.approx(m * (F + B))  # m/2 micro-batches through each of the two stages
    assert sim.bubble_s / max(sim.busy) == pytest.approx(bubble_ratio("dualpipe", p, m))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_dualpipev_bubble_is_dualpipes_on_twice_the_stages(p):
    # DualPipe README: DualPipeV on PP/2 devices has DualPipe's bubble over PP stages, (PP/2 - 1)(F&B + B - 3W)
    m = 4 * p
    sim = _sim("dualpipev", p, m, 2 * p)
    assert sim.bubble_s == pytest.approx((2 * p / 2 - 1) * ((F + B) + B - 3 * W))
    assert sim.bubble_s / max(sim.busy) == pytest.approx(bubble_ratio("dualpipev", p, m))
    # "cut in half": the same bubble as DualPipe on 2p ranks, also for unequal F, B, W and hidden communication
    for f, b, w, h in ((1.0, 2.4, 1.1, 0.0), (1.3, 2.0, 0.7, 0.2)):
        v = _sim("dualpipev", p, m, 2 * p, f, b, w, h)
        d = _sim("dualpipe", 2 * p, 2 * m, 2 * p, f, b, w, h)
        assert v.bubble_s == pytest.approx(d.bubble_s)


def test_dualpipe_overlap_shrinks_the_pair():
    # F&B hides each op's communication behind the other: 4 micro-batch pairs cost less, never below the longer op
    assert fb_seconds(1.0, 2.0, 0.3, 0.3) == pytest.approx(2.4)
    assert fb_seconds(1.0, 2.0, 1.0, 1.0) == 2.0
    p, m = 4, 16
    plain, hidden = _sim("dualpipe", p, m, p), _sim("dualpipe", p, m, p, hide=0.3)
    assert hidden.makespan < plain.makespan and max(hidden.hidden) > 0
    # with F&B = 2.4: (p/2 - 1)(F&B + B - 3W) = 1.4
    assert hidden.bubble_s == pytest.approx((p / 2 - 1) * (fb_seconds(F, B, 0.3, 0.3) + B - 3 * W))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zbv_is_a_parallelogram(p, m):
    # Qi et al. 2024 (arXiv 2405.15362; sail-sg README: ZB-V bubble rate 0 at T_F = T_B = T_W): no rank idles once
    # it has started, so the only idle time is the (p-1) F start-up of the parallelogram, which a run without
    # optimizer post-validation (Megatron, torch) cannot overlap with the next step
    sim = _sim("zb-v", p, m, 2 * p, record=True)
    assert sim.bubble_s == pytest.approx((p - 1) * F)
    assert sim.bubble_s / max(sim.busy) == pytest.approx(bubble_ratio("zb-v", p, m))
    for r in range(p):
        ops = sorted((o for o in sim.ops if o.rank == r), key=lambda o: o.start)
        assert ops[0].start == pytest.approx(r * F)
        assert all(b.start == pytest.approx(a.end) for a, b in zip(ops, ops[1:]))
    # half of ZB-H1's (p-1) F_stage: each chunk is half a stage
    zbh1 = simulate("zb-h1", p, m, [2 * F] * p, [2 * B] * p)
    assert sim.bubble_s == pytest.approx(zbh1.bubble_s / 2)


@pytest.mark.parametrize("p,v", [(4, 2), (4, 4), (8, 2)])
def test_combined_1f1b_keeps_the_interleaved_bubble(p, v):
    # schedules_failures_costs.md: "bubble unchanged" (pairing changes what is exposed, not the order's shape)
    m = 4 * p
    f, b = [F / v] * (p * v), [B / v] * (p * v)
    comb = simulate("combined-1f1b", p, m, f, b, vpp=v)
    inter = simulate("interleaved", p, m, f, b, vpp=v)
    assert comb.bubble_s / max(comb.busy) == pytest.approx((p - 1) / (v * m))
    assert comb.makespan == pytest.approx(inter.makespan)
    hidden = simulate("combined-1f1b", p, m, f, b, vpp=v, hide_f_s=[0.1 / v] * (p * v), hide_b_s=[0.1 / v] * (p * v))
    assert hidden.makespan < comb.makespan


def test_combined_1f1b_order_follows_megatron():
    # get_pp_rank_microbatches: warm-up (p-r-1)*2 + (v-1)*p forwards, plus one with the overlap; then merged pairs
    p, v, m = 4, 2, 8
    orders = combined_1f1b_orders(p, m, v)
    for r, o in enumerate(orders):
        warm = (p - r - 1) * 2 + (v - 1) * p + 1
        assert [op[0] for op in o[:warm]] == ["F"] * warm and o[warm][0] == "FB"
        assert [op[0] for op in o[-warm:]] == ["B"] * warm
    # no pipelining: F(0), then F(i+1) with B(i), then B(m-1) (combined_1f1b_schedule_for_no_pipelining)
    assert [op[0] for op in combined_1f1b_orders(1, 4, 1)[0]] == ["F", "FB", "FB", "FB", "B"]


def test_long_runs_extrapolate_exactly():
    for sched, p, n, vpp in (("dualpipe", 4, 4, 1), ("dualpipev", 4, 8, 2), ("zb-v", 4, 8, 2),
                             ("combined-1f1b", 4, 8, 2)):
        f = [1.0] * (n - 1) + [1.4]
        b = [2.0] * (n - 1) + [2.6]
        full = simulate(sched, p, 200, f, b, vpp=vpp, max_ops=10**9)
        fast = simulate(sched, p, 200, f, b, vpp=vpp, max_ops=100)
        assert fast.extrapolated and fast.makespan == pytest.approx(full.makespan, rel=1e-9), sched


# ------------------------------------------------------------------------------------------ activation memory
@pytest.mark.parametrize("p", [2, 4, 8])
def test_in_flight_activations_match_table_2(p):
    m = 6 * p
    # DeepSeek-V3 Table 2: activations PP + 1 per device (chunks of one stage; DualPipeV's PP = 2p half stages)
    assert in_flight_chunks("dualpipe", p, m) == (p + 1,) * p
    assert in_flight_chunks("dualpipev", p, m) == (2 * p + 1,) * p
    # ZB-V: 2p half-stage chunks = 1F1B's p stages (Qi et al. 2024: same activation memory as 1F1B)
    assert in_flight_chunks("zb-v", p, m) == (2 * p,) * p
    # combined 1F1B: one chunk more than interleaved on every rank (the extra warm-up forward)
    v = 2
    inter = [min(m * v, (p - r - 1) * 2 + (v - 1) * p + 1) for r in range(p)]
    assert list(in_flight_chunks("combined-1f1b", p, m, v)) == [c + 1 for c in inter]


def test_in_flight_cap_equals_the_full_order():
    for sched, p, v, step in (("dualpipe", 4, 1, 2), ("dualpipev", 4, 2, 1), ("zb-v", 3, 2, 1),
                              ("combined-1f1b", 4, 2, 4)):
        for m in range(8 * p, 40 * p, step * 7):
            orders, place = op_orders(sched, p, m, v)
            assert tuple(peak_in_flight([list(o) for o in orders], place)) == in_flight_chunks(sched, p, m, v)


def test_memory_model_counts_parameters_twice_and_the_v_ends():
    model, cluster = get_model("llama3.1-70b"), get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    base = dict(tp=8, pp=8, dp=1, zero_stage=0, sequence_parallel=True)
    one = estimate_memory(model, cluster, job, ParallelConfig(**base))
    dual = estimate_memory(model, cluster, job, ParallelConfig(**base, schedule="dualpipe"))
    # DeepSeek-V3 Table 2 "Parameter 2x": a middle rank holds its stage and the mirror stage
    assert dual.stages[3].weights == pytest.approx(2 * one.stages[3].weights)
    # both end ranks hold the embedding (stage 0) and the output layer (stage p-1)
    assert dual.stages[0].weights == pytest.approx(dual.stages[7].weights)
    assert dual.stages[0].logits > 0 and dual.stages[7].logits > 0
    # activations: (p + 1) chunks of the rank's two stages = (p + 1) / 2 whole-rank micro-batches
    assert in_flight_microbatches(ParallelConfig(**base, schedule="dualpipe"), 3, 64) == pytest.approx(4.5)
    zbv = estimate_memory(model, cluster, job, ParallelConfig(**base, vpp=2, schedule="zb-v"))
    # a V puts the embedding and the output layer on rank 0, the last rank holds neither
    assert zbv.stages[0].logits > 0 and zbv.stages[7].logits == 0
    assert zbv.stages[0].weights > one.stages[0].weights and zbv.stages[7].weights < one.stages[7].weights
    assert [s.in_flight_microbatches for s in zbv.stages] == [8.0] * 8  # 1F1B's p on every rank


# -------------------------------------------------------------------------------------- rules and evaluation
def test_schedule_rules_are_checked():
    model, cluster = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=256, seq_length=4096)

    def names(fw="megatron", **kw):
        par = ParallelConfig(**{"tp": 2, "pp": 4, "dp": 8, "ep": 8, "etp": 1, "sequence_parallel": True,
                                "zero_stage": 1, **kw})
        return {v.name for v in evaluate(model, cluster, job, par, 64, framework=fw).violations}

    assert names(vpp=2, schedule="combined-1f1b") == set()
    assert "schedule_combined_vpp" in names(schedule="combined-1f1b")  # pp > 1 needs virtual stages
    assert "schedule_combined_recompute" in names(vpp=2, schedule="combined-1f1b", recompute="full")
    assert "schedule_framework" in names("torchtitan", vpp=2, schedule="combined-1f1b")
    assert names("torchtitan", vpp=2, schedule="zb-v", zero_stage=3) == set()
    assert "schedule_v_chunks" in names("torchtitan", vpp=4, schedule="zb-v", zero_stage=3)
    assert "schedule_framework" in names("megatron", vpp=2, schedule="dualpipev")
    assert {"schedule_framework"} == names("megatron", schedule="dualpipe")  # evaluated, runs nowhere
    assert "schedule_microbatches" in names("torchtitan", vpp=2, schedule="dualpipev", zero_stage=3,
                                            micro_batch_size=8)  # 4 micro-batches < 2 pp
    # the example: DeepSpeed runs no virtual stages, so vpp 2 is not a DeepSpeed plan
    assert "schedule_framework" in names("deepspeed", vpp=2)


def test_combined_1f1b_hides_expert_all_to_all():
    model, cluster = get_model("mixtral-8x22b"), get_cluster("dgx-h200")
    job = TrainingJob(global_batch_size=512, seq_length=4096)
    base = dict(tp=2, pp=4, dp=32, ep=8, etp=1, vpp=2, sequence_parallel=True, zero_stage=1)
    inter = evaluate(model, cluster, job, ParallelConfig(**base), 256)
    comb = evaluate(model, cluster, job, ParallelConfig(**base, schedule="combined-1f1b"), 256)
    assert inter.feasible and comb.feasible
    assert comb.step.exposed_comm_s["ep"] < inter.step.exposed_comm_s["ep"]
    assert comb.step.step_s < inter.step.step_s
    # one more chunk in flight than interleaved (Megatron's extra warm-up forward)
    assert comb.memory.stages[0].in_flight_microbatches == inter.memory.stages[0].in_flight_microbatches + 0.5


def test_plan_pins_a_schedule_the_framework_runs(run_cli):
    r = run_cli("plan", "-m", "llama3.1-8b", "--gpus", "16", "--global-batch-size", "64", "--framework", "torchtitan",
                "--pipeline-schedule", "zb-v", "--top-k", "2", "--format", "json")
    assert r.exit_code == 0, r.stderr
    plans = r.json()["plans"]
    assert plans and all(p["parallel"]["pipeline_schedule"] == "zb-v" and p["parallel"]["vpp"] == 2 for p in plans)
    assert plans[0]["launch"]["torchtitan_toml"] and "ZBVZeroBubble" in plans[0]["launch"]["torchtitan_toml"]
    r = run_cli("plan", "--pipeline-schedule", "dualpipe")
    assert r.exit_code == 2 and "--pipeline-schedule dualpipe: megatron plans search 1f1b, interleaved, " \
                                "combined-1f1b" in r.stderr
