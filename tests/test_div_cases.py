"""The DIV field cases (shared/data/field_cases.md F14, F15, F16, F18, F19, F21), each with its expected answer.

Every case is checked twice: by the independent checker (``planner.checks``), which must reject exactly the
layouts the frameworks reject, and by the search space / solver, which must never propose them.
"""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import stage_layer_counts, uneven_split
from model_zoo import get_model
from model_zoo.spec import ModelSpec, MoESpec
from planner.checks import check_config, constraint_report
from planner.solver import solve
from planner.space import SearchSpace, candidates, layer_split

H100 = get_cluster("dgx-h100")
JOB = TrainingJob(global_batch_size=512, seq_length=4096)


def _dense(layers: int, heads: int = 32, kv: int | None = None, head_dim: int = 128) -> ModelSpec:
    return ModelSpec(name=f"dense-{layers}L-{heads}H", source="test", num_layers=layers,
                     hidden_size=heads * head_dim, num_attention_heads=heads, num_kv_heads=kv or heads,
                     head_dim=head_dim, ffn_hidden_size=4 * heads * head_dim, gated_mlp=True, vocab_size=32000)


def _names(model, par, n, job=JOB, framework="megatron"):
    return {v.name for v in check_config(model, H100, job, par, n, framework=framework)}


# ---- F14: virtual pipeline stages must divide each stage's layers -------------------------------------------
@pytest.mark.parametrize("layers,pp,valid", [(80, 16, {1, 5}), (40, 8, {1, 5}), (40, 2, {1, 2, 4, 5, 10, 20})])
def test_f14_valid_vpp_sets(layers, pp, valid):
    """Expected (field_cases.md F14): VP {1,5} for (80, PP16) and (40, PP8); {1,2,4,5,10,20} for (40, PP2)."""
    m = _dense(layers)
    ok = set()
    for v in range(1, layers + 1):
        par = ParallelConfig(tp=1, pp=pp, dp=1, vpp=v)
        if "layers_vpp" not in _names(m, par, pp, TrainingJob(global_batch_size=pp * 4, seq_length=4096)):
            ok.add(v)
    assert ok == valid


def test_f14_silent_layer_drops_are_rejected():
    """A: 80 layers, PP16, 2 layers per virtual stage (vpp 2.5 -> Megatron used 2 and trained 64 layers): vpp 2
    is rejected. C: 40 layers, PP2, VP12 aborts in Megatron-Core (20 % 12 != 0); VP10 is the fix."""
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    assert "layers_vpp" in _names(_dense(80), ParallelConfig(pp=16, vpp=2), 16, job)
    assert "layers_vpp" in _names(_dense(40), ParallelConfig(pp=2, vpp=12), 2, job)
    assert "layers_vpp" not in _names(_dense(40), ParallelConfig(pp=2, vpp=10), 2, job)


def test_f14_space_never_proposes_a_dropping_vpp():
    m = _dense(80, heads=64)
    for par in candidates(m, H100, TrainingJob(global_batch_size=256, seq_length=4096), 128,
                          SearchSpace(tp=(8,), pp=(16,), micro_batch_size=(1,), zero_stage=(1,),
                                      recompute=("none",), sequence_parallel=(True,))):
        assert par.vpp in (1, 5)


# ---- F15: layers not divisible by pp -> reject, or an uneven first/last split ------------------------------
def test_f15_30_layers_on_pp4_is_7_8_8_7():
    m = _dense(30)
    assert "layers_pp" in _names(m, ParallelConfig(pp=4), 4)
    assert uneven_split(30, 4) == (7, 7)
    par = ParallelConfig(pp=4, first_stage_layers=7, last_stage_layers=7)
    assert stage_layer_counts(30, par) == [7, 8, 8, 7]
    assert "layers_pp" not in _names(m, par, 4)


