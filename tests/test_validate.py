"""``plan3d validate``: the step-time model against the packaged published runs (the project's regression check)."""
from __future__ import annotations

import json

import pytest

from planner.published_rows import (build_inputs, fp8_recipe, implied_flops_per_token, load_rows, row_convention,
                                    row_flops_per_token, row_pipeline_layout)
from planner.validation import DEFAULT_MAX_GROUP_MAPE, DEFAULT_MAX_MAPE, MIN_GROUP_ROWS, run_validation


@pytest.fixture(scope="module")
def report():
    return run_validation()


def test_packaged_rows_are_the_shared_dev_rows_with_sources():
    rows = load_rows()
    assert len(rows) == 104
    assert all(r["source"]["url"] and r["source"]["group"] for r in rows)


#: What the calibrated model reaches on the dev rows today (plan3d validate): a ratchet against regressions.
#: Lower these when the model improves; the project targets are the test below.
#: After merging valrows (NCCL-like pipelined multi-node collectives, bf16 DeepSpeed gradient all-reduce, the
#: torchtitan H100s at their 2.4 TB/s HBM) and refitting the FIT_RANGES constants: 6.57 -> 7.70 (merge, old
#: constants) -> 6.28% (refit). MoE recipes 5.5 -> 6.0 since the per-local-expert host constant became the host time
#: of the operations TE 2.8 issues per expert (cost_models/moe_overhead.py); NeMo 24.07 7.0 -> 8.3 and H100 weak
#: scaling 6.8 -> 8.1 with the faster (measured) NCCL collectives: less exposed communication.
#: 5.54 -> 5.32% overall with the measured cuDNN 9.19 attention series on Blackwell (attention.yaml): the long-sequence
#: CP group 7.3 -> 3.9%, while the Bridge group rises 5.0 -> 5.9% (its Llama 3 8B FP8 rows on B200 / GB200, already
#: fast, come out ~+10%) and the MoE recipes 5.7 -> 5.8%.
#: 5.32 -> 5.42% with the EP all-to-alls in 16 bits for FP8 runs too (Megatron-LM dispatches bf16 and quantizes
#: after: moe/fused_a2a.py) and the refit it brings (EP_OVERLAP_EXPOSED 0.42 -> 1/3, HOST_GEMM_S 15.75 -> 14.33 us,
#: HOST_QUANTIZE_S cs 300 -> 277 us): MoE recipes 5.8 -> 4.8%, Bridge 5.9 -> 7.1% (its cross-node DeepSeek-V3 H100
#: row -12.8 -> -17.1%, GB200 Qwen3 -13.5 -> -16.4%), while LOGO improves 7.46 -> 7.25% (test below).
#: 5.42 -> 5.25% with that DeepSeek-V3 H100 row's EP overlap (setup.ep_overlap, from the 25.09 run script; its
#: source had been a 2026 preset): -17.1 -> -1.6%, Bridge 7.1 -> 5.8%. 5.25 -> 5.31% with each kernel throttled
#: by its own activity under a power cap (gemm.clock_fraction): torchtitan 4.9 -> 5.0% in-sample, 7.2 -> 5.4% LOGO.
#: 5.31 -> 5.26% with the cross-entropy costed by implementation (elementwise.CE_BYTES_PER_LOGIT: Megatron-LM's
#: unfused loss, NeMo's fused one, Transformer Engine's, torchtitan eager / compiled), Megatron's asynchronous
#: backward TP collectives (collectives.tp_backward_shares) and the MoE recipes' overlapped gradient reduction
#: (setup.overlap_grad_reduce), refitted from the middle of every range: NeMo 24.07 5.9 -> 5.6%, H100 weak scaling
#: 7.9 -> 7.3%; the MoE recipes 4.8 -> 5.1% and Bridge 5.8 -> 6.0% (Transformer Engine's cross entropy is the cheapest,
#: and their Llama 3 8B FP8 rows on B200 / GB200 were already fast). 5.26 -> 5.20% with Nemotron's squared ReLU
#: unfused (elementwise.UNFUSED_ACTIVATION_PASSES): NeMo 24.07 5.6 -> 5.1%. 5.19 -> 5.17% with the NeMo 24.07 GPT-3
#: rows' dropout 0.1 (their launcher YAMLs) and the 16-bit master-weight remainders of NeMo 1.x's Apex
#: DistributedFusedAdam on every NeMo 24.07 row (setup.main_params_dtype; it keeps the 20B row inside 80 GB with its
#: dropout masks): NeMo 24.07 5.09 -> 4.98%. 5.17 -> 5.13% with Megatron's fp16 runs reducing 16-bit gradients (the
#: SC21 runs: --fp16 without --accumulate-allreduce-grads-in-fp32, examples/sc21/CONFIG.sh at de7dc40f) and the refit
#: it brings (UNFUSED_SCORE_PASSES 5.33 -> 5.67): SC21 3.46 -> 3.08%. 5.13 -> 5.08% with the SC21 pipeline-free runs'
#: torch DDP overlapping the all-reduce with the last micro-batch's backward (setup.overlap_grad_reduce; DDP=torch in
#: run_table_1.sh, no_sync in schedules.py) and the refit (UNFUSED_SCORE_PASSES 5.67 -> 6): SC21 3.08 -> 2.67%.
#: 5.08 -> 5.05% with H100 cuDNN attention read in the generation of each row's software date (attention.yaml: the FA3
#: paper's 2024 series and NVIDIA's cuDNN 9.19, interpolated in time; setup.software_date on the 34 H100 Megatron /
#: NeMo rows), no constant moved: Bridge 5.97 -> 5.81%, the Llama example 7.23 -> 6.94%. 5.05 -> 5.03% with the H100
#: attention backward made causal (attention.yaml: the FA3 paper's non-causal Fig. 6 times the causal / non-causal
#: ratio measured on an H200, 2026-12-04) and the refit it brings (POWER_CLOCK_EXPONENT 2.17 -> 2.33,
#: TP_OVERLAP_EXPOSED.torchtitan 0.64 -> 0.58): NeMo 24.07 4.98 -> 4.52%, the Llama example 6.94 -> 7.41%. 5.03%
#: unchanged with HOST_GEMM_S measured (16.5 us per eager GEMM call on an H200 machine's host) instead of fitted (20 us)
#: and the refit it brings (HOST_QUANTIZE_S mx 65 -> 74 us, MOE_TOKEN_COPY_S 20.8 -> 16.7 ns): MoE recipes 5.03 ->
#: 5.41%, Bridge 5.81 -> 5.64%, for 13.40 -> 12.23% and 9.21 -> 8.81% held out (the LOGO test below). 5.03 -> 5.06%
#: with a Megatron-Core MoE layer's TP traffic read from its token dispatcher (collectives.mlp_block_tp_collectives:
#: at expert TP 1 without shared experts the MoE block has none; a correction from the framework's source, not a
#: fit): the one dev row it touches, the MoE recipes' Qwen3-235B on B200 at TP 2 / ETP 1, goes +17.6 -> +20.2%
#: (MoE recipes 5.41 -> 5.92%); the ratchet moves up for it. 5.06 -> 4.98% with BLOOM's rows split as Megatron-DeepSpeed
#: splits them (layout.deepspeed_pipeline_layout: DeepSpeed's partition_balanced puts the heavier stages first, 70
#: layers over 12 as 10 x 6 + 2 x 5, not Megatron's first/last 5 + 10 x 6 + 5): BLOOM 5.14 -> 2.70%. 4.98 -> 5.05%
#: with the MoE rows' stated flex dispatcher timed from its measured throughput inside an NVLink domain
#: (cluster_specs/data/efficiency/ep_dispatch.yaml, NVIDIA's Hybrid-EP tables: HybridEP on GB200 moves a token once
#: per destination GPU at 420-570 GB/s, where the NCCL all-to-all estimate moved every routed copy at 740) and the
#: refit it brings (MOE_TOKEN_COPY_S 16.7 -> 12.5 ns, HOST_QUANTIZE_S cs 277 -> 300 us): the two GB200 Qwen3-30B-A3B
#: rows at EP 8 and EP 16 now differ as measured (MoE recipes 5.92 -> 6.50%, Bridge 5.64 -> 5.91% in-sample; held
#: out, the test below, MoE recipes 12.79 -> 10.38%). 5.05 -> 5.12% with three corrections from the frameworks' source,
#: none a fit: selective recompute's ``mlp`` re-runs dense layers only (megatron-core TransformerLayer: ``if not
#: self.is_moe_layer``; ``moe`` re-runs a MoE block), so the DeepSeek-V3 rows with ``mla_up_proj, mlp`` no longer
#: recompute their 58 MoE blocks (recipe B200 +0.1 -> +12.8%, Bridge H100 -2.2 -> +1.0% at the old constants); model
#: FLOPs counted as Megatron's loggers count them (the MTP module in, the router GEMM out); the MTP decoder layer
#: costed as a layer (its MoE routing and host time). The refit moves EP_OVERLAP_EXPOSED 1/3 -> 0.5 and
#: HOST_QUANTIZE_S cs back to 277 us: MoE recipes 6.50 -> 6.83%, Bridge 5.91 -> 6.37%. 5.12 -> 5.28% with each
#: fused-attention call timed at its own occupancy (attention.yaml ``occupancy``: the share of the saturated rate
#: against thread blocks per SM, measured on an H200; a measurement, not a fit, and no constant moved): the H100
#: Megatron rows at TP 4-8 with 4k-8k tokens (6-16 heads per GPU) get 1-3 points slower, H100 weak scaling 7.32 ->
#: 8.04% (its 32B and 70B rows, already too slow, -21.5 -> -23.9% and -8.9 -> -11.8%; its 1.7B and 7.1B rows, too
#: fast, +9.2 -> +5.9% and +9.5 -> +7.2%), the Llama example 7.40 -> 8.68%; a refit from the middle of the ranges
#: gives 5.27% (KAPPA 2.25 -> 1.96, POWER_CLOCK_EXPONENT 2.33 -> 2.0, two constants at their range's top), so the
#: constants stay. 5.28 -> 5.34% with context parallelism's ring calls as Transformer Engine and PyTorch run them (one
#: causal call over the rank's s / cp tokens, the others unmasked over half its keys or half its queries, at the
#: measured unmasked / causal ratio and their own occupancy; not a fit, and a refit moves no constant): the torchtitan
#: 2024-12 CP rows, already too fast, +7.3 -> +9.0% (CP 4), +10.2 -> +12.3% (CP 8, 8B) and +13.9 -> +15.9% (CP 8, 405B);
#: torchtitan 5.10 -> 5.34%. 5.34 -> 5.26% with the constants refitted on all rows at the fit's finer resolution (1/96
#: of each range, planner/calibration.py; the shipped constants are again that fit): KAPPA 2.25 -> 1.99,
#: POWER_CLOCK_EXPONENT 2.33 -> 2.19, UNFUSED_SCORE_PASSES 6 -> 6.42, TP_OVERLAP_EXPOSED torchtitan 0.58 -> 0.7 (its
#: range's top), EP_OVERLAP_EXPOSED 0.5 -> 0.55: H100 weak scaling 8.04 -> 6.96%, the Llama example 8.66 -> 7.61%,
#: MoE recipes 6.67 -> 6.35%, SC21 2.67 -> 3.48%, Bridge 6.08 -> 6.16%. 5.26 -> 5.27% (5.268) with the MoE routing
#: kernels measured (a measurement, not a fit; the ratchets move up for it): the router kernel and the token
#: permutation's counted bytes by dispatcher at the HBM share its kernels reach on an H200 (moe_overhead
#: ROUTER_KERNEL_S, PERMUTE_HBM_FRACTION, benchmarks/moe_routing_device.py) replace 4 forward HBM passes at the
#: datasheet rate, MOE_TOKEN_COPY_S stays fitted as the remainder (11.5 -> 14.1 ns) and the constants are refitted
#: (KAPPA 1.99 -> 2.10, POWER_CLOCK_EXPONENT 2.19 -> 2.25, EP_OVERLAP_EXPOSED 0.55 -> 0.58): Bridge 6.16 -> 5.88%,
#: MoE recipes 6.35 -> 6.61%, H100 weak scaling 6.96 -> 7.43%, SC21 3.48 -> 3.11%. 5.268 -> 5.277% with two
#: corrections of the data (not fits; the ratchets move up for them) and the MoE constants refitted: HybridEP's SM
#: count when a run sets none is DeepEP's own default inside one NVLink domain, 32, not torchtitan's launcher default 16
#: (ep_dispatch.yaml; the Qwen3-30B-A3B GB200 recipe row), and the two Qwen3-30B-A3B recipe rows run the plain fp32
#: Adam moments (their YAMLs set no precision-aware optimizer); EP_OVERLAP_EXPOSED 0.58 -> 0.57, MOE_TOKEN_COPY_S
#: 14.1 -> 16.7 ns, HOST_QUANTIZE_S cs 280 -> 277 us: Bridge 5.88 -> 6.02%, MoE recipes 6.61 -> 6.45%. 5.28 -> 5.23%
#: with DeepEP across NVLink domains charged no faster than its kernels were measured to go there (ep_dispatch.yaml
#: ``internode``: DeepSeek's figures in DeepEP's README, 43 GB/s counted at 2 nodes, the node's own share included;
#: collectives.flex_internode_s; a measurement, not a fit): the MoE recipes' Qwen3-235B-A22B on B200 at EP 16 over 2
#: nodes +13.9 -> -6.3%; then 5.23 -> 5.06% with all constants refitted (KAPPA 2.10 -> 1.96, POWER_CLOCK_EXPONENT
#: 2.25 -> 2.12, EP_OVERLAP_EXPOSED 0.57 -> 0.47, UNFUSED_SCORE_PASSES 6.29 -> 6.46, TP_OVERLAP_EXPOSED torchtitan
#: 0.67 -> 0.69): MoE recipes 6.45 -> 3.98%, H100 weak scaling 7.43 -> 6.80%, Bridge 6.02 -> 5.62%, the Llama example
#: 7.95 -> 7.43%, NeMo 24.07 4.79 -> 4.83%, SC21 3.11 -> 3.61%. 5.06 -> 5.01% with two measured / counted FP8 terms
#: and all constants refitted: Hopper's FP8 forward GEMMs at the fast-accumulation rate, 1 / 0.955 of the MAMF (split
#: accumulator) rate the backward keeps (gemm.FP8_FAST_ACCUM_SPEEDUP, measured on an H200), and per-tensor current
#: scaling's amax pass (elementwise.FP8_AMAX_PASS_BYTES: Bridge FP8-CS rows, torchtitan's float8); KAPPA 1.96 -> 2.03,
#: POWER_CLOCK_EXPONENT 2.12 -> 2.37, UNFUSED_SCORE_PASSES 6.46 -> 6.37, TP_OVERLAP_EXPOSED torchtitan 0.69 -> 0.65,
#: HOST_QUANTIZE_S cs 280 -> 271 us: Bridge 5.62 -> 4.88%, MoE recipes 3.98 -> 3.85%, while H100 weak scaling 6.80 ->
#: 7.12% and NeMo 24.07 4.83 -> 4.94% move up (their ratchets with them; held out too, 8.33 -> 8.63% and 4.97 ->
#: 5.30%: the LOGO ratchet below). 5.01 -> 4.98% with the Megatron-LM Llama example rows stating what their script
#: and the NeMo recipes they follow set, 16-bit gradient reduction and the FP8 parameter gather (a correction of the
#: data, not a fit: their 405B -6.7 -> -4.1%), and the constants refitted (KAPPA 2.03 -> 1.99, POWER_CLOCK_EXPONENT
#: 2.37 -> 2.29, UNFUSED_SCORE_PASSES 6.37 -> 6.42, TP_OVERLAP_EXPOSED torchtitan 0.65 -> 0.63): the Llama example
#: 7.17 -> 6.07%, H100 weak scaling 7.12 -> 6.96%, while NeMo 24.07 4.94 -> 5.01% and MoE recipes 3.85 -> 3.92% move up
#: (their ratchets with them).
ACHIEVED_MAX_MAPE = 4.99
ACHIEVED_GROUP_MAPE = {"megatron_moe_recipes": 3.93, "nemo_bridge_perf_summary": 4.85, "nemo_2407_perf_summary": 5.02,
                       "megatron_h100_weak_scaling": 6.97}


