"""Memory model checked against measured numbers (field_cases.md MEM cases, torchtitan published rows) and against
the estimators of DeepSpeed and Megatron-LM. Every expected number names its source in tests/data/memory_cases*.yaml.
"""
from __future__ import annotations

import functools

import pytest
import yaml

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import uneven_split
from cost_models.activations import activation_bytes_per_layer, in_flight_microbatches
from cost_models.memory import estimate_memory, model_state_terms
from model_zoo import get_model, load_model_file
from model_zoo.spec import ModelSpec

from pathlib import Path

DATA = Path(__file__).parent / "data"

GiB = 2**30
MiB = 2**20
GB = 1e9

CASES = yaml.safe_load((DATA / "memory_cases.yaml").read_text())
TT_ROWS = yaml.safe_load((DATA / "memory_cases_torchtitan.yaml").read_text())


@functools.lru_cache(maxsize=1)
def _dev_rows() -> dict:
    from planner.published_rows import default_dataset
    return {r["id"]: r for r in yaml.safe_load(default_dataset().read_text())}


def _dev_setup(row_id: str) -> dict:
    """The ``setup`` facts (each with its source) of the development row of the same id, if any."""
    return (_dev_rows().get(row_id) or {}).get("setup") or {}


def _cluster_with(name: str, memory_bytes: int, gpu_name: str | None = None):
    c = get_cluster(name)
    gpu = c.gpu.model_copy(update={"memory_bytes": memory_bytes, "name": gpu_name or c.gpu.name})
    return c.model_copy(update={"gpu": gpu})


# ---------------------------------------------------------------- F06: Megatron Llama-2-7B, four configurations

F06 = CASES["f06_llama2_7b_megatron"]


def f06_predictions():
    m = get_model(F06["model"])
    c = get_cluster(F06["cluster"])
    out = []
    for r in F06["rows"]:
        job = TrainingJob(global_batch_size=r["global_batch_size"], seq_length=F06["seq_length"])
        par = ParallelConfig(tp=r["tp"], pp=r["pp"], dp=r["dp"], micro_batch_size=r["micro_batch_size"], zero_stage=1)
        est = estimate_memory(m, c, job, par)
        out.append((r, est))
    return out


@pytest.mark.parametrize("i", range(4))
def test_f06_peak_allocated_within_5_percent(i):
    r, est = f06_predictions()[i]
    predicted_gb = est.peak_allocated_bytes / GB
    err = (predicted_gb - r["measured_gb"]) / r["measured_gb"]
    assert abs(err) <= 0.05, (r, predicted_gb, err)
    assert est.fits


def test_f06_model_state_bytes_per_param_is_6_plus_12_over_dp():
    # Megatron issue #654: 2 + 4 + 12 bytes, only the 12 sharded by the distributed optimizer -> 6 + 12/DP.
    m = get_model("llama2-7b")
    p = m.num_parameters()
    w, g, o = model_state_terms("megatron", 1, p, 8)
    assert (w + g + o) / p == pytest.approx(6 + 12 / 8)
    w, g, o = model_state_terms("megatron", 0, p, 8)
    assert (w + g + o) / p == 18


# ---------------------------------------------------------------- F02: DeepSpeed ZeRO-2 on V100-32GB

F02 = CASES["f02_llama7b_zero2_v100"]


def _f02(zero_stage: int):
    m = get_model(F02["model"])
    c = _cluster_with("dgx-a100-40g", int(F02["capacity_gib"] * GiB), "V100")
    job = TrainingJob(global_batch_size=8, seq_length=F02["seq_length"], precision="fp16", framework="deepspeed")
    par = ParallelConfig(dp=8, zero_stage=zero_stage)
    return estimate_memory(m, c, job, par, reserve_bytes=F02["reserve_gib"] * GiB)


def test_f02_zero2_optimizer_step_temporary_is_the_failed_allocation():
    st = _f02(2).stages[0]
    # The Adam step's fp32 temporary 4P/N = 3.14 GiB is the allocation that failed (field_cases.md F02).
    assert st.phase_terms["optimizer"]["transient"] / GiB == pytest.approx(F02["failed_allocation_gib"], abs=0.005)
    # model states: DeepSpeed's estimator 2P + 18P/N = 26.67 GiB (validators.md table)
    assert st.model_states / GiB == pytest.approx(26.67, abs=0.01)
    # allocated at the failing moment: 28.28 GiB held + 3.14 GiB requested; ours within 5%
    measured = F02["allocated_before_gib"] + F02["failed_allocation_gib"]
    predicted = (st.phases["optimizer"] - st.reserve) / GiB
    assert abs(predicted - measured) / measured <= 0.05, predicted


def test_f02_verdicts_zero2_oom_zero3_fits():
    assert _f02(2).fits is F02["zero2_fits"]
    assert _f02(3).fits is F02["zero3_fits"]


# ---------------------------------------------------------------- F03: MPT-7B on one A100-80GB

F03 = CASES["f03_mpt7b_one_a100"]


def test_f03_mpt7b_infeasible_on_one_gpu_for_any_batch():
    m = ModelSpec(**F03["model_spec"])
    c = get_cluster(F03["cluster"])
    for mbs in (1, 2):
        job = TrainingJob(global_batch_size=mbs, seq_length=F03["seq_length"], framework="torchtitan")
        est = estimate_memory(m, c, job, ParallelConfig(micro_batch_size=mbs, recompute="full", zero_stage=3))
        assert est.stages[0].model_states / GiB == pytest.approx(F03["model_states_gib"], abs=0.5)
        assert est.fits is F03["fits"]


