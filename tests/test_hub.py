"""Hub model ids (model_zoo.hub): config.json from a pre-populated Hugging Face cache; no test touches the network
(every online call is replaced by a stub that raises the Hub client's own exception)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import model_zoo as mz
from model_zoo import ModelSpecError
from model_zoo.hub import fetch_config, is_hub_id

pytest.importorskip("huggingface_hub")
import huggingface_hub  # noqa: E402
from huggingface_hub import errors as hub_errors  # noqa: E402

HF = Path(__file__).parent / "data" / "hf_configs"
REV = "0e9e39f249a16976918f6564b8830bc894c89659"  # any 40-hex commit: the cache layout names snapshots by it


def _cache(root: Path, repo: str, config: Path, rev: str = REV) -> Path:
    """huggingface_hub's cache layout: models--org--name/{refs/main, snapshots/<rev>/config.json}."""
    d = root / ("models--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text(rev)
    snap = d / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(config.read_text())
    return snap / "config.json"


def _exc(cls, msg="stub"):
    """An instance of a huggingface_hub error class without an HTTP response (its __init__ wants one)."""
    e = cls.__new__(cls)
    Exception.__init__(e, msg)
    return e


@pytest.fixture(autouse=True)
def resolvable_hub(monkeypatch):
    """The Hub's host name resolves (no DNS query leaves the test): the stubs below decide what the request does."""
    import model_zoo.hub as hub_mod
    monkeypatch.setattr(hub_mod.socket, "getaddrinfo", lambda *a, **kw: [(2, 1, 6, "", ("192.0.2.1", 443))])
    for v in hub_mod._PROXY_VARS:
        monkeypatch.delenv(v, raising=False)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    _cache(cache, "meta-llama/Llama-3.1-8B", HF / "llama3.1-8b.json")
    _cache(cache, "Qwen/Qwen3-8B", HF / "qwen3-8b.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


@pytest.fixture
def no_network(monkeypatch):
    """Any call that is not cache-only fails the test: cached configs must need no request."""
    real = huggingface_hub.hf_hub_download

    def guarded(*a, **kw):
        if not kw.get("local_files_only"):
            raise AssertionError("network access attempted")
        return real(*a, **kw)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", guarded)


def _online_raises(monkeypatch, exc):
    real = huggingface_hub.hf_hub_download

    def stub(*a, **kw):
        if kw.get("local_files_only"):
            return real(*a, **kw)
        raise exc

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", stub)


@pytest.mark.parametrize("ref,hub", [("meta-llama/Llama-3.1-8B", True), ("Qwen/Qwen3-8B@main", True),
                                     ("org/name@0e9e39f", True), ("llama3.1-8b", False), ("models/x.yaml", False),
                                     ("./org/name", False), ("/abs/path", False), ("a/b/c", False),
                                     ("org/config.json", False), ("org--x/name", False), ("org/na..me", False)])
def test_is_hub_id(ref, hub):
    assert is_hub_id(ref) is hub


def test_hub_id_from_cache_equals_file(hub_cache, no_network):
    m = mz.load_model("meta-llama/Llama-3.1-8B")
    ref = mz.load_model(str(HF / "llama3.1-8b.json"))
    assert m.num_parameters() == ref.num_parameters() == 8_030_261_248
    assert m.name == "meta-llama/Llama-3.1-8B" and m.source == "https://huggingface.co/meta-llama/Llama-3.1-8B"


def test_hf_home_layout_and_offline(tmp_path, monkeypatch, no_network):
    _cache(tmp_path / "home" / "hub", "Qwen/Qwen3-8B", HF / "qwen3-8b.json")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg, where = fetch_config("Qwen/Qwen3-8B")
    assert cfg["model_type"] == "qwen3" and where.endswith(f"snapshots/{REV}/config.json")


def test_api_plan_with_hub_id(hub_cache, no_network):
    import planner
    a = planner.plan("meta-llama/Llama-3.1-8B", "dgx-h100", gpus=8, global_batch_size=64, seq_length=4096, top_k=1)
    assert a.input.model.name == "meta-llama/Llama-3.1-8B" and a.plans[0].feasible


def test_cli_plan_with_hub_id(hub_cache, no_network, run_cli):
    r = run_cli("plan", "--model", "Qwen/Qwen3-8B", "--gpus", "8", "--global-batch-size", "64", "--top-k", "1",
                "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["input"]["model"]["name"] == "Qwen/Qwen3-8B"


def test_builtin_name_and_local_path_win(hub_cache, tmp_path, monkeypatch, no_network):
    assert mz.load_model("llama3.1-8b").name == "llama3.1-8b"  # rule 1
    local = tmp_path / "work" / "meta-llama" / "Llama-3.1-8B"  # rule 2: a folder of the id's name
    local.mkdir(parents=True)
    (local / "config.json").write_text((HF / "qwen3-8b.json").read_text())
    monkeypatch.chdir(tmp_path / "work")
    assert mz.load_model("meta-llama/Llama-3.1-8B").family == "qwen3"


def test_offline_not_cached(hub_cache, monkeypatch, no_network, run_cli):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = run_cli("plan", "--model", "mistralai/Mistral-7B-v0.1")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "not in the Hub cache" in r.stderr and "HF_HUB_OFFLINE" in r.stderr and "hf download" in r.stderr


@pytest.mark.parametrize("cls,says", [
    ("GatedRepoError", "gated model: accept its licence at https://huggingface.co/org/model and log in"),
    ("RepositoryNotFoundError", "no such model on the Hub"),
    ("RevisionNotFoundError", "revision 'main' not found"),
    ("RemoteEntryNotFoundError", "has no config.json"),
    ("LocalEntryNotFoundError", "cannot reach the Hub"),  # what the client raises when the request fails
])
def test_online_errors_one_line(hub_cache, monkeypatch, run_cli, cls, says):
    if not hasattr(hub_errors, cls):
        pytest.skip(f"huggingface_hub {huggingface_hub.__version__} has no {cls}")
    _online_raises(monkeypatch, _exc(getattr(hub_errors, cls)))
    r = run_cli("plan", "--model", "org/model")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert says in r.stderr


def test_connection_error_one_line(hub_cache, monkeypatch):
    import socket
    err = ConnectionError("no route")
    err.__cause__ = socket.gaierror(-3, "Temporary failure in name resolution")
    _online_raises(monkeypatch, err)
    with pytest.raises(ModelSpecError, match="cannot reach the Hub .*gaierror"):
        mz.load_model("org/model")


def test_unreadable_cached_config(tmp_path, monkeypatch, no_network):
    cache = tmp_path / "hub"
    p = _cache(cache, "org/broken", HF / "qwen3-8b.json")
    p.write_text("{not json")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(ModelSpecError, match="unreadable"):
        fetch_config("org/broken")


def test_unresolvable_hub_fails_at_once_without_a_request(hub_cache, monkeypatch):
    """An air-gapped machine (no DNS): `plan3d plan --model Qwen/Qwen3-8B` waited 24.8 s while huggingface_hub
    retried the failed lookup 5 times with backoff (1+2+4+8+8 s); the lookup is checked once and no request is made.
    With a proxy set, the proxy resolves names: no lookup here."""
    import socket

    import model_zoo.hub as hub_mod

    def no_dns(*a, **kw):
        raise socket.gaierror(-2, "Name or service not known")

    def no_request(*a, **kw):
        if kw.get("local_files_only"):
            raise _exc(hub_errors.LocalEntryNotFoundError)
        raise AssertionError("a request was made")

    monkeypatch.setattr(hub_mod.socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_request)
    with pytest.raises(ModelSpecError, match=r"cannot reach the Hub \(gaierror: .*Name or service not known"):
        fetch_config("org/uncached-model")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    with pytest.raises(AssertionError, match="a request was made"):
        fetch_config("org/uncached-model")