def test_mape_does_not_regress(report):
    assert len(report.evaluated) >= 80
    assert report.mape <= ACHIEVED_MAX_MAPE, report.group_mape()
    for group, (n, mape) in report.group_mape().items():
        if n >= MIN_GROUP_ROWS:
            assert mape <= ACHIEVED_GROUP_MAPE.get(group, DEFAULT_MAX_GROUP_MAPE), (group, mape)


def test_mape_within_the_project_thresholds(report):
    # issue "Step-time and MFU model that matches published runs": <= 7% overall, <= 10% per group with >= 3 rows
    assert report.mape <= DEFAULT_MAX_MAPE, report.group_mape()
    for group, (n, mape) in report.group_mape().items():
        if n >= MIN_GROUP_ROWS:
            assert mape <= DEFAULT_MAX_GROUP_MAPE, (group, mape)


def test_skipped_rows_say_why(report):
    skipped = [r for r in report.rows if r.skipped]
    assert all(r.skipped for r in skipped)
    # GB300 has no cluster spec; the Korthikanti README rows give no layout
    assert {r.id for r in skipped} >= {"korthikanti22-readme-22b-dp1", "bridge-2511-gb300-llama3-8b-fp8cs-8"}


@pytest.mark.parametrize("row_id", ["nemo-2407-h100-llama3-8b-fp8-8", "bridge-2511-h100-llama3-8b-fp8cs-8",
                                    "mcore-llama-example-llama3-8b-fp8-8"])