# ---------------------------------------------------------------- F07: unfused attention

F07 = CASES["f07_unfused_attention"]


def _f07(flash: bool, dp: int = 1, zero: int = 0):
    m = ModelSpec(**F07["model_spec"])
    c = get_cluster(F07["cluster"])
    job = TrainingJob(global_batch_size=dp, seq_length=F07["seq_length"], flash_attention=flash, dropout=True)
    return m, job, ParallelConfig(dp=dp, zero_stage=zero), estimate_memory(m, c, job, ParallelConfig(dp=dp, zero_stage=zero))


def test_f07_score_terms_match_the_log_exactly():
    m, job_off, par, est_off = _f07(False)
    _, job_on, _, _ = _f07(True)
    diff = activation_bytes_per_layer(m, job_off, par, 0) - activation_bytes_per_layer(m, job_on, par, 0)
    lse = 4 * m.num_attention_heads * F07["seq_length"]  # flash keeps only the fp32 log-sum-exp
    assert (diff + lse) / MiB == F07["stored_scores_mib_per_layer"]
    # the forward transient is the fp32 QK^T tensor of the running layer
    assert est_off.stages[0].phase_terms["forward"]["transient"] / MiB == F07["fp32_scores_mib"]


def test_f07_verdicts():
    assert not _f07(False)[3].fits                    # unfused: ~80 GiB of scores alone
    assert not _f07(False, dp=8, zero=1)[3].fits      # still OOM with the optimizer sharded
    assert _f07(True, dp=8, zero=1)[3].fits            # flash attention: the term vanishes


# ---------------------------------------------------------------- F22: torchtitan FSDP memory boundary

F22 = CASES["f22_torchtitan_fsdp_a100"]


@pytest.mark.parametrize("row", F22["rows"], ids=lambda r: f"{r['model']}-lbs{r['local_batch']}-{r['recompute']}")
def test_f22_fits_verdicts(row):
    c = get_cluster(F22["cluster"])
    n = F22["num_gpus"]
    job = TrainingJob(global_batch_size=n * row["local_batch"], seq_length=row["seq_length"], framework="torchtitan")
    par = ParallelConfig(dp=n, zero_stage=3, micro_batch_size=row["local_batch"], recompute=row["recompute"])
    assert estimate_memory(get_model(row["model"]), c, job, par).fits is row["fits"]


# ---------------------------------------------------------------- torchtitan published rows (reserved memory)

#: CUDA context outside PyTorch's reserved count (0.55 GiB measured gap on H100-80GB, field_cases.md conventions,
#: rounded up to 1 GiB here; cluster_specs' reserve is now calibrated on these rows, see memory_reserve_bytes'
#: source); torchtitan's logged number is max reserved, which holds the fragmentation but not the context.
CUDA_CONTEXT_BYTES = 1 * GiB
_ZOO = {32: "llama3.1-8b", 80: "llama3.1-70b", 126: "llama3.1-405b"}

#: Rows where plan3d's model is within the issue's 10% aim.
WITHIN_10 = {
    "torchtitan-2412-llama31-8b-8gpu-fsdp", "torchtitan-2412-llama31-8b-8gpu-fsdp-compile",
    "torchtitan-2412-llama31-8b-8gpu-fsdp-compile-float8", "torchtitan-2412-llama31-8b-128gpu-fsdp",
    "torchtitan-2412-llama31-8b-128gpu-fsdp-compile", "torchtitan-2412-llama31-8b-128gpu-fsdp-compile-float8",
    "torchtitan-2412-llama31-8b-8gpu-cp1-32k", "torchtitan-2412-llama31-8b-8gpu-cp2-64k",
    "torchtitan-2412-llama31-8b-8gpu-cp4-128k", "torchtitan-2412-llama31-8b-8gpu-cp8-256k",
    "torchtitan-2412-llama31-70b-256gpu-2d-asynctp", "torchtitan-2412-llama31-405b-512gpu-cp1-32k",
    "torchtitan-2412-llama31-405b-512gpu-interleaved-1f1b",
    "torchtitan-2412-llama31-405b-512gpu-cp2-64k", "torchtitan-2412-llama31-405b-512gpu-cp4-128k",
    # Trainy's June 2025 runs compiled the loss (torchtitan compiles it with training.compile since 2025-02,
    # d1f62be73): 4 bytes per logit instead of eager's 12 (memory.COMPILED_CROSS_ENTROPY_BYTES_PER_ELEMENT,
    # measured). +38% / +37% while costed eager, +8.2% / +6.5% now
    "torchtitan-trainy-llama31-8b-h200-32gpu", "torchtitan-trainy-llama31-8b-h200-64gpu",
}


#: Rows outside 10%, with the error recorded when the model was last calibrated and the reason we believe it misses.
KNOWN_GAPS = {
    # TP8 + SP, mbs 16 x 8192 tokens, full AC, float8: the eager working set of the recomputed 70B layer (RMSNorm
    # fp32 upcasts, unfused SwiGLU) is larger than the per-layer terms we model (async TP, same model: -6.8%)
    "torchtitan-2412-llama31-70b-256gpu-2d": -0.124,
    # FSDP + PP: micro-batch count not stated (we take torchtitan's default, pp x stages per rank); stage-level
    # gathered parameters, fp32 gradient accumulation, per-micro-batch receive buffers and retained stage outputs
    # are modelled (cost_models/memory_buffers.py; -14.6% before them, the interleaved row -11.3% -> -5.8%)
    "torchtitan-2412-llama31-405b-512gpu-1f1b": -0.122,
    # CP 8 ring attention: the measured peak grows with cp (75.3 -> 84.9 GiB at equal tokens per rank); the
    # per-step KV exchange buffers and the load-balancer copies are not modelled
    "torchtitan-2412-llama31-405b-512gpu-cp8-256k": -0.147,
}


