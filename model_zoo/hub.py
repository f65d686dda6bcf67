"""Hugging Face Hub model ids (``org/name``): fetch ``config.json`` through ``huggingface_hub``, cache first.

How ``--model`` (``load_model``) tells the three kinds of reference apart, in this order:

1. a built-in name (``plan3d models``; case-insensitive), e.g. ``llama3.1-8b``;
2. an existing path (a YAML, a ``config.json``, or a directory holding one), e.g. ``./my-model.yaml``;
3. a Hub id: ``org/name`` or ``org/name@revision`` (one slash, letters, digits, ``-``, ``_``, ``.``; no file
   suffix, no leading ``.`` or ``/``), e.g. ``meta-llama/Llama-3.1-8B``. A local folder of that name wins
   (rule 2), as with ``transformers``' ``from_pretrained``.

Only ``config.json`` is read (a few kB; no weights). The Hub cache is tried first (``local_files_only``), so a
cached config works offline with no request at all; only a miss goes to the network, unless offline mode is on
(``HF_HUB_OFFLINE=1``), in which case a miss is an error saying how to fill the cache. The cache folder is
``huggingface_hub``'s: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (read when
called, so a test or a script may set them after import). Gated, private or missing repositories and an
unreachable Hub each give one ``ModelSpecError`` line that says what to do.

This module imports ``huggingface_hub`` only when a Hub id is actually loaded.
"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any

from .errors import ModelSpecError

#: ``org/name`` with an optional ``@revision`` (huggingface_hub's repo-id rules: letters, digits, ``-_.``, at
#: most 96 characters per part; ``--`` and ``..`` are refused by the Hub and here).
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})"
                    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_./-]{0,199}))?$")
_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def is_hub_id(ref: str) -> bool:
    """Whether ``ref`` has the form of a Hub model id (rule 3 above): ``org/name`` or ``org/name@rev``, without
    a file suffix, ``--`` or ``..``."""
    m = HUB_ID.match(ref)
    return bool(m) and not m.group("repo").lower().endswith(_FILE_SUFFIXES) and "--" not in ref and ".." not in ref


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_cache_dir() -> Path:
    """The Hub cache folder as ``huggingface_hub`` resolves it (``HF_HUB_CACHE``, ``$HF_HOME/hub``,
    ``$XDG_CACHE_HOME/huggingface/hub``, ``~/.cache/huggingface/hub``), read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _import_hub():
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:  # pragma: no cover - a core dependency; only a broken install lands here
        raise ModelSpecError("reading a Hub model id needs huggingface_hub: pip install huggingface_hub "
                             "(or give a config.json path)") from None
    return huggingface_hub, errors


def _reason(e: BaseException) -> str:
    """The root cause of a failed request, on one line (``ConnectError: [Errno 111] Connection refused``)."""
    root = e
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    text = " ".join(str(root).split())[:120]
    return f"{type(root).__name__}: {text}" if text else type(root).__name__


class _quiet:
    """Silence ``huggingface_hub``'s retry warnings for one call: plan3d's own one-line error says it all."""

    def __init__(self, hub):
        self._logging = hub.utils.logging

    def __enter__(self):
        self._level = self._logging.get_verbosity()
        self._logging.set_verbosity_error()

    def __exit__(self, *exc):
        self._logging.set_verbosity(self._level)
        return False


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _dns_error(endpoint: str) -> str | None:
    """Why the Hub's host name does not resolve here (None when it does, or when a proxy resolves it for us).

    ``huggingface_hub`` retries a failed request 5 times with backoff (1, 2, 4, 8, 8 s: ``utils/_http.py``
    ``http_backoff``), so an air-gapped machine waited ~24 s for the one-line error; a failed name lookup is not
    transient, and one ``getaddrinfo`` (milliseconds) tells it before any request."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    u = urlsplit(endpoint)
    if not u.hostname:
        return None
    try:
        socket.getaddrinfo(u.hostname, u.port or (80 if u.scheme == "http" else 443), proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        return f"gaierror: {e}"
    return None


def fetch_config(ref: str) -> tuple[dict[str, Any], str]:
    """``(config, where)``: the parsed ``config.json`` of Hub id ``ref`` and the local file it was read from.

    Raises ``ModelSpecError`` (one line, what to do): gated repository (accept the licence, log in), repository
    or revision not found (spelling, or private: log in), no ``config.json`` in it, not cached while offline,
    Hub unreachable.
    """
    import json

    m = HUB_ID.match(ref)
    if m is None or not is_hub_id(ref):
        raise ModelSpecError(f"{ref}: not a Hub model id (expected org/name or org/name@revision)")
    repo, rev = m.group("repo"), m.group("revision")
    hub, err = _import_hub()
    kw = dict(repo_id=repo, filename="config.json", revision=rev, cache_dir=str(hub_cache_dir()),
              endpoint=os.environ.get("HF_ENDPOINT") or None)
    url = f"https://huggingface.co/{repo}"
    try:
        path = hub.hf_hub_download(**kw, local_files_only=True)  # cache first: no request when cached
    except (err.LocalEntryNotFoundError, FileNotFoundError):
        path = None
    if path is None:
        if _env_flag("HF_HUB_OFFLINE"):
            raise ModelSpecError(f"{ref}: config.json is not in the Hub cache ({hub_cache_dir()}) and HF_HUB_OFFLINE "
                                 f"is set: run once online, or `hf download {repo} config.json`, or give a "
                                 f"config.json path")
        dns = _dns_error(kw["endpoint"] or hub.constants.ENDPOINT)
        if dns is not None:
            raise ModelSpecError(f"{ref}: cannot reach the Hub ({dns}) and config.json is not cached: check the "
                                 f"network or proxy (HF_ENDPOINT), or give a config.json path")
        try:
            with _quiet(hub):
                path = hub.hf_hub_download(**kw)
        except err.LocalEntryNotFoundError as e:  # the request failed (no network, DNS, proxy) and no cache
            raise ModelSpecError(f"{ref}: cannot reach the Hub ({_reason(e)}) and config.json is not cached: check "
                                 f"the network or proxy (HF_ENDPOINT), or give a config.json path") from None
        except err.GatedRepoError:
            raise ModelSpecError(f"{ref}: gated model: accept its licence at {url} and log in (`hf auth login` or "
                                 f"HF_TOKEN), or give a config.json path") from None
        except err.RevisionNotFoundError:
            raise ModelSpecError(f"{ref}: revision {rev or 'main'!r} not found on the Hub: check it at {url}") from None
        except err.RepositoryNotFoundError:
            raise ModelSpecError(f"{ref}: no such model on the Hub (check the spelling at {url}; a private model "
                                 f"needs `hf auth login` or HF_TOKEN)") from None
        except err.EntryNotFoundError:
            raise ModelSpecError(f"{ref}: the repository has no config.json (not a transformers model); give a "
                                 f"config.json path") from None
        except (err.OfflineModeIsEnabled, OSError, err.HfHubHTTPError) as e:  # other HTTP / connection errors
            raise ModelSpecError(f"{ref}: cannot reach the Hub ({_reason(e)}) and config.json is not cached: check "
                                 f"the network or proxy (HF_ENDPOINT), or give a config.json path") from None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")), str(path)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelSpecError(f"{ref}: cached config.json {path} is unreadable ({e}); delete it and retry") from None