def test_row_convention_matches_the_flops_per_token_the_source_implies(row_id):
    row = next(r for r in load_rows() if r["id"] == row_id)
    model, cluster, job, par, fw, notes = build_inputs(row)
    conv = row_convention(row)
    assert row_flops_per_token(model, job, par, conv) == pytest.approx(implied_flops_per_token(row), rel=0.01)


def test_assumptions_are_named(report):
    r = next(r for r in report.rows if r.id == "mcore-h100-weak-gpt-1.7b-48")
    assert any("micro_batch_size 1" in a for a in r.assumptions)
    assert any("precision bf16" in a for a in r.assumptions)


def test_cli_json_is_deterministic_and_thresholds_set_the_exit_code(run_cli):
    a = run_cli("validate", "--format", "json", "--max-mape", "100", "--max-group-mape", "1000")
    b = run_cli("validate", "--format", "json", "--max-mape", "100", "--max-group-mape", "1000")
    assert a.exit_code == 0 and a.stdout == b.stdout
    doc = json.loads(a.stdout)
    assert doc["evaluated"] + doc["skipped"] == 104 and "groups" in doc
    strict = run_cli("validate", "--format", "json", "--max-mape", "0.01")
    assert strict.exit_code == 1 and "MAPE" in strict.stderr and len(strict.stderr.strip().splitlines()) == 1