def torchtitan_row_prediction(row):
    """(predicted reserved GiB, estimate) for one published torchtitan row."""
    a, p = row["architecture"], row["parallel"]
    m = get_model(_ZOO[a["num_layers"]])
    pp = p["pp"]
    # torchtitan (Dec 2024): 2 stages per rank for interleaved schedules; micro-batches default to the number of
    # stages (pp x stages per rank), so micro-batch = local batch / (pp x vpp).
    vpp = 2 if "interleaved" in str(p["other"].get("pp_schedule", "")).lower() else 1
    mbs = p["micro_batch_size"] or p["other"]["local_batch_size"] // (pp * vpp)
    split = uneven_split(m.num_layers, pp) if m.num_layers % pp else None
    # the loss as it ran: eager in torchtitan 2024-12 (the dev row's setup, with its source), else compiled
    job = TrainingJob(global_batch_size=p["global_batch_size"], seq_length=a["seq_length"], framework="torchtitan",
                      precision="fp8" if "float8" in p["precision"] else "bf16",
                      cross_entropy_loss_fusion=_dev_setup(row["id"]).get("cross_entropy_loss_fusion"))
    par = ParallelConfig(tp=p["tp"], pp=pp, dp=p["dp"], cp=p["cp"], micro_batch_size=mbs, zero_stage=3,
                         recompute=p["recompute"].split()[0], sequence_parallel=p["tp"] > 1, vpp=vpp,
                         first_stage_layers=split[0] if split else None,
                         last_stage_layers=split[1] if split else None)
    cap = 95 * GiB if "H100" in row["hardware"]["gpu"] else get_cluster("dgx-h200").gpu.memory_bytes
    c = _cluster_with("dgx-h100" if "H100" in row["hardware"]["gpu"] else "dgx-h200", cap)
    est = estimate_memory(m, c, job, par)
    reserved = max(s.total - CUDA_CONTEXT_BYTES for s in est.stages)
    return reserved / GiB, est


@pytest.mark.parametrize("row", TT_ROWS, ids=lambda r: r["id"])
def test_torchtitan_rows(row):
    predicted, est = torchtitan_row_prediction(row)
    measured = row["measured"]["memory_per_gpu_gib"]
    err = (predicted - measured) / measured
    assert est.fits  # every row ran
    msg = f"{row['id']}: predicted {predicted:.1f} GiB vs measured {measured} GiB ({err:+.1%})"
    if row["id"] in WITHIN_10:
        assert abs(err) <= 0.10, msg
    else:
        # Known gap, reported in the closing note: held to its recorded error (+-3 points) so that any change of
        # the model shows up here.
        assert err == pytest.approx(KNOWN_GAPS[row["id"]], abs=0.03), msg


# ---------------------------------------------------------------- DeepSpeed ZeRO estimators (pure data parallel)

#: validators.md Sec. 2 table, DeepSpeed 0.19.8 estimate_zero{2,3}_model_states_mem_needs_all_cold, GiB per GPU.
DS_TABLE = [
    ("llama2-7b", 8, 26.67, 14.61), ("llama2-7b", 32, 16.08, 4.02),
    ("llama2-70b", 8, 273.02, 145.52), ("llama2-70b", 32, 164.61, 37.11),
]


def _ds_states(model: str, n: int, zero: int) -> float:
    m = get_model(model)
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=n, seq_length=128, framework="deepspeed")
    st = estimate_memory(m, c, job, ParallelConfig(dp=n, zero_stage=zero)).stages[0]
    # ZeRO-3: DeepSpeed's 4 * largest_layer gather buffer is our forward-phase buffer term
    return st.model_states + (st.buffer_terms["forward"]["zero3_gather"] if zero == 3 else 0.0)


def _ds_gather(m, n) -> float:
    from cost_models.memory import stage_params
    sp = stage_params(m, ParallelConfig(dp=n), 0, range(m.num_layers), m.padded_vocab_size(1))
    return 4 * sp.largest_module


@pytest.mark.parametrize("model,n,z2,z3", DS_TABLE)
def test_deepspeed_estimator_numbers_reproduced(model, n, z2, z3):
    assert _ds_states(model, n, 2) / GiB == pytest.approx(z2, abs=0.005)
    assert _ds_states(model, n, 3) / GiB == pytest.approx(z3, abs=0.005)


@pytest.mark.parametrize("model,n", [("llama2-7b", 8), ("llama2-70b", 32), ("llama3.1-8b", 16)])
def test_deepspeed_estimator_live(model, n):
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed (optional `validators` extra)")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    m = get_model(model)
    p = m.num_parameters()
    ll = _ds_gather(m, n) / 4
    _, gpu2 = estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, num_nodes=1, cpu_offload=False)
    _, gpu3, _ = estimate_zero3_model_states_mem_needs(p, ll, num_gpus_per_node=n, num_nodes=1, cpu_offload=False,
                                                       cpu_offload_params=False)
    assert _ds_states(model, n, 2) == pytest.approx(gpu2, abs=2)  # DeepSpeed truncates with int()
    assert _ds_states(model, n, 3) == pytest.approx(gpu3, abs=2)


