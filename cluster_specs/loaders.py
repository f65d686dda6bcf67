"""Find, load and validate cluster specs; resolve ``--gpus`` / ``--nodes``.

Built-in clusters are the YAML files in ``cluster_specs/data/`` (package data); the file stem is
the cluster name. A user file has the same fields (dump a built-in with
``yaml.safe_dump(get_cluster("dgx-h100").to_dict())`` to start one).

Every error is a :class:`ClusterSpecError` with a one-line message naming the file or cluster and
the field at fault.
"""
from __future__ import annotations

import difflib
import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import ClusterSpecError
from .input_guard import ERROR_TYPE, parse, read_text
from .spec import MAX_GPUS, ClusterSpec

DEFAULT_CLUSTER = "dgx-h100"

#: Largest cluster file read: the built-in ones are ~5 KiB; 1 MiB is 200x that and still parses in about a second
#: (PyYAML's pure-Python loader reads ~1-3 MB/s).
MAX_FILE_BYTES = 2**20

_DATA_PACKAGE = "cluster_specs"
_DATA_DIR = "data"


def _data_files() -> dict[str, Any]:
    root = resources.files(_DATA_PACKAGE).joinpath(_DATA_DIR)
    return {
        entry.name.rsplit(".", 1)[0]: entry
        for entry in root.iterdir()
        if entry.is_file() and entry.name.endswith((".yaml", ".yml"))
    }


def list_clusters() -> list[str]:
    """Names of the built-in clusters, sorted."""
    return sorted(_data_files())


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        msg = msg[:1].lower() + msg[1:]
        if err.get("type") == ERROR_TYPE:  # Plausible: "field 'X' = V is outside [lo, hi] (why)"
            parts.append(f"field '{loc}' {err.get('msg')}")
            continue
        if err.get("type") == "missing":
            msg = "required field is missing"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field (extra fields are not allowed)"
        parts.append(f"field '{loc}': {msg}" if loc else msg)
    return _one_line("; ".join(parts))


#: What a one-cluster command says when given what only ``plan`` takes (``--cluster`` forms of planner/comparison.py).
ONE_CLUSTER_ONLY = ("give one cluster here: only `plan3d plan` (planner.plan_pools) plans over pools and only "
                    "`plan3d plan --train-tokens` (planner.compare) compares clusters")


def _parse(data: Any, origin: str) -> ClusterSpec:
    if not isinstance(data, dict):
        raise ClusterSpecError(
            f"{origin}: a cluster spec must be a YAML mapping at top level, got {type(data).__name__}"
        )
    if "pools" in data:
        raise ClusterSpecError(f"{origin}: a mixed cluster (pools:), not one cluster spec: {ONE_CLUSTER_ONLY}")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise ClusterSpecError(f"{origin}: invalid cluster spec: {_format_validation_error(exc)}") from None


def _load_text(text: str, origin: str) -> ClusterSpec:
    try:
        data = parse(text, "yaml", origin, ClusterSpecError)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        problem = getattr(exc, "problem", None) or str(exc)
        raise ClusterSpecError(f"{where}: malformed YAML: {_one_line(problem)}") from None
    return _parse(data, origin)


@functools.lru_cache(maxsize=None)
def _builtin(name: str) -> ClusterSpec:
    entry = _data_files()[name]
    spec = _load_text(entry.read_text(encoding="utf-8"), f"cluster_specs/data/{entry.name}")
    if spec.name != name:
        raise ClusterSpecError(
            f"cluster_specs/data/{entry.name}: field 'name' is '{spec.name}' but the file defines '{name}'"
        )
    return spec


def _unknown(name: str) -> ClusterSpecError:
    if "," in name or ":" in name:  # NAME:NODES pools or NAME,NAME alternatives: forms only ``plan`` reads
        form = "pools of a mixed cluster (NAME:NODES,...)" if ":" in name else "several clusters (NAME,NAME,...)"
        return ClusterSpecError(f"--cluster '{name}' names {form}: {ONE_CLUSTER_ONLY}")
    names = list_clusters()
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        hint = f"did you mean: {', '.join(close)}?"
    else:
        hint = f"known clusters: {', '.join(names)}"
    return ClusterSpecError(f"unknown cluster '{name}'; {hint} (see `plan3d clusters`)")


def get_cluster(name: str) -> ClusterSpec:
    """The built-in cluster ``name`` (see :func:`list_clusters`)."""
    key = str(name).strip()
    if key not in _data_files():
        raise _unknown(key)
    return _builtin(key)


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml", ".json")) or "/" in ref or "\\" in ref or ref.startswith(".")