def test_cli_table_and_bad_dataset(run_cli, tmp_path):
    t = run_cli("validate", "--max-mape", "100", "--max-group-mape", "1000")
    assert t.exit_code == 0 and "MAPE per source group" in t.stdout and "overall" in t.stdout
    bad = run_cli("validate", "--dataset", str(tmp_path / "missing.yaml"))
    assert bad.exit_code == 2 and "--dataset" in bad.stderr and "Traceback" not in bad.stderr
    junk = tmp_path / "junk.yaml"
    junk.write_text("a: [1, 2\n")
    r = run_cli("validate", "--dataset", str(junk))
    assert r.exit_code == 2 and "malformed YAML" in r.stderr


def test_custom_dataset(run_cli, tmp_path):
    rows = [r for r in load_rows() if r["id"].startswith("nemo-2407-h100-llama2")]
    p = tmp_path / "mine.yaml"
    import yaml
    p.write_text(yaml.safe_dump(rows))
    r = run_cli("validate", "--dataset", str(p), "--format", "json", "--max-mape", "100")
    assert r.exit_code == 0 and json.loads(r.stdout)["evaluated"] == 3


def test_recipe_settings_read_from_the_rows():
    rows = {r["id"]: r for r in load_rows()}
    # Megatron MoE recipe deepseek_v3/b200 YAML: pipeline_model_parallel_layout "Et*4|(tttt|)*14tmL" = 16 virtual
    # stages over pp 8, i.e. 2 per rank (the row's virtual_pipeline is empty)
    row = rows["mcore-moe-deepseek-v3-b200-mxfp8-256"]
    model, cluster, job, par, fw, notes = build_inputs(row)
    assert (par.pp, par.vpp, par.pipeline_layout) == (8, 2, "Et*4|(tttt|)*14tmL")
    assert row_pipeline_layout(row)[0] == "Et*4|(tttt|)*14tmL"
    # Megatron-Bridge DeepSeek-V3 H100 preset pp_layout "Et|(tt|)*30mL"
    _, _, _, par, _, _ = build_inputs(rows["bridge-2509-h100-deepseekv3-(dropless)-fp8-1024"])
    assert (par.vpp, par.pipeline_layout) == (4, "Et|(tt|)*30mL")
    # torchtitan's default split points for Llama 3.1 405B (126 layers) over pp 8 x 2 stages: 7, 14 x 8, 7
    _, _, _, par, _, _ = build_inputs(rows["torchtitan-2412-llama31-405b-512gpu-interleaved-1f1b"])
    assert par.pipeline_layout == "E" + "t" * 7 + "|" + "|".join(["t" * 8] * 14) + "|" + "t" * 7 + "L"
    # micro-batches left out: torchtitan's default pp x stages per rank (local batch 32: 16 of 2 interleaved,
    # 8 of 4 with 1F1B; the 4D table's local batch 8 over pp 8: 8 of 1)
    assert par.micro_batch_size == 2
    assert build_inputs(rows["torchtitan-2412-llama31-405b-512gpu-1f1b"])[3].micro_batch_size == 4
    assert build_inputs(rows["torchtitan-2412-llama31-405b-512gpu-cp1-32k"])[3].micro_batch_size == 1
    # FP8 scaling recipe from the precision column; the 25.09 DeepSeek-V3 H100 row's note names blockwise scaling as
    # the alternative, so its "FP8" is per-tensor
    assert fp8_recipe(rows["bridge-2511-h100-qwen3-30b-a3b-fp8cs-16"]) == "cs"
    assert fp8_recipe(rows["bridge-2511-b200-qwen3-30b-a3b-fp8mx-8"]) == "mx"
    assert fp8_recipe(rows["mcore-moe-qwen3-235b-a22b-b200-mxfp8-128"]) == "mx"
    assert fp8_recipe(rows["bridge-2509-h100-deepseekv3-(dropless)-fp8-1024"]) == "cs"
    # DeepSeek-style blockwise scaling (Megatron-LM MoE recipes on H100: fp8_recipe: blockwise, the README's
    # "FP8 blockwise" feature) takes the block-scaled class: TE bulk-allocates its per-expert outputs like MXFP8's
    blockwise = {"parallel": {"precision": "fp8", "other": {"features": "FP8 blockwise; router/preprocess CG"}}}
    assert fp8_recipe(blockwise) == "mx"
    assert fp8_recipe({"parallel": {"precision": "FP8-CS"}}) == "cs"