# ---------------------------------------------------------------- Megatron-LM theoretical estimator

def megatron_theoretical_memory(m: ModelSpec, *, tp, pp, dp, vpp, mbs, seq, num_microbatches):
    """Transcription of NVIDIA/Megatron-LM ``megatron/training/theoretical_memory_usage.py`` at commit 00caa53
    (``compute_weight_and_optimizer_memory`` + ``compute_activation_memory``, the SP + selective path), dense
    models, distributed optimizer; returns (weight_and_optimizer, activation) bytes of the first stage."""
    h, a, g, f = m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size
    q_ratio = m.head_dim * a / h
    gated = 3 / 2 if m.gated_mlp else 1
    norm = 1 if m.normalization == "rmsnorm" else 2
    attn = 2 * h * h * ((1 + g / a) * q_ratio)
    layer = 2 * h * (f * gated + norm) + attn
    v = m.padded_vocab_size(tp)
    emb = h * v
    block = layer * m.num_layers + norm * h
    most_loaded = (block / pp + emb) / tp
    if not m.tie_word_embeddings and pp == 1:
        most_loaded += emb / tp
    w_opt = most_loaded * (6 + 12 / dp)
    act = seq * mbs * h * (18 + 4 * f / h) * m.num_layers
    act += 8 * seq * mbs * pp + seq * mbs * h * pp
    if vpp > 1:
        act *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1:
        act *= min(1, num_microbatches / pp)
    if pp == 1:
        act += seq * mbs * h * 4 * (1 + v / h)
    return w_opt, act / tp


MEGATRON_CASES = [  # regime the estimator covers: bf16, distributed optimizer, SP + selective recompute
    dict(model="gpt3-175b", tp=8, pp=8, dp=16, vpp=1, mbs=1, seq=2048, gbs=1536),
    dict(model="gpt3-175b", tp=8, pp=16, dp=8, vpp=3, mbs=1, seq=2048, gbs=1536),
    dict(model="gpt-18b", tp=8, pp=1, dp=32, vpp=1, mbs=2, seq=2048, gbs=1024),
]


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=lambda c: f"{c['model']}-tp{c['tp']}-pp{c['pp']}-v{c['vpp']}")
def test_megatron_estimator_agreement(case):
    m = get_model(case["model"])
    par = ParallelConfig(tp=case["tp"], pp=case["pp"], dp=case["dp"], vpp=case["vpp"], micro_batch_size=case["mbs"],
                         zero_stage=1, sequence_parallel=True, recompute="selective")
    job = TrainingJob(global_batch_size=case["gbs"], seq_length=case["seq"], dropout=True, flash_attention=False)
    nmb = par.num_microbatches(job.global_batch_size)
    w_ref, a_ref = megatron_theoretical_memory(m, tp=par.tp, pp=par.pp, dp=par.dp, vpp=par.vpp, mbs=par.micro_batch_size,
                                               seq=job.seq_length, num_microbatches=nmb)
    st = estimate_memory(m, get_cluster("dgx-h100"), job, par).stages[0]
    # Model states: agree within 1% once plan3d's deliberate extra is removed: the learned position embeddings
    # (max_pos x h, replicated over TP, on the first stage), which Megatron's count omits. The remaining
    # differences (biases counted by plan3d, the final norm that Megatron spreads over all stages) are < 0.1%.
    pos_params = m.embedding_params() - m.vocab_size * m.hidden_size
    pos_bytes = pos_params * (6 + 12 / (par.dp * par.cp))
    assert st.model_states - pos_bytes == pytest.approx(w_ref, rel=0.01)
    # Activations: agree within 1% once plan3d's deliberate extra is removed: the 8 bytes/token of token and
    # position ids are not split by TP (Megatron divides every term by t).
    tokens = job.seq_length * par.micro_batch_size
    extra_ids = 8 * tokens * st.in_flight_microbatches * (1 - 1 / par.tp)
    acts = st.activations if st.phase != "optimizer" else st.phases["backward"]
    ref = a_ref
    if par.pp == 1:
        # Megatron's p == 1 term: fp32 final-norm input + fp32 logits (4*s*b*h*(1 + V/h)/t); plan3d counts the
        # logits separately with the bf16 copy (6 B/element) and the final-norm input inside the layer terms.
        ref -= tokens * m.hidden_size * 4 * (1 + m.padded_vocab_size(par.tp) / m.hidden_size) / par.tp
    assert acts - extra_ids == pytest.approx(ref, rel=0.01)


# ---------------------------------------------------------------- structure: stages, schedules, phases