def test_f15_40_layers_on_pp16_and_60_on_pp8():
    """40 on PP16: the only first==last split is [6, 14 x 2, 6] (valid for Megatron, given explicitly); the
    planner's own split keeps the end stages no heavier than the middle, so it does not propose pp 16 for 40
    layers. 60 on PP8: the planner proposes [6, 6 x 8, 6]; Bridge's custom [4, 8 x 6, 8] is valid too."""
    m40, m60 = _dense(40), _dense(60)
    assert "layers_pp" in _names(m40, ParallelConfig(pp=16), 16)
    given = ParallelConfig(pp=16, first_stage_layers=6, last_stage_layers=6)
    assert stage_layer_counts(40, given) == [6] + [2] * 14 + [6]
    assert "layers_pp" not in _names(m40, given, 16)
    assert layer_split(m40, 16) is None
    assert uneven_split(60, 8) == (6, 6)
    assert stage_layer_counts(60, ParallelConfig(pp=8, first_stage_layers=6, last_stage_layers=6)) == [6] + [8] * 6 + [6]
    bridge = ParallelConfig(pp=8, first_stage_layers=4, last_stage_layers=8)
    assert stage_layer_counts(60, bridge) == [4] + [8] * 6 + [8]
    assert "layers_pp" not in _names(m60, bridge, 8)


# ---- F16: GLM-4.5 (92 L) on PP8, GLM-4.5-Air (46 L) on PP4, and the MoE grid ------------------------------
def test_f16_glm_uneven_splits_match_the_bridge_fix():
    """Megatron-Bridge PR #5551 sets [10, 12 x 6, 10] for 92 layers and [11, 12, 12, 11] for 46."""
    assert uneven_split(92, 8) == (10, 10)
    assert uneven_split(46, 4) == (11, 11)
    assert stage_layer_counts(92, ParallelConfig(pp=8, first_stage_layers=10, last_stage_layers=10)) == \
        [10] + [12] * 6 + [10]
    assert stage_layer_counts(46, ParallelConfig(pp=4, first_stage_layers=11, last_stage_layers=11)) == [11, 12, 12, 11]


def _glm45_air() -> ModelSpec:
    # GLM-4.5-Air config.json (zai-org/GLM-4.5-Air): 46 layers, hidden 4096, 96 heads, 8 KV heads, head_dim 128,
    # 128 routed experts (top-8, width 1408), 1 shared expert, first layer dense (ffn 10944), vocab 151552
    return ModelSpec(name="glm-4.5-air", source="zai-org/GLM-4.5-Air config.json", num_layers=46, hidden_size=4096,
                     num_attention_heads=96, num_kv_heads=8, head_dim=128, ffn_hidden_size=10944, gated_mlp=True,
                     vocab_size=151552, moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1408,
                                                     num_shared_experts=1, shared_expert_ffn_hidden_size=1408,
                                                     first_k_dense_layers=1))


def test_f16_world_size_multiple_of_the_expert_grid():
    """ms-swift #5737: TP8 PP4 CP1 EP16 ETP1: dense grid 32, expert grid ETP*EP*PP = 64, so the world must be a
    multiple of 64: 32 GPUs is rejected (expert_grid), 64 is accepted."""
    m = _glm45_air()
    job = TrainingJob(global_batch_size=16, seq_length=4096)
    split = dict(first_stage_layers=11, last_stage_layers=11)
    bad = ParallelConfig(tp=8, pp=4, dp=1, ep=16, etp=1, micro_batch_size=2, sequence_parallel=True, **split)
    good = bad.model_copy(update={"dp": 2, "micro_batch_size": 1})
    assert "expert_grid" in _names(m, bad, 32, job)
    assert "expert_grid" not in _names(m, good, 64, job)


# ---- F18: attention heads not divisible by tp ---------------------------------------------------------------
@pytest.mark.parametrize("heads,head_dim,valid", [(52, 128, {1, 2, 4, 13, 26, 52}), (12, 64, {1, 2, 3, 4, 6, 12})])
def test_f18_valid_tp_sets(heads, head_dim, valid):
    """LLaMA-30B (52 heads) and GPT-2 small (12 heads): valid TP {1,2,4,13,26,52} and {1,2,3,4,6,12}."""
    m = _dense(60, heads=heads, head_dim=head_dim)
    ok = {t for t in range(1, 65) if not {"heads_tp", "kv_heads_tp"} & _names(m, ParallelConfig(tp=t), t)}
    assert ok == valid


