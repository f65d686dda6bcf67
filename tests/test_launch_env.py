"""``launch.env``: the plan JSON carries the environment its launch needs, the scripts export the same values, and
Megatron-LM's argument validation accepts exactly ``launch.megatron`` with ``launch.env["megatron"]``."""
from __future__ import annotations

import json
import warnings

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo import get_model
from planner.document import build_document, to_json
from planner.emit import launch_fields
from planner.emit.env import launch_env, uses_nvls
from planner.search import run_search
from test_emit_support import megatron_validate_args, parse_argv
from test_emit_validators import HAS_MCORE, check_megatron

JOB = TrainingJob(global_batch_size=1024, seq_length=4096)
#: jobs whose top plans are checked (TP, CP, Megatron-FSDP, long sequence, A100 / H100 / B200); the slow variant
#: adds MoE jobs (mixtral-8x7b, DeepSeek-V3)
JOBS = [("llama3.1-8b", "dgx-h100", 8, 1024, 4096), ("llama3.1-70b", "dgx-h100", 64, 1024, 4096),
        ("llama3.1-8b", "dgx-h100", 64, 64, 32768), ("gpt3-175b", "dgx-b200", 256, 1536, 2048)]
SLOW_JOBS = JOBS + [("llama3.1-70b", "dgx-a100-80g", 128, 512, 4096), ("mixtral-8x7b", "dgx-h100", 64, 1024, 4096),
                    ("deepseek-v3", "dgx-h100", 1024, 4096, 4096)]


def _documents(jobs) -> list[tuple]:
    """(model, job, plans, the plan JSON as a launch script reads it) of the top 3 plans of every job."""
    out = []
    for name, cluster, gpus, gbs, seq in jobs:
        m, c = get_model(name), get_cluster(cluster)
        job = TrainingJob(global_batch_size=gbs, seq_length=seq)
        res = run_search(m, c, job, gpus, top_k=3)
        out.append((m, job, res.plans, json.loads(to_json(build_document(m, c, job, gpus, res.plans)))))
    return out


def _validate_json(documents) -> None:
    """Megatron-LM's validate_args (reproduced: tests/test_emit_support.py) on exactly each plan's
    ``launch.megatron`` with ``launch.env["megatron"]``, on Hopper and Blackwell; without the env, exactly the TP/CP
    plans outside Megatron-FSDP are rejected (the issue: 12 of 21 argument lists)."""
    rejected_without = needs = 0
    for *_, doc in documents:
        for plan in doc["plans"]:
            launch, q = plan["launch"], plan["parallel"]
            a = parse_argv(launch["megatron"])
            megatron_validate_args(a, launch["world_size"], launch["env"]["megatron"])  # Hopper: arch 9
            megatron_validate_args(a, launch["world_size"], launch["env"]["megatron"], device_arch=10)
            needs += (q["tp"] > 1 or q["cp"] > 1) and q["zero_stage"] < 2
            try:
                megatron_validate_args(a, launch["world_size"], {})
            except AssertionError as e:
                assert "CUDA_DEVICE_MAX_CONNECTIONS" in str(e)
                rejected_without += 1
    assert rejected_without == needs > 0


def _megatron_core(documents) -> None:
    for m, job, plans, doc in documents:
        for ev, plan in zip(plans, doc["plans"]):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_megatron(m, job, ev.parallel, plan["launch"]["megatron"], plan["launch"]["env"]["megatron"])


def test_megatron_validation_accepts_the_json_with_its_env():
    docs = _documents(JOBS)
    _validate_json(docs)
    if HAS_MCORE:  # megatron-core's TransformerConfig / DDP config from the same arguments
        _megatron_core(docs)


@pytest.mark.slow
def test_megatron_validation_accepts_the_json_with_its_env_moe_jobs():
    docs = _documents(SLOW_JOBS)
    _validate_json(docs)
    if HAS_MCORE:
        _megatron_core(docs)


def test_env_rules():
    h100, a100 = get_cluster("dgx-h100"), get_cluster("dgx-a100-80g")
    tp8 = ParallelConfig(tp=8, dp=8, zero_stage=1, sequence_parallel=True)
    # TP: Megatron validate_args; TP 8 inside an NVSwitch node times its all-reduces with NVLS
    assert launch_env("megatron", tp8, h100) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "1"}
    assert launch_env("megatron", tp8, a100) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # no NVLink SHARP on A100
    # Megatron-FSDP forbids 1: the CUDA default is set explicitly
    fsdp = ParallelConfig(tp=2, dp=32, zero_stage=3, sequence_parallel=True)
    assert launch_env("megatron", fsdp)["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    # combined 1F1B: a larger value for the all-to-all beside the paired compute
    comb = ParallelConfig(tp=2, pp=4, dp=8, ep=8, vpp=2, sequence_parallel=True, schedule="combined-1f1b")
    assert launch_env("megatron", comb)["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    # no TP/CP: nothing required; ZeRO-0 DP of 8 inside a node all-reduces over NVLS
    dp8 = ParallelConfig(dp=8)
    assert launch_env("megatron", dp8, h100) == {"NCCL_NVLS_ENABLE": "1"} and uses_nvls(dp8, h100)
    assert not uses_nvls(ParallelConfig(tp=2, dp=4, zero_stage=1), h100)  # 2-rank all-reduce: ring
    assert launch_env("torchtitan", ParallelConfig(dp=8, zero_stage=3))["PYTORCH_ALLOC_CONF"] == \
        "expandable_segments:True"


def test_scripts_export_exactly_the_document_env(run_cli, tmp_path):
    for fw, zero in (("megatron", "1"), ("torchtitan", "3")):
        out = tmp_path / fw
        args = ["evaluate", "-m", "llama3.1-8b", "--gpus", "16", "--tp", "4", "--pp", "2", "--sequence-parallel",
                "--zero-stage", zero, "--global-batch-size", "64", "--framework", fw]
        doc = run_cli(*args, "--format", "json").json()
        env = doc["plans"][0]["launch"]["env"][fw]
        assert env and run_cli(*args, "--emit", fw, "--output", str(out)).exit_code == 0
        for script in ("launch_torchrun.sh", "launch_slurm.sbatch"):
            exports = [ln for ln in (out / script).read_text().splitlines() if ln.startswith("export ")]
            assert exports == [f"export {k}={v}" for k, v in env.items()]


def test_env_is_per_runnable_framework():
    m = get_model("llama2-70b")
    lf = launch_fields(m, JOB, ParallelConfig(tp=8, pp=2, dp=4, vpp=5, zero_stage=1, sequence_parallel=True), 8,
                       get_cluster("dgx-h100"))
    assert "deepspeed" in lf["unsupported"] and set(lf["env"]) == {"megatron", "colossalai"}  # DeepSpeed: vpp


def test_schema_documents_env(run_cli):
    schema = json.loads(run_cli("schema").stdout)
    launch = schema["$defs"]["LaunchInfo"]["properties"]
    assert "env" in launch and "environment variables" in launch["env"]["description"]