def load_cluster(ref: str | Path) -> ClusterSpec:
    """A built-in cluster name, or a path to a YAML file with the ``ClusterSpec`` fields."""
    if isinstance(ref, Path):
        return load_cluster_file(ref)
    key = str(ref).strip()
    if key in _data_files():
        return _builtin(key)
    path = Path(key).expanduser()
    try:
        on_disk = path.exists()
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        raise ClusterSpecError(f"cluster file '{key[:200]}': cannot read: {getattr(e, 'strerror', None) or e}") from None
    if on_disk:
        return load_cluster_file(path)
    if _looks_like_path(key):
        raise ClusterSpecError(f"cluster file '{key}' not found")
    raise _unknown(key)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    """Load and validate a cluster spec YAML file."""
    p = Path(path).expanduser()
    return _load_text(read_text(p, MAX_FILE_BYTES, ClusterSpecError, "cluster file"), str(p))


def dump_cluster(spec: ClusterSpec, path: str | Path | None = None) -> str:
    """YAML text of ``spec`` (written to ``path`` if given); ``load_cluster`` reads it back equal."""
    text = yaml.safe_dump(spec.to_dict(), sort_keys=False, allow_unicode=True, width=100)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def nodes_holding(num_gpus: int, gpus_per_node: int) -> int:
    """Nodes a job of ``num_gpus`` GPUs occupies at ``gpus_per_node`` per node: a job on part of one node has one."""
    return -(-num_gpus // gpus_per_node)


def resolve_num_gpus(cluster: ClusterSpec, gpus: int | None = None, nodes: int | None = None) -> int:
    """World size from ``--gpus`` / ``--nodes``.

    Give one, the other, or neither (then ``cluster.default_num_nodes`` nodes). ``gpus`` must be a
    positive multiple of the node size, or a divisor of it (a job on part of one node: 1, 2 or 4 GPUs of an
    8-GPU node, joined by the node's NVLink/NVSwitch like the whole node); ``nodes`` must be positive; if both are
    given they must agree. On GB200 NVL72 a node is one 4-GPU compute tray (see ``NodeSpec``).
    """
    gpn = cluster.node.gpus_per_node
    where = f"({cluster.name})"
    parts = [d for d in range(1, gpn) if gpn % d == 0]  # part-node world sizes
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes <= 0:
            raise ClusterSpecError(f"--nodes must be a positive integer; got {nodes!r}")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
            divisors = ", ".join(map(str, parts))
            raise ClusterSpecError(
                f"--gpus must be a positive multiple of the node size {gpn} GPUs {where}"
                + (f" or a divisor of it ({divisors}: part of one node)" if parts else "") + f"; got {gpus!r}"
            )
        if gpus < gpn and gpn % gpus == 0:  # part of one node
            if nodes is not None and nodes != 1:
                raise ClusterSpecError(f"--gpus {gpus} and --nodes {nodes} disagree: {gpus} GPUs are part of one "
                                       f"node of {gpn} {where}; give only one of them")
            return gpus
        if gpus > MAX_GPUS:  # before any suggestion, which would be refused as well
            raise _too_many(gpus, where)
        if gpus % gpn != 0:
            lower, upper = (gpus // gpn) * gpn, (gpus // gpn + 1) * gpn
            upper = upper if upper <= MAX_GPUS else None
            options = (f"{', '.join(map(str, parts))} (part of a node)" if lower == 0 else f"{lower}") + (
                f" or {upper}" if upper is not None else "")
            raise ClusterSpecError(
                f"--gpus {gpus} is not a multiple of the node size {gpn} GPUs {where} nor a divisor of it; use "
                f"{options}"
            )
        if nodes is not None and nodes * gpn != gpus:
            raise ClusterSpecError(
                f"--gpus {gpus} and --nodes {nodes} disagree: {nodes} node(s) of {gpn} GPUs {where} "
                f"is {nodes * gpn} GPUs; give only one of them"
            )
        n = gpus
    else:
        n = nodes * gpn if nodes is not None else cluster.default_num_nodes * gpn
    if n > MAX_GPUS:
        raise _too_many(n, where)
    return n


def _too_many(n: int, where: str) -> ClusterSpecError:
    return ClusterSpecError(f"{n:,} GPUs {where} is more than {MAX_GPUS:,} (100x the 16,384 GPUs of the largest "
                            f"published run, Llama 3.1 405B); plan a smaller --gpus / --nodes")