def test_f18_llama30b_tp8_is_never_proposed_and_explained():
    m = _dense(60, heads=52)
    tps = {p.tp for p in candidates(m, H100, JOB, 8, SearchSpace(micro_batch_size=(1,), zero_stage=(1,),
                                                                    recompute=("full",)))}
    assert tps == {1, 2, 4}
    rep = {c.name: c for c in constraint_report(m, H100, JOB, ParallelConfig(tp=8), 8)}
    assert not rep["heads_tp"].ok and rep["heads_tp"].slack == -4  # 52 % 8 = 4


# ---- F19: DeepSpeed pipeline engine with ZeRO-2/3 -----------------------------------------------------------
def test_f19_deepspeed_pipeline_never_with_zero2_or_3():
    m = get_model("llama2-13b")
    par = ParallelConfig(tp=1, pp=2, dp=4, zero_stage=2)
    assert "deepspeed_pipeline_zero" in _names(m, par, 8, framework="deepspeed")
    assert "deepspeed_pipeline_zero" not in _names(m, par, 8, framework="megatron")
    assert "deepspeed_pipeline_zero" not in _names(m, par.model_copy(update={"zero_stage": 1}), 8,
                                                   framework="deepspeed")
    for p in candidates(m, H100, JOB, 16, SearchSpace(micro_batch_size=(1,), recompute=("full",)),
                        framework="deepspeed"):
        assert not (p.pp > 1 and p.zero_stage >= 2)
    res = solve(m, H100, JOB, 16, top_k=5, framework="deepspeed",
                space=SearchSpace(micro_batch_size=(1,), recompute=("full",)))
    assert res.plans and all(not (e.parallel.pp > 1 and e.parallel.zero_stage >= 2) for e in res.plans)


# ---- F21: sequence divisibility with CP and SP; EP + TP requires SP -----------------------------------------
@pytest.mark.parametrize("cp,tp,multiple", [(2, 4, 8), (2, 8, 16), (4, 3, 24)])
def test_f21_sequence_multiple_with_cp_and_sp(cp, tp, multiple):
    """With SP the sequence must be a multiple of CP * lcm(2, TP): CP2 TP4 -> 8, CP2 TP8 -> 16, CP4 TP3 -> 24."""
    m = _dense(8, heads=24)
    for s in range(multiple, 4 * multiple + 1):
        job = TrainingJob(global_batch_size=8, seq_length=s)
        par = ParallelConfig(tp=tp, cp=cp, dp=1, sequence_parallel=True)
        bad = {"seq_cp", "seq_sp"} & _names(m, par, tp * cp, job)
        assert (not bad) == (s % multiple == 0), s


def test_f21_ep_with_tp_requires_sp():
    """NeMo-Launcher PR #309: Mixtral-8x7B with TP > 1 and EP > 1 needs sequence parallelism."""
    m = get_model("mixtral-8x7b")
    par = ParallelConfig(tp=2, pp=1, dp=8, ep=8, etp=1, sequence_parallel=False)
    assert "ep_tp_needs_sp" in _names(m, par, 16)
    assert "ep_tp_needs_sp" not in _names(m, par.model_copy(update={"sequence_parallel": True}), 16)
    for p in candidates(m, H100, JOB, 16, SearchSpace(micro_batch_size=(1,), zero_stage=(1,), recompute=("full",))):
        assert not (p.tp > 1 and p.ep > 1 and not p.sequence_parallel)


