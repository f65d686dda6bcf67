"""``plan3d schema``: the JSON Schema of the plan document, and real plan documents validate against it."""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest


@pytest.fixture(scope="module")
def schema():
    from planner.document import json_schema
    s = json_schema()
    jsonschema.Draft202012Validator.check_schema(s)  # the schema itself is a valid JSON Schema
    return s


def test_schema_command_prints_the_document_schema(run_cli, schema):
    r = run_cli("schema")
    assert r.exit_code == 0 and r.stderr == ""
    assert json.loads(r.stdout) == schema
    r2 = run_cli("schema")
    assert r2.stdout == r.stdout  # deterministic


@pytest.mark.parametrize("argv", [
    ["plan", "--top-k", "2"],                                                     # default: llama3.1-8b, 1 node
    ["plan", "-m", "mixtral-8x7b", "-c", "dgx-h200", "--gpus", "16", "--top-k", "2"],  # MoE
    ["plan", "-m", "llama3.1-70b", "-c", "dgx-h100", "--gpus", "64", "--top-k", "2", "--framework", "deepspeed"],
])
def test_real_plan_documents_validate(run_cli, schema, argv):
    r = run_cli(*argv, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    launch = doc["plans"][0]["launch"]
    # the document carries what a launch script needs
    assert launch["nodes"] * launch["gpus_per_node"] == launch["world_size"] == doc["input"]["cluster"]["num_gpus"]
    assert launch["megatron"] and "--tensor-model-parallel-size" in launch["megatron"]


def test_schema_rejects_broken_documents(run_cli, schema):
    doc = run_cli("plan", "--top-k", "1", "--format", "json").json()
    bad = copy.deepcopy(doc)
    bad["plans"][0]["launch"]["nodes"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = copy.deepcopy(doc)
    bad["plans"][0]["parallel"]["typo_degree"] = 2  # extra keys are forbidden (strict document)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = copy.deepcopy(doc)
    del bad["plans"][0]["launch"]["megatron"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("kind, argv", [
    ("pools", ("plan", "--cluster", "dgx-h100:2,dgx-a100-80g:2", "--global-batch-size", "256", "--top-k", "2")),
    ("fallback", ("fallback", "--nodes", "4", "--global-batch-size", "64", "--max-lost-nodes", "1")),
])
def test_other_documents_validate_against_their_schema(run_cli, kind, argv):
    # a launch script validating what it reads: every document plan3d writes has its schema (--document)
    s = run_cli("schema", "--document", kind).json()
    jsonschema.Draft202012Validator.check_schema(s)
    r = run_cli(*argv, "--format", "json")
    assert r.exit_code == 0, r.stderr
    jsonschema.validate(r.json(), s, cls=jsonschema.Draft202012Validator)
    assert run_cli("schema", "--document", "nope").exit_code == 2