def test_qwen3_30b_h100_rows_both_within_ten_percent(report):
    # BF16 recipe (234 TFLOP/s, no per-expert host cost) and Bridge FP8-CS (121 TFLOP/s, per-tensor FP8 host cost
    # per expert): the pair the previous model could not reconcile
    err = {r.id: r.error for r in report.evaluated}
    assert abs(err["mcore-moe-qwen3-30b-a3b-h100-bf16-32"]) < 0.10
    assert abs(err["bridge-2511-h100-qwen3-30b-a3b-fp8cs-16"]) < 0.10


def test_no_published_configuration_is_predicted_infeasible(report):
    # they all ran (issue: "no published configuration is predicted infeasible")
    assert [(r.id, r.violations) for r in report.infeasible] == []


@pytest.mark.parametrize("path,value,needle", [
    ("parallel.tp", 0, "field 'parallel.tp' = 0 is outside [1, 1638400]"),
    ("parallel.tp", "eight", "parallel.tp must be a number, got 'eight'"),
    ("architecture.num_attention_heads", 0, "field 'architecture.num_attention_heads' = 0 is outside [1, 16000]"),
    ("architecture", [1, 2], "architecture must be a mapping"),
    ("measured.tflops_per_gpu", "fast", "measured.tflops_per_gpu must be a number, got 'fast'"),
    ("measured.tflops_per_gpu", -5.0, "field 'measured.tflops_per_gpu' = -5 is outside [0.001, 1e+06]"),
    ("parallel.tp", True, "parallel.tp must be a number, got 'True'"),
])
def test_bad_dataset_rows_are_one_line_errors(run_cli, tmp_path, path, value, needle):
    import copy

    import yaml
    row = copy.deepcopy(next(r for r in load_rows() if r["id"] == "sc21-megatron-gpt-1.7b-a100-32"))
    d, keys = row, path.split(".")
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    f = tmp_path / "rows.yaml"
    f.write_text(yaml.safe_dump([row]))
    r = run_cli("validate", "--dataset", str(f))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "rows.yaml: row 'sc21-megatron-gpt-1.7b-a100-32'" in r.stderr and needle in r.stderr