def test_first_stage_factor_interleaved_equals_k22():
    # K22 / Megatron: interleaved first stage holds 1 + (p-1)/(p*v) times p micro-batches' worth of its layers
    for p, v in ((4, 2), (8, 3), (16, 5)):
        par = ParallelConfig(pp=p, vpp=v, dp=1)
        assert in_flight_microbatches(par, 0, 10_000) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_in_flight_by_schedule():
    par = ParallelConfig(pp=4)
    assert [in_flight_microbatches(par, i, 16) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(par, 0, 2) == 2  # capped by m
    assert in_flight_microbatches(ParallelConfig(pp=4, schedule="gpipe"), 3, 16) == 16


def test_uneven_split_per_stage_and_peak_is_max():
    m = get_model("llama3.1-405b")
    par = ParallelConfig(tp=8, pp=16, dp=4, zero_stage=1, first_stage_layers=7, last_stage_layers=7,
                         sequence_parallel=True, recompute="selective")
    est = estimate_memory(m, get_cluster("dgx-h100"), TrainingJob(global_batch_size=256, seq_length=8192), par)
    assert [s.num_layers for s in est.stages] == [7] + [8] * 14 + [7]
    assert est.peak_bytes == max(s.total for s in est.stages)
    assert est.stages[-1].logits > 0 and est.stages[0].logits == 0
    # the first stage holds the embedding, the last the output layer (untied): both more than a 7-layer middle
    assert est.stages[0].num_parameters > 7 / 8 * est.stages[1].num_parameters


def test_phases_and_optimizer_temporary():
    m = get_model("llama3.1-8b")
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=64, seq_length=4096, framework="torchtitan")
    st = estimate_memory(m, c, job, ParallelConfig(dp=8, zero_stage=3)).stages[0]
    assert set(st.phases) == {"init", "forward", "backward", "optimizer"}
    assert st.total == pytest.approx(max(st.phases.values()))
    # torch AdamW foreach: one fp32 temporary per local parameter in the step
    assert st.phase_terms["optimizer"]["transient"] == pytest.approx(4 * m.num_parameters() / 8)


def test_hsdp_shards_within_group():
    m = get_model("llama3.1-8b")
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=64, seq_length=4096, framework="torchtitan")
    full = estimate_memory(m, c, job, ParallelConfig(dp=64, zero_stage=3)).stages[0]
    hsdp = estimate_memory(m, c, job, ParallelConfig(dp=64, zero_stage=3, hsdp_shard_size=8)).stages[0]
    assert hsdp.model_states == pytest.approx(16 * m.num_parameters() / 8)
    assert full.model_states == pytest.approx(16 * m.num_parameters() / 64)
    with pytest.raises(ValueError, match="hsdp_shard_size 3 must divide dp x cp = 64"):
        estimate_memory(m, c, job, ParallelConfig(dp=64, zero_stage=3, hsdp_shard_size=3))


def test_deterministic():
    m = get_model("mixtral-8x7b")
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=256, seq_length=4096)
    par = ParallelConfig(tp=2, pp=4, dp=4, ep=4, zero_stage=1, sequence_parallel=True, vpp=2)
    a = estimate_memory(m, c, job, par)
    b = estimate_memory(m, c, job, par)
    assert [s.terms() for s in a.stages] == [s.terms() for s in b.stages]


def test_unknown_framework_is_rejected():
    with pytest.raises(ValueError, match="allowed values are megatron, deepspeed, torchtitan"):
        estimate_memory(get_model("llama2-7b"), get_cluster("dgx-h100"), TrainingJob(), ParallelConfig(),
                        framework="jax")


# ---------------------------------------------------------------- K22 Table 2 per-layer activations (GPT, f = 4h)

def _gpt_layer(tp=1, sp=False, recompute="none", flash=False):
    m = get_model("gpt3-175b")  # MHA, LayerNorm, f = 4h: K22's assumptions
    job = TrainingJob(global_batch_size=8, seq_length=2048, dropout=True, flash_attention=flash)
    par = ParallelConfig(tp=tp, dp=1, micro_batch_size=1, sequence_parallel=sp, recompute=recompute)
    return m, job, activation_bytes_per_layer(m, job, par, 0)


def test_k22_table2_rows_exactly():
    m, job, none = _gpt_layer()
    s, b, h, a = job.seq_length, 1, m.hidden_size, m.num_attention_heads
    assert none == s * b * h * (34 + 5 * a * s / h)                          # no parallelism
    assert _gpt_layer(tp=8)[2] == s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8))  # TP
    assert _gpt_layer(tp=8, sp=True)[2] == s * b * h / 8 * (34 + 5 * a * s / h)    # TP + SP
    assert _gpt_layer(tp=8, recompute="selective")[2] == s * b * h * (10 + 24 / 8)  # TP + selective
    assert _gpt_layer(tp=8, sp=True, recompute="selective")[2] == 34 * s * b * h / 8  # TP + SP + selective


def test_gqa_and_swiglu_widths():
    # Llama-3.1-8B: K and V are g*d_h = 1024 wide, SwiGLU fc1 output 2f; flash: only the fp32 LSE per head
    m = get_model("llama3.1-8b")
    job = TrainingJob(global_batch_size=1, seq_length=4096)
    par = ParallelConfig()
    h, f, kv, a = m.hidden_size, m.ffn_hidden_size, m.num_kv_heads * m.head_dim, m.num_attention_heads
    per_token = 8 * h + 2 * (h + kv + kv) + 2 * h + 4 * a + 2 * 2 * f + 2 * f
    assert activation_bytes_per_layer(m, job, par, 0) == 4096 * per_token


def test_expert_states_use_expert_data_parallel_size():
    # Megatron: expert params sharded by ep x etp, their optimizer states over world / (etp x ep x pp)
    m = get_model("mixtral-8x7b")
    par = ParallelConfig(tp=2, pp=1, dp=32, ep=8, etp=1, zero_stage=1)
    st = estimate_memory(m, get_cluster("dgx-h100"), TrainingJob(global_batch_size=256, seq_length=4096), par).stages[0]
    lp = m.layer_params(0)
    expert_local = m.num_layers * lp.expert / 8
    dense_local = st.num_parameters - expert_local
    assert par.expert_dp == 8
    expected = dense_local * (6 + 12 / 32) + expert_local * (6 + 12 / 8)
    assert st.model_states == pytest.approx(expected)