def test_expert_tensor_parallel_options_and_grid():
    """Expert TP (issue 11): Megatron any divisor of tp that divides the expert FFN width
    (--expert-tensor-parallel-size; parallel_state needs etp*ep*pp to divide the world), torchtitan 1 or tp
    (expert_tensor_parallel_degree), DeepSpeed 1; every proposed layout tiles the world with the expert grid
    ep x etp (F16)."""
    m = get_model("mixtral-8x7b")  # expert FFN 14336 = 2^11 x 7: every divisor of tp 8 divides it
    sp = SearchSpace(micro_batch_size=(1,), zero_stage=(1,), recompute=("full",))
    seen = set()
    for p in candidates(m, H100, JOB, 32, sp):
        if p.ep > 1:
            assert p.tp % p.expert_tp == 0
            assert (p.dp * p.cp * p.tp) % (p.ep * p.expert_tp) == 0
            seen.add((p.tp, p.expert_tp))
    assert {(4, 4), (4, 2), (4, 1), (8, 8), (8, 4), (8, 2), (8, 1)} <= seen
    fsdp = SearchSpace(micro_batch_size=(1,), zero_stage=(3,), recompute=("full",))
    assert {p.expert_tp for p in candidates(m, H100, JOB, 32, fsdp, framework="torchtitan")
            if p.ep > 1 and p.tp == 8} == {1, 8}
    assert all(p.expert_tp == 1 for p in candidates(m, H100, JOB, 32, sp, framework="deepspeed") if p.ep > 1)


def test_expert_tensor_parallel_rules_are_checked():
    """The checker rejects an expert width etp does not split (Megatron ``divide``) and, for torchtitan, any etp
    other than 1 or tp (issue 11: the search now proposes every divisor of tp for Megatron)."""
    m = get_model("mixtral-8x7b")  # expert FFN 14336 = 2^11 x 7
    par = ParallelConfig(tp=8, pp=1, dp=4, ep=8, etp=2, sequence_parallel=True)
    assert not {"expert_ffn_etp", "torchtitan_etp"} & _names(m, par, 32)
    assert "torchtitan_etp" in _names(m, par.model_copy(update={"zero_stage": 3}), 32, framework="torchtitan")
    assert "torchtitan_etp" not in _names(m, par.model_copy(update={"etp": 8, "zero_stage": 3}), 32,
                                          framework="torchtitan")
    odd = ParallelConfig(tp=6, pp=1, dp=4, ep=8, etp=3, sequence_parallel=True)
    assert "expert_ffn_etp" in _names(m, odd, 24)


def test_moe_with_tp_requires_sp_at_ep_1_too():
    """Megatron-LM MoELayer.forward raises in training when the attention TP group is > 1 without sequence
    parallelism, whatever ep (megatron/core/transformer/moe/moe_layer.py at d98e8a64dd)."""
    m = get_model("mixtral-8x7b")
    par = ParallelConfig(tp=4, pp=1, dp=4, ep=1, sequence_parallel=False)
    assert "ep_tp_needs_sp" in _names(m, par, 16)
    assert "ep_tp_needs_sp" not in _names(m, par.model_copy(update={"sequence_parallel": True}), 16)
    for p in candidates(m, H100, JOB, 16, SearchSpace(micro_batch_size=(1,), zero_stage=(1,), recompute=("full",))):
        assert not (p.tp > 1 and not p.sequence_parallel)


def test_deepep_needs_tp_times_ep_above_1():
    """Megatron-LM MoEFlexTokenDispatcher: assert tp_size * ep_size > 1, "DeepEP dispatcher requires TPxEP > 1"."""
    m = get_model("mixtral-8x7b")
    par = ParallelConfig(tp=1, pp=1, dp=8, ep=1)
    deepep = TrainingJob(global_batch_size=64, moe_flex_dispatcher_backend="deepep")
    assert "deepep_tp_ep" in _names(m, par, 8, deepep)
    assert "deepep_tp_ep" not in _names(m, par.model_copy(update={"ep": 8}), 8, deepep)
    hybridep = TrainingJob(global_batch_size=64, moe_flex_dispatcher_backend="hybridep")  # no such assert
    assert "deepep_tp_ep" not in _names(m, par, 8, hybridep)


def test_recompute_modules_need_selective_recompute():
    """--recompute-modules is read only under selective recompute (megatron-core TransformerConfig); given with
    another recompute mode it is reported, as recompute_num_layers without full recompute is."""
    m = get_model("mixtral-8x7b")
    par = ParallelConfig(tp=1, pp=1, dp=8, ep=8, recompute="none", recompute_modules=("moe",))
    assert "recompute_modules" in _names(m, par, 8)
    assert "recompute_modules" not in _names(m, par.model_copy(update={"recompute": "selective"}), 8)