def test_dataset_with_no_usable_row_is_an_input_error(run_cli, tmp_path):
    f = tmp_path / "rows.yaml"
    f.write_text("[]\n")
    r = run_cli("validate", "--dataset", str(f), "--format", "json")
    assert r.exit_code == 2 and "no row could be evaluated" in r.stderr and r.stdout == ""
    from planner.validation import ValidationReport
    assert ValidationReport([]).to_dict()["mape_percent"] is None  # never NaN in the JSON


def test_duplicate_row_ids_are_refused(run_cli, tmp_path):
    import yaml
    row = next(r for r in load_rows() if r["id"] == "sc21-megatron-gpt-1.7b-a100-32")
    f = tmp_path / "rows.yaml"
    f.write_text(yaml.safe_dump([row, row]))
    r = run_cli("validate", "--dataset", str(f))
    assert r.exit_code == 2 and "appears twice" in r.stderr


# ------------------------------------------------------------------ leave-one-source-group-out cross-validation

#: The LOGO ratchet (issue 9: generalisation is the headline metric): each source group predicted by the step-time
#: constants refitted without it (planner/calibration.py). Lower these when the model improves; the project targets
#: are <= 7% overall and <= 10% per group of >= 3 rows (not met yet, see the closing note of issue 9).
#: 7.88 -> 9.68% after the valrows merge and refit: torchtitan's own constants (elementwise passes, compute share,
#: async-TP exposure, the power-clock exponent) start at the middle of their ranges when torchtitan is held out.
#: 9.7 -> 9.9 with torchtitan's per-op selective checkpointing charged (in-sample 6.28 -> 6.10): held out, torchtitan
#: takes the middle of its own constants' ranges, which the recomputed elementwise work makes costlier.
#: 9.9 -> 7.82 with torchtitan's elementwise passes counted from its source, the power-clock law, the attention
#: kernel tables and FSDP2's copy-out (e218d58); unchanged by merging main's pools, schedules and input guards.
#: 7.82 -> 7.46 with the measured cuDNN 9.19 attention series for B200 / GB200 (in place of an H100 curve scaled to a
#: secondary report's asymptote); NeMo-Bridge 12.0 -> 12.9 (its held-out MoE host constants dominate it).
#: 7.46 -> 7.25 with the EP all-to-alls in 16 bits (Megatron-LM does not dispatch FP8): NeMo-Bridge 12.9 -> 11.8,
#: MoE recipes 10.0 -> 8.7. 7.25 -> 7.21 with the Bridge DeepSeek-V3 H100 row's EP overlap: NeMo-Bridge 11.8 -> 11.1,
#: MoE recipes 8.7 -> 9.6 (held out, EP_OVERLAP_EXPOSED is now set by that row, and their Qwen3-235B B200 row moves).
#: 7.21 -> 6.63 with attention below the power cap unthrottled (gemm.clock_fraction's activity) and the refit
#: (POWER_CLOCK_EXPONENT 3 -> 2, off its range's edge): torchtitan 7.24 -> 5.37.
#: LOGO folds start from the middle of every range (planner/calibration.py), not from the shipped constants the
#: held-out group helped fit: the previous model scores 6.68% that way (MoE recipes 12.6%, Bridge 9.5%) where the
#: shipped-value start had reported 6.63% (9.6%, 11.1%). Now 6.66%, MoE recipes 13.5%: held out, their host-time
#: constants come from the Bridge 25.11 rows (Transformer Engine 2.8), while the recipes ran Transformer Engine 2.14.
#: 6.59% with Nemotron's unfused squared ReLU. 6.59 -> 6.62% with dropout costed (the SC21 / BLOOM rows ran Megatron's
#: default 0.1: attention.DROPOUT_SCORE_PASSES counted, UNFUSED_SCORE_PASSES refitted without it, 8 -> 5.33, and
#: elementwise.DROPOUT_MASK_BYTES): SC21 held out 5.08 -> 5.45% (its score passes now come from BLOOM's three rows).
#: 6.62 -> 6.61% with the NeMo 24.07 GPT-3 rows' dropout; 6.61 -> 6.54% with the SC21 runs' fp16 gradient
#: all-reduce: SC21 held out 5.45 -> 4.90%, BLOOM 5.76 -> 5.61%; 6.54 -> 6.46% with their torch DDP overlap: SC21
#: held out 4.90 -> 4.10%. 6.46 -> 6.42% with the H100 cuDNN attention generation by software date: Bridge held out
#: 9.44 -> 9.27%, the Llama example 8.68 -> 8.40%. 6.42 -> 6.43% (6.4314) with the H100 attention backward made
#: causal from a measured ratio (a correction of the tables' physics, not a fit; the ratchet moves by 0.01 for it):
#: NeMo 24.07 held out 4.98 -> 4.52%, Bridge 9.27 -> 9.21%, the Llama example 8.40 -> 8.85%, SC21 4.10 -> 4.41%,
#: torchtitan 5.44 -> 5.48%. 6.43 -> 6.31% with HOST_GEMM_S measured instead of fitted (the fold without the MoE
#: recipes no longer reads a host time per GEMM call from the Bridge rows alone): MoE recipes 13.40 -> 12.23%,
#: Bridge 9.21 -> 8.81%. 6.31 -> 6.34% with the Megatron-Core MoE layer's TP traffic read from its token dispatcher
#: (none at expert TP 1 without shared experts; the ratchet above): MoE recipes held out 12.23 -> 12.79%. 6.34 ->
#: 6.26% with BLOOM split as Megatron-DeepSpeed splits it: BLOOM held out 5.57 -> 3.04%. 6.26 -> 6.14% with the
#: stated flex dispatchers timed from their measured in-domain throughput (ep_dispatch.yaml): MoE recipes held out
#: 12.79 -> 10.38%, Bridge 8.81 -> 8.90%. 6.14 -> 6.40% with the recompute-module, model-FLOP and MTP corrections
#: above (not fits; the ratchets move up for them): MoE recipes held out 10.38 -> 11.62%, Bridge 8.90 -> 10.38%
#: (held out, each group's EP-overlap rows set EP_OVERLAP_EXPOSED for the other: the B200 DeepEP rows now want 0.5).
#: 6.40 -> 6.59% with fused attention at each call's measured occupancy (the ratchet above; a measurement, not a
#: fit): Bridge held out 10.38 -> 9.93%, the Llama example 8.85 -> 10.08%, H100 weak scaling 8.53 -> 9.22%. 6.59 ->
#: 6.67% with context parallelism's ring calls (the ratchet above): torchtitan held out 5.61 -> 5.86%, Bridge 9.93 ->
#: 9.88%. 6.67 -> 6.54% with the fit resolving 1/96 of each constant's range (13 grid points, then bisections,
#: planner/calibration.py; 7 points and one bisection before, 1/24) and its row dependencies found without the shipped
#: values: H100 weak scaling held out 9.22 -> 8.48%, the Llama example 10.07 -> 9.57%, Bridge 9.88 -> 9.43%, MoE
#: recipes 11.66 -> 11.52%, SC21 4.41 -> 4.55%, BLOOM 3.04 -> 3.26%. 6.54 -> 6.49% with the MoE routing kernels
#: measured (the in-sample ratchet above; the MoE-recipe ratchet moves up for it): Bridge held out 9.43 -> 8.80%, the
#: Llama example 9.57 -> 9.05%, MoE recipes 11.52 -> 12.40% (held out, MOE_TOKEN_COPY_S is fitted to 0 again and the
#: flex dispatchers' measured permutation costs less than the 4 passes charged before), H100 weak scaling 8.48 -> 8.63%.
#: 6.49 -> 6.50% with HybridEP's default SM count corrected (32 inside one NVLink domain) and the Qwen3-30B-A3B recipe
#: rows' optimizer corrected (see ACHIEVED_MAX_MAPE): MoE recipes 12.40 -> 12.98% (their GB200 Qwen3-30B-A3B row's
#: dispatch is faster at 32 SMs, and it was already too fast held out), H100 weak scaling 8.63 -> 8.48%.
#: 6.50 -> 6.35% with DeepEP's measured internode throughput (see ACHIEVED_MAX_MAPE): MoE recipes held out 12.98 ->
#: 9.07% (their Qwen3-235B-A22B B200 row +24.4 -> +5.4%), while two groups move up a little (the ratchets with them):
#: Bridge 8.76 -> 8.99% and the Llama example 9.05 -> 9.40% (held out, the folds' KAPPA and POWER_CLOCK_EXPONENT
#: move with the MoE rows' new fit); H100 weak scaling 8.48 -> 8.33%. 6.35 -> 6.21% with the FP8 forward GEMMs at the
#: fast-accumulation rate and current scaling's amax pass (see ACHIEVED_MAX_MAPE): Bridge 8.99 -> 8.05%, MoE recipes
#: 9.07 -> 8.39%, the Llama example 9.40 -> 8.44%, while H100 weak scaling 8.33 -> 8.63% and NeMo 24.07 4.97 -> 5.30%
#: move up. 6.21 -> 6.16% with the Llama example rows' 16-bit gradient reduction and FP8 parameter gather (see
#: ACHIEVED_MAX_MAPE): the Llama example 8.44 -> 7.56%, H100 weak scaling 8.63 -> 8.48%.
ACHIEVED_LOGO_MAPE = 6.17
ACHIEVED_LOGO_GROUP_MAPE = {"megatron_moe_recipes": 8.40, "nemo_bridge_perf_summary": 8.06,
                            "megatron_llama_example": 7.57}