def test_fp32_logits_on_last_stage_only():
    m = get_model("llama3.1-8b")
    job = TrainingJob(global_batch_size=64, seq_length=8192)
    par = ParallelConfig(tp=4, pp=4, dp=2, sequence_parallel=True, zero_stage=1)
    est = estimate_memory(m, get_cluster("dgx-h100"), job, par)
    v = m.padded_vocab_size(4)
    assert [s.logits for s in est.stages[:-1]] == [0, 0, 0]
    assert est.stages[-1].logits == 8192 * v / 4 * (2 + 4)  # bf16 output + fp32 copy in the fused CE


def test_at_risk_band_and_verdicts():
    from planner.checks import DEFAULT_AT_RISK_MARGIN, DEFAULT_MEMORY_HEADROOM
    from planner.memory_report import status
    assert DEFAULT_AT_RISK_MARGIN > DEFAULT_MEMORY_HEADROOM  # the band is wider than the headroom
    m = get_model("llama2-7b")
    c = get_cluster("dgx-h100")
    cap = c.gpu.memory_bytes
    job = TrainingJob(global_batch_size=2048, seq_length=2048)
    par = ParallelConfig(dp=8, micro_batch_size=2, zero_stage=1)
    alloc = estimate_memory(m, c, job, par).peak_allocated_bytes

    def at(fraction):  # the same layout with a reserve that puts its peak at ``fraction`` of capacity
        return estimate_memory(m, c, job, par, reserve_bytes=fraction * cap - alloc)
    # 93%: fits the 5% headroom but within the 10% margin -> at risk (exit 0, flagged)
    assert status(at(0.93)) == "at risk" and status(at(0.93), at_risk_margin=0.05) == "fits"
    # 98%: under capacity but over the headroom -> infeasible in every command (exit 1)
    assert status(at(0.98)) == "over headroom" and status(at(0.98), memory_headroom=0.01) == "at risk"
    assert status(at(0.85)) == "fits"
    assert status(estimate_memory(m, c, job, ParallelConfig(dp=8, micro_batch_size=4, zero_stage=1))) == "OOM"


def test_bytes_per_param_tables():
    # Megatron docs dist_optimizer.md (formulas.md Sec. 1.3): fp16 param + fp16 grad 20 / 4 + 16/d (DeepSpeed's
    # 16-bit-grad layout), bf16 param + fp32 grad 18 / 6 + 12/d; torchtitan FSDP2 fp32 sharded states 16/N.
    def bpp(fw, z, d):
        return sum(model_state_terms(fw, z, 1.0, d))
    assert bpp("deepspeed", 0, 8) == 20 and bpp("deepspeed", 1, 8) == pytest.approx(4 + 16 / 8)
    assert bpp("deepspeed", 2, 8) == pytest.approx(2 + 18 / 8) and bpp("deepspeed", 3, 8) == pytest.approx(18 / 8)
    assert bpp("megatron", 0, 8) == 18 and bpp("megatron", 1, 8) == pytest.approx(6 + 12 / 8)
    assert sum(model_state_terms("megatron", 0, 1.0, 8, grad_reduce_in_bf16=True)) == 16
    # Megatron fp16 training: 16-bit main gradients, an fp32 copy in the (sharded) optimizer: the fp16 row
    assert sum(model_state_terms("megatron", 0, 1.0, 8, fp16=True)) == 20
    assert sum(model_state_terms("megatron", 1, 1.0, 8, fp16=True)) == pytest.approx(4 + 16 / 8)
    assert sum(model_state_terms("deepspeed", 1, 1.0, 8, fp16=True)) == pytest.approx(4 + 16 / 8)
    assert bpp("torchtitan", 3, 8) == pytest.approx(16 / 8) and bpp("torchtitan", 0, 8) == 16


def test_fp8_keeps_gemm_inputs_in_one_byte():
    # Transformer Engine FP8: the saved inputs of the QKV, output-projection, fc1 and fc2 GEMMs are FP8 (1 byte)
    m = get_model("llama3.1-8b")
    par = ParallelConfig()
    bf16 = activation_bytes_per_layer(m, TrainingJob(global_batch_size=1, seq_length=4096), par, 0)
    fp8 = activation_bytes_per_layer(m, TrainingJob(global_batch_size=1, seq_length=4096, precision="fp8"), par, 0)
    h, f, q = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads * m.head_dim
    assert bf16 - fp8 == 4096 * (2 * h + q + f)


# ---------------------------------------------------------------- initialization peak (issue 10)

def test_full_model_init_is_a_phase_and_a_violation_when_it_does_not_fit():
    # DeepSpeed ZeRO-3 without zero.Init: deepspeed.initialize moves the whole module to the GPU before it is
    # partitioned (DeepSpeedEngine._configure_distributed_model: self.module.to(self.device)). Llama-2-70B in bf16 is
    # 2 x 68.98e9 bytes = 128.5 GiB on every GPU, over an 80 GB H100, although the sharded step needs far less.
    from planner.checks import check_config
    m = get_model("llama2-70b")
    c = get_cluster("dgx-h100")
    par = ParallelConfig(dp=64, zero_stage=3, recompute="full")
    kw = dict(global_batch_size=64, seq_length=4096, framework="deepspeed")
    sharded = estimate_memory(m, c, TrainingJob(**kw), par)
    full = estimate_memory(m, c, TrainingJob(**kw, full_model_init=True), par)
    assert sharded.fits and sharded.peak_stage.phase != "init"
    st = full.stages[0]
    assert st.buffer_terms["init"]["full_model_materialized"] == 2 * m.num_parameters()
    assert st.phase == "init" and st.phases["init"] / GiB == pytest.approx(2 * m.num_parameters() / GiB + st.reserve
                                                                          / GiB, rel=1e-9)
    assert not full.fits
    v = check_config(m, c, TrainingJob(**kw, full_model_init=True), par, 64, memory=full)
    assert v and "at init" in v[-1].message
    # the step phases are the same either way
    assert {k: st.phases[k] for k in ("forward", "backward", "optimizer")} == {
        k: sharded.stages[0].phases[k] for k in ("forward", "backward", "optimizer")}


