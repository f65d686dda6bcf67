"""--launcher k8s: the Kubeflow PyTorchJob manifest validates against the resource's published schema (the CRD's
OpenAPI v3 schema from kubeflow/training-operator v1.9.0, shipped in tests/data/k8s with its source and commit),
and every field it sets is one the schema declares (what the API server would otherwise prune silently)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import planner
from planner.emit import EmitUnsupported, emit_files
from planner.emit.megatron import pair_args

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads((Path(__file__).parent / "data" / "k8s" / "pytorchjob_v1_openapi.json").read_text())


def _declared(obj, schema, path="$"):
    """Every key of ``obj`` is declared by ``schema`` (properties, or additionalProperties). A bare
    ``{type: object}`` (``metadata``: ObjectMeta, validated by the API server itself) is not walked."""
    if isinstance(obj, dict) and schema.get("type") == "object" and ("properties" in schema
                                                                     or "additionalProperties" in schema):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for k, v in obj.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            assert sub is not None or extra is True or schema.get("x-kubernetes-preserve-unknown-fields"), \
                f"{path}.{k} is not in the schema"
            if isinstance(sub, dict):
                _declared(v, sub, f"{path}.{k}")
    elif isinstance(obj, list) and "items" in schema:
        for i, v in enumerate(obj):
            _declared(v, schema["items"], f"{path}[{i}]")


def _docs(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _job(doc, framework, rank=1):
    files = emit_files(doc, framework, rank, launcher="k8s")
    docs = _docs(files["pytorchjob.yaml"])
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    jsonschema.Draft7Validator(SCHEMA).validate(job)
    _declared(job, SCHEMA)
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    for m in maps:  # core/v1 ConfigMap: data is a map of string to string
        assert m["apiVersion"] == "v1" and all(isinstance(v, str) for v in m["data"].values())
    return files, job, maps


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan", "colossalai"])
def test_manifest_validates(framework):
    tt = framework == "torchtitan"  # torchtitan runs FSDP2 (ZeRO-3) and sequence parallelism with its TP
    doc = planner.evaluate("llama2-7b", "dgx-h100", gpus=32, global_batch_size=128, tp=2, pp=2,
                           micro_batch_size=1, zero_stage=3 if tt else 1, sequence_parallel=tt,
                           framework="torchtitan" if tt else "megatron")
    files, job, maps = _job(doc, framework)
    launch = doc.plans[0].launch
    spec = job["spec"]
    assert spec["nprocPerNode"] == str(launch.gpus_per_node) == "8"
    reps = spec["pytorchReplicaSpecs"]
    assert reps["Master"]["replicas"] + reps["Worker"]["replicas"] == launch.nodes == 4
    c = reps["Worker"]["template"]["spec"]["containers"][0]
    assert c["name"] == "pytorch" and c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["command"][:5] == ["torchrun", "--nnodes", "4", "--nproc-per-node", "8"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["CONFIG_DIR"] == "/etc/plan3d"
    if framework == "megatron":  # the same env and arguments as launch_torchrun.sh
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert 'export CUDA_DEVICE_MAX_CONNECTIONS=1' in emit_files(doc, "megatron")["launch_torchrun.sh"]
        assert c["command"][5] == "pretrain_gpt.py"
        assert " ".join(pair_args(c["command"][6:6 + len(launch.megatron)])) == " ".join(pair_args(launch.megatron))
        assert not maps  # the arguments are in the command; nothing to mount
    if framework == "deepspeed":
        assert "/etc/plan3d/ds_config.json" in c["command"]
        assert json.loads(maps[0]["data"]["ds_config.json"]) == launch.deepspeed
    if framework == "torchtitan":
        assert c["command"][5:9] == ["-m", "torchtitan.train", "--job.config_file", "/etc/plan3d/torchtitan.toml"]
        assert maps[0]["data"]["torchtitan.toml"] == launch.torchtitan_toml
    if framework == "colossalai":
        assert c["command"][5] == "train.py" and "colossalai_plugin.py" in maps[0]["data"]
    assert "launch_torchrun.sh" not in files and "pytorchjob.yaml" in files


def test_single_node_has_master_only():
    doc = planner.evaluate("llama3.1-8b", "dgx-h100", gpus=8, global_batch_size=64, tp=1, zero_stage=1)
    _, job, _ = _job(doc, "megatron")
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_schema_rejects_a_broken_manifest():
    doc = planner.evaluate("llama3.1-8b", "dgx-h100", gpus=16, global_batch_size=64, tp=2)
    _, job, _ = _job(doc, "megatron")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(job)


def test_cli_launcher_k8s(run_cli, tmp_path):
    r = run_cli("plan", "--gpus", "16", "--global-batch-size", "64", "--emit", "megatron", "--launcher", "k8s")
    assert r.exit_code == 0, r.stderr
    assert any(d["kind"] == "PyTorchJob" for d in _docs(r.stdout))
    out = tmp_path / "k8s"
    r = run_cli("plan", "--gpus", "16", "--global-batch-size", "64", "--emit", "torchtitan", "--launcher", "k8s",
                "--output", str(out))
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["pytorchjob.yaml", "torchtitan.toml", "torchtitan_overrides.txt"]
    r = run_cli("plan", "--gpus", "8", "--launcher", "k8s")
    assert r.exit_code == 2 and "--launcher k8s applies to --emit" in r.stderr


def test_deepspeed_without_megatron_deepspeed_refused():
    doc = planner.evaluate("llama3.1-8b", "dgx-h100", gpus=16, global_batch_size=64, tp=1, framework="deepspeed")
    assert "rope_scaling" in doc.plans[0].launch.unsupported["megatron_deepspeed"]  # Llama 3.1's RoPE scaling
    with pytest.raises(EmitUnsupported, match="--launcher k8s"):
        emit_files(doc, "deepspeed", launcher="k8s")


def test_command_and_env_values_are_quoted_strings():
    # kubectl's YAML 1.2 parser (go-yaml) reads a bare 1e-05 (Megatron's --norm-epsilon value) as a float, which
    # PyYAML (YAML 1.1) writes unquoted: every item of the container's command and every env value is quoted
    doc = planner.plan("llama3.1-70b", "dgx-h100", gpus=64, global_batch_size=512, seq_length=4096, top_k=1)
    text = emit_files(doc, "megatron", 1, launcher="k8s")["pytorchjob.yaml"]
    assert "- '1e-05'" in text
    for node in yaml.compose_all(text):
        if node is None or not any(k.value == "kind" and v.value == "PyTorchJob" for k, v in node.value):
            continue
        stack, seen = [node], 0
        while stack:
            n = stack.pop()
            if isinstance(n, yaml.MappingNode):
                for k, v in n.value:
                    if k.value in ("command", "value") and isinstance(v, (yaml.SequenceNode, yaml.ScalarNode)):
                        items = v.value if isinstance(v, yaml.SequenceNode) else [v]
                        assert all(i.style in ("'", '"') for i in items), [i.value for i in items if not i.style]
                        seen += len(items)
                    stack.append(v)
            elif isinstance(n, yaml.SequenceNode):
                stack.extend(n.value)
        assert seen > 20
