"""Per-operation efficiency tables shipped with the cluster specs (``cluster_specs/data/efficiency/*.yaml``).

``attention.yaml``: fused-attention kernel TFLOP/s against sequence length per GPU and kernel (published kernel
benchmarks, each series with its source in the file). ``attention_tflops`` interpolates them.
"""
from __future__ import annotations

import bisect
import functools
import math
from importlib import resources
from typing import Any

import yaml


@functools.lru_cache(maxsize=None)
def _table(name: str) -> dict[str, Any]:
    root = resources.files("cluster_specs").joinpath("data", "efficiency", f"{name}.yaml")
    return yaml.safe_load(root.read_text(encoding="utf-8"))


def _gpu_entry(gpus: dict[str, Any], gpu: str) -> tuple[str, dict[str, Any]] | None:
    g = gpu.upper()
    for name, entry in gpus.items():
        if g == name.upper() or g in (a.upper() for a in entry.get("also", [])):
            return name, entry
    return None


def _interp_log(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation of ``ys`` in ``log(x)``, held constant beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    t = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def attention_kernels(gpu: str) -> tuple[str, ...]:
    """Kernels with a series for ``gpu`` (e.g. ``("cudnn", "flash2")``); empty when the GPU has no table."""
    t = _table("attention")
    hit = _gpu_entry(t["gpus"], gpu)
    if hit is None:
        return ()
    name, entry = hit
    if "scaled_from" in entry:
        return (entry["scaled_from"]["kernel"],)
    return tuple(entry["kernels"])


def attention_tflops(gpu: str, kernel: str, seq_length: float, head_dim: float) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s of the fused attention ``kernel`` on ``gpu`` at key length ``seq_length``
    (tokens) and ``head_dim``, interpolated in log sequence length (held at the table's ends) and scaled by the
    head-dim factor; None when the table has no series for them. A GPU listed as ``scaled_from`` another uses that
    GPU's curve shape scaled to its own long-sequence value."""
    t = _table("attention")
    hit = _gpu_entry(t["gpus"], gpu)
    if hit is None:
        return None
    _, entry = hit
    xs = [float(x) for x in t["sequence_lengths"]]
    scale = 1.0
    if "scaled_from" in entry:
        src = entry["scaled_from"]
        if kernel != src["kernel"]:
            return None
        base = t["gpus"][src["gpu"]]["kernels"][kernel]
        scale = float(src["asymptote_tflops"]) / float(base["forward"][-1])
    else:
        base = entry["kernels"].get(kernel)
        if base is None:
            return None
    hd = {float(k): float(v) for k, v in t["head_dim_factor"].items()}
    hds = sorted(hd)
    f_hd = _interp_log(hds, [hd[k] for k in hds], float(head_dim))
    fwd = _interp_log(xs, [float(v) for v in base["forward"]], seq_length) * scale * f_hd
    bwd = _interp_log(xs, [float(v) for v in base["backward"]], seq_length) * scale * f_hd
    return fwd, bwd