# ---------------------------------------------------------------- expert parallelism (issue 10)

def test_ep_memory_goes_the_way_it_really_goes():
    # Mixtral-8x7B on 64 H100. Under FSDP (torchtitan zero 3) the expert weights and states are already sharded over
    # the expert data-parallel group world / (ep x etp x pp): more EP saves nothing on the states. What changes is
    # the gathered FSDP unit (a block holds only its E/ep local experts unsharded: torchtitan apply_fsdp shards the
    # experts on the edp mesh) and the all-to-all buffers EP > 1 adds. Under the distributed optimizer (Megatron
    # zero 1) the 16-bit weights and fp32 main gradients are replicated over data parallelism, so EP shards them.
    from cost_models.memory_buffers import moe_dispatch_buffers
    from cost_models.moe_imbalance import rank_load_ratio
    m = get_model("mixtral-8x7b")
    c = get_cluster("dgx-h100")

    def run(fw, z, ep):
        job = TrainingJob(global_batch_size=64, seq_length=4096, framework=fw)
        par = ParallelConfig(dp=64, ep=ep, zero_stage=z, micro_batch_size=1, recompute="full")
        return par, estimate_memory(m, c, job, par).stages[0]
    tt = {ep: run("torchtitan", 3, ep) for ep in (1, 2, 4, 8)}
    assert len({round(st.model_states) for _, st in tt.values()}) == 1  # FSDP already shards the experts
    for ep, (par, st) in tt.items():
        lp = m.layer_params(0)
        unit = lp.tp_sharded + lp.replicated + lp.expert / ep
        assert st.buffer_terms["forward"]["fsdp_param_gather"] == pytest.approx(2 * 2 * unit)
        # one 16-bit copy of the routed token copies (4096 tokens x top-2 x h) beyond the stored receive buffer, as
        # many as the busiest rank receives (dropless imbalance, cost_models/moe_imbalance.py)
        copies = 4096 * 2 * rank_load_ratio(8, ep)
        assert st.buffer_terms["backward"].get("ep_all_to_all", 0.0) == pytest.approx(0 if ep == 1 else 2 * copies * 4096)
    assert moe_dispatch_buffers(8192, 4096, 1) == {"forward": {}, "backward": {}, "optimizer": {}}
    mg = [run("megatron", 1, ep)[1].total for ep in (1, 2, 4, 8)]
    assert mg == sorted(mg, reverse=True) and mg[0] > 2 * mg[-1]


# ---------------------------------------------------------------- DeepSpeed ZeRO-Offload / ZeRO-Infinity (CPU tier)

@pytest.mark.parametrize("model,n", [("llama2-7b", 8), ("llama2-70b", 32), ("llama3.1-8b", 16)])
def test_deepspeed_offload_columns_match_the_estimator_exactly(model, n):
    # DeepSpeed 0.19.8 estimators with cpu_offload=True: ZeRO-2 GPU = 2P; ZeRO-3 GPU = 4 LL + 2P/N; with
    # cpu_offload_params=True, 4 LL (stage_1_and_2.py estimate_zero2_model_states_mem_needs, stage3.py
    # estimate_zero3_model_states_mem_needs; formulas.md Sec. 4.2)
    m = get_model(model)
    p = m.num_parameters()
    ll = _ds_gather(m, n) / 4
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=n, seq_length=128, framework="deepspeed")

    def ours(zero, params=False):
        par = ParallelConfig(dp=n, zero_stage=zero, optimizer_cpu_offload_fraction=1.0, param_cpu_offload=params)
        st = estimate_memory(m, c, job, par).stages[0]
        return st.model_states + (st.buffer_terms["forward"]["zero3_gather"] if zero == 3 else 0.0), st
    z2, st2 = ours(2)
    z3, _ = ours(3)
    z3p, _ = ours(3, params=True)
    assert z2 == 2 * p and z3 == pytest.approx(4 * ll + 2 * p / n, abs=2) and z3p == 4 * ll
    assert st2.phase_terms["optimizer"]["transient"] == 0  # the Adam step runs on the host (DeepSpeedCPUAdam)
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except ImportError:
        return  # the closed forms above are the estimators' (validators extra not installed)
    _, gpu2 = estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, num_nodes=1, cpu_offload=True)
    _, gpu3, _ = estimate_zero3_model_states_mem_needs(p, ll, num_gpus_per_node=n, num_nodes=1, cpu_offload=True,
                                                       cpu_offload_params=False)
    _, gpu3p, _ = estimate_zero3_model_states_mem_needs(p, ll, num_gpus_per_node=n, num_nodes=1, cpu_offload=True,
                                                        cpu_offload_params=True)
    assert (z2, z3p) == (pytest.approx(gpu2, abs=1), pytest.approx(gpu3p, abs=1))
    assert z3 == pytest.approx(gpu3, abs=2)  # DeepSpeed truncates 2P/N with int()