@pytest.fixture(scope="module")
def cross_validation():
    from planner.calibration import cross_validate
    return cross_validate(load_rows())


@pytest.mark.slow
def test_cross_validated_mape_does_not_regress(cross_validation):
    cv = cross_validation
    assert cv.logo_mape <= ACHIEVED_LOGO_MAPE, cv.group_table()
    for group, (n, _, logo) in cv.group_table().items():
        if n >= MIN_GROUP_ROWS:
            assert logo <= ACHIEVED_LOGO_GROUP_MAPE.get(group, DEFAULT_MAX_GROUP_MAPE), (group, logo)
    # the constants come back to their shipped values
    assert cv.in_sample == pytest.approx([r.error for r in run_validation().evaluated])


@pytest.mark.slow
def test_shipped_residuals_are_the_current_cross_validation(cross_validation):
    # planner/data/step_time_residuals.json (the product's intervals) must be regenerated when the model changes:
    # benchmarks/fit_step_time.py --write-residuals
    import math

    from planner.uncertainty import _residuals_path
    shipped = {r["id"]: r["residual"] for r in json.loads(_residuals_path().read_text())["runs"]}
    now = {i: math.log(1 + e) for i, e in zip(cross_validation.ids, cross_validation.logo)}
    assert shipped.keys() == now.keys()
    for k in now:
        assert shipped[k] == pytest.approx(now[k], abs=2e-3), k


