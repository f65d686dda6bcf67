"""Load ``ModelSpec`` objects: the built-in zoo, our own YAML files, Hugging Face ``config.json`` files (translated
by ``model_zoo.hf_config``) and Hugging Face Hub ids (``model_zoo.hub``).
"""
from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .build import spec_from_dict
from .errors import ModelSpecError
from .hf_config import from_hf_config
from .input_guard import parse, read_text
from .spec import ModelSpec

DEFAULT_MODEL = "llama3.1-8b"
#: Largest model file read: a config.json is 1-5 KiB (a few with id2label maps ~50 KiB); 1 MiB is 200x that and
#: still parses in about a second.
MAX_FILE_BYTES = 2**20

# ---------------------------------------------------------------------------------------------
# built-in zoo


@lru_cache(maxsize=1)
def _zoo() -> dict[str, dict[str, Any]]:
    text = resources.files("model_zoo").joinpath("data/models.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    return {name: dict(entry, name=name) for name, entry in raw["models"].items()}


def list_models() -> list[str]:
    """Names of the built-in models, in file order."""
    return list(_zoo())


def _unknown(name: str) -> ModelSpecError:
    close = difflib.get_close_matches(name.lower(), list_models(), n=3, cutoff=0.5)
    hint = f"; did you mean: {', '.join(close)}?" if close else f"; known models: {', '.join(list_models())}"
    return ModelSpecError(f"unknown model '{name}'{hint}")


def get_model(name: str) -> ModelSpec:
    """A built-in model by name (case-insensitive)."""
    zoo = _zoo()
    key = name.strip().lower()
    if key not in zoo:
        raise _unknown(name)
    return spec_from_dict(f"built-in model '{key}'", zoo[key])


# ---------------------------------------------------------------------------------------------
# files


def _read_json(path: Path) -> Any:
    text = read_text(path, MAX_FILE_BYTES, ModelSpecError, "model file")
    try:
        return parse(text, "json", path.name, ModelSpecError)
    except json.JSONDecodeError as exc:
        raise ModelSpecError(f"{path.name}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def _read_yaml(path: Path) -> Any:
    text = read_text(path, MAX_FILE_BYTES, ModelSpecError, "model file")
    try:
        return parse(text, "yaml", path.name, ModelSpecError)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ModelSpecError(f"{path.name}: malformed YAML{at}: {' '.join(str(problem).split())}") from None


def load_model_file(path: str | Path) -> ModelSpec:
    """Load a HF ``config.json`` (``.json``) or our own YAML (``.yaml``/``.yml``; ModelSpec fields;
    ``name`` defaults to the file stem). A ``.json`` without ``model_type`` that has ModelSpec's
    ``num_layers`` is read as our own format too."""
    p = Path(path)
    where = p.name
    if p.suffix.lower() == ".json":
        data = _read_json(p)
        if isinstance(data, dict) and "model_type" not in data and "num_layers" in data:
            data.setdefault("name", p.stem)
            data.setdefault("source", str(p))
            return spec_from_dict(where, data)
        return from_hf_config(data, name=p.parent.name if p.stem == "config" else p.stem, where=where,
                              source=str(p))
    data = _read_yaml(p)
    if not isinstance(data, dict):
        raise ModelSpecError(f"{where}: top level must be a mapping of ModelSpec fields")
    if "model_type" in data and "num_layers" not in data:  # an HF config written as YAML
        return from_hf_config(data, name=p.stem, where=where, source=str(p))
    data = dict(data)
    data.setdefault("name", p.stem)
    data.setdefault("source", str(p))
    return spec_from_dict(where, data)


def load_model(ref: str | Path) -> ModelSpec:
    """A built-in name, a path to our YAML, a path to a HF ``config.json`` (or a directory holding one), or a
    Hugging Face Hub id ``org/name[@revision]``, tried in that order (``model_zoo.hub`` documents the rule)."""
    s = str(ref)
    if isinstance(ref, str) and s.strip().lower() in _zoo():
        return get_model(s)
    p = Path(s)
    try:
        is_dir, exists = p.is_dir(), p.exists()
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        raise ModelSpecError(f"{s[:200]}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if is_dir:
        cfg = p / "config.json"
        if cfg.is_file():
            return load_model_file(cfg)
        raise ModelSpecError(f"{p}: directory has no config.json")
    if exists:
        return load_model_file(p)
    from .hub import fetch_config, is_hub_id
    if isinstance(ref, str) and is_hub_id(s):
        config, path = fetch_config(s)
        return from_hf_config(config, name=s, where=f"{s} config.json", source=f"https://huggingface.co/{s}")
    if p.suffix.lower() in (".json", ".yaml", ".yml") or "/" in s or "\\" in s:
        raise ModelSpecError(f"{s}: no such file")
    raise _unknown(s)