def test_deepspeed_offload_is_emitted_and_accepted_by_deepspeed():
    from planner.emit.deepspeed import deepspeed_config
    m = get_model("llama2-7b")
    job = TrainingJob(global_batch_size=8, seq_length=1024, framework="deepspeed")
    cfg = deepspeed_config(job, ParallelConfig(dp=8, zero_stage=3, optimizer_cpu_offload_fraction=1.0,
                                               param_cpu_offload=True), m)
    z = cfg["zero_optimization"]
    assert z["offload_optimizer"] == {"device": "cpu", "pin_memory": True} and z["offload_param"]["device"] == "cpu"
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed (optional `validators` extra)")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    parsed = DeepSpeedZeroConfig(**z)
    assert parsed.offload_optimizer.device == "cpu" and parsed.offload_param.device == "cpu"


# ---------------------------------------------------------------- optimizer-state precision (issue 10)

def test_optimizer_state_precision_bytes_and_emission():
    # Megatron precision-aware optimizer: fp32 master 4 + bf16 moments 2 + 2 = 8 bytes (12 in fp32); fp16 master
    # weights (--main-params-dtype fp16) 2 + 2 + 2 = 6; Megatron-FSDP bf16 master weights likewise 6.
    # Deliberate difference: Megatron's theoretical_memory_usage.py keeps 6 + 12/d for any optimizer dtype.
    from planner.emit import launch_fields
    from planner.emit.megatron import EmitError, megatron_args
    p = 1e9
    assert model_state_terms("megatron", 0, p, 8, moment_bytes=4)[2] == 8 * p
    assert model_state_terms("megatron", 1, p, 8, moment_bytes=4, master_bytes=2)[2] == 6 * p / 8
    m = get_model("llama3.1-8b")
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    fsdp = ParallelConfig(dp=8, zero_stage=3, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", main_params_dtype="bf16")
    base = estimate_memory(m, get_cluster("dgx-h100"), job, ParallelConfig(dp=8, zero_stage=3)).stages[0]
    st = estimate_memory(m, get_cluster("dgx-h100"), job, fsdp).stages[0]
    assert st.optimizer_states == pytest.approx(base.optimizer_states / 2)  # 12 -> 6 bytes per parameter
    args = launch_fields(m, job, fsdp, 8)["megatron"]
    assert args[args.index("--megatron-fsdp-main-params-dtype") + 1] == "bf16"
    assert args[args.index("--exp-avg-dtype") + 1] == "bf16"
    fp16 = ParallelConfig(dp=8, zero_stage=1, main_params_dtype="fp16")
    args = launch_fields(m, job, fp16, 8)["megatron"]
    assert args[args.index("--main-params-dtype") + 1] == "fp16" and "--use-precision-aware-optimizer" in args
    with pytest.raises(EmitError, match="bf16 master weights only under Megatron-FSDP"):
        megatron_args(m, job, ParallelConfig(dp=8, zero_stage=1, main_params_dtype="bf16"))


def test_torchtitan_output_layer_unit_binds_at_the_start_of_backward():
    # torchtitan apply_fsdp: fully_shard([norm, lm_head]) is its own FSDP unit, the first to run backward. With
    # Llama 3's 128,256-token vocabulary it holds 525M parameters, 2.4x a 218M decoder block: while its weight
    # gradient is computed it keeps its 16-bit weights and gradients, and the last block is prefetched
    c = get_cluster("dgx-h100")
    job = TrainingJob(global_batch_size=16, seq_length=8192, framework="torchtitan")
    par = ParallelConfig(dp=8, zero_stage=3, micro_batch_size=2)
    m = get_model("llama3.1-8b")
    head = m.vocab_size * m.hidden_size + m.hidden_size
    block = m.layer_params(0).tp_sharded + m.layer_params(0).replicated
    b = estimate_memory(m, c, job, par).stages[0].buffer_terms
    assert b["backward"]["fsdp_param_gather"] == pytest.approx(2 * (head + block))
    assert b["backward"]["fsdp_unsharded_grads"] == pytest.approx(2 * head)
    assert b["forward"]["fsdp_param_gather"] == pytest.approx(2 * head)  # 2 x head > 2 x 2 blocks
    # Llama-2-7B's 32,000-token head (131M) is smaller than its blocks (202M): the blocks bind, as before
    m2 = get_model("llama2-7b")
    blk = m2.layer_params(0).tp_sharded + m2.layer_params(0).replicated
    b2 = estimate_memory(m2, c, job, par).stages[0].buffer_terms
    assert "fsdp_unsharded_grads" not in b2["backward"]
    assert b2["backward"]["fsdp_reduce_scatter"] == pytest.approx((2 + 4) * blk)


def test_deepspeed_zero3_keeps_the_last_half_reuse_distance_gathered():
    # DeepSpeed ZeRO-3 does not release a module's parameters when the trace reuses them within
    # stage3_max_reuse_distance (1e9) parameters (partitioned_param_coordinator.py __params_to_release): the last
    # 5e8 parameters of forward stay gathered into backward. F02's LLaMA-7B: 1e9 bytes (fp16); a 124M GPT-2: all.
    assert _f02(3).stages[0].buffer_terms["backward"]["zero3_reuse_retained"] == pytest.approx(2 * 5e8)
    m = load_model_file(DATA / "hf_configs" / "gpt2.json")
    job = TrainingJob(global_batch_size=8, seq_length=1024, framework="deepspeed")
    st = estimate_memory(m, get_cluster("dgx-h100"), job, ParallelConfig(dp=8, zero_stage=3)).stages[0]
    assert st.buffer_terms["forward"]["zero3_reuse_retained"] == pytest.approx(2 * st.num_parameters)