def test_cli_cross_validate_json(run_cli, tmp_path):
    # two small source groups: each is predicted by the constants refitted on the other
    import yaml
    rows = [r for r in load_rows() if r["id"].startswith(("nemo-2407-h100-llama2", "sc21-megatron-gpt-1.7b",
                                                          "sc21-megatron-gpt-3.6b"))]
    p = tmp_path / "two_groups.yaml"
    p.write_text(yaml.safe_dump(rows))
    r = run_cli("validate", "--dataset", str(p), "--cross-validate", "--format", "json", "--max-mape", "100",
                "--max-group-mape", "100")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    cv = doc["cross_validated_mape_percent"]
    assert set(cv["groups"]) == set(doc["groups"]) == {"nemo_2407_perf_summary", "megatron_sc21_table1"}
    assert cv["overall"] > 0 and all(g["cross_validated_mape_percent"] >= 0 for g in doc["groups"].values())
    assert all("cross_validated_error" in row for row in doc["rows"] if row["error"] is not None)
    strict = run_cli("validate", "--dataset", str(p), "--cross-validate", "--max-mape", "100",
                     "--max-group-mape", "100", "--format", "json")
    assert strict.stdout == r.stdout  # deterministic
    t = run_cli("validate", "--dataset", str(p), "--cross-validate", "--max-mape", "100", "--max-group-mape", "100")
    assert t.exit_code == 0 and "LOGO MAPE" in t.stdout
