"""Per-operation efficiency tables shipped with the cluster specs (``cluster_specs/data/efficiency/*.yaml``).

``attention.yaml``: fused-attention kernel TFLOP/s against sequence length per GPU and kernel (published kernel
benchmarks, each series with its source in the file), by kernel-library generation where more than one is
published, and for sliding-window attention where measured. ``attention_tflops`` and ``attention_window_tflops``
interpolate them. Its ``occupancy`` table (measured by plan3d on an H200) gives the share of the saturated rate a call
reaches against its parallel work per SM (``attention_occupancy``; both rate functions take the call's work units to
read it), and ``non_causal_ratio`` an unmasked call's rate over a causal one's (``attention_non_causal_ratio``).

``ep_dispatch.yaml``: the MoE flex dispatchers' (DeepEP, HybridEP) dispatch and combine throughput inside one
NVLink domain against expert-parallel ranks and SM count (NVIDIA's Hybrid-EP measurements in DeepEP);
``ep_dispatch_bandwidth`` interpolates it. Its ``internode`` section: DeepEP's normal kernels across NVLink domains
against node count (DeepSeek's measurement in DeepEP's README) and HybridEP's against node count and SMs (NVIDIA's,
in the same repository), read by ``ep_internode_bandwidth``.
"""
from __future__ import annotations

import bisect
import functools
import math
import re
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
    """Piecewise-linear interpolation of ``ys`` in ``log(x)``, held constant beyond the ends (``xs`` positive)."""
    return _interp_lin([math.log(v) for v in xs], ys, math.log(x))


def _interp_lin(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation of ``ys`` in ``x``, held constant beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
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


#: A software date (a run's container or framework release, the ``as_of`` of a series): ``YYYY-MM``, ASCII digits,
#: a year 2010-2099 (the fused kernels and frameworks plan3d times date from 2019 on: Megatron-LM, arXiv:1909.08053)
SOFTWARE_DATE_PATTERN = r"^(20[1-9][0-9])-(0[1-9]|1[0-2])$"
_DATE = re.compile(SOFTWARE_DATE_PATTERN)


def _months(date: str) -> int:
    """Months since year 0 of a ``YYYY-MM`` date.

    Raises:
        ValueError: not ``YYYY-MM`` with a year 2010-2099 and a month 01-12.
    """
    m = _DATE.fullmatch(str(date))
    if m is None:
        raise ValueError(f"software date must be YYYY-MM, a year 2010-2099 (e.g. 2025-11), got {date!r}")
    return 12 * int(m.group(1)) + int(m.group(2)) - 1


def attention_sm_count(gpu: str) -> int | None:
    """Streaming multiprocessors of ``gpu`` (``attention.yaml`` ``sm_count`` of its entry); None when the table has no
    entry for it."""
    hit = _gpu_entry(_table("attention")["gpus"], gpu)
    return None if hit is None else int(hit[1]["sm_count"])


def attention_occupancy(kernel: str, units_per_sm: float) -> tuple[float, float]:
    """(forward, backward) share of the saturated TFLOP/s that fused-attention ``kernel`` reaches with
    ``units_per_sm`` work units (batch x query heads x query tiles of ``occupancy.query_tile`` rows, one thread block
    each) per SM: ``attention.yaml`` ``occupancy``, measured by plan3d on an H200, interpolated in log units per SM
    and held at the ends (1.0 from 15.5 units per SM on: the benchmarks' 16k-token shape). A kernel without a
    measured curve: (1, 1)."""
    occ = _table("attention")["occupancy"]
    return _curve_at(occ["kernels"].get(kernel), occ["units_per_sm"], max(float(units_per_sm), 1e-9))


def attention_non_causal_ratio(kernel: str, seq_length: float) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of fused-attention ``kernel`` without a mask over its causal TFLOP/s at key length
    ``seq_length`` (``attention.yaml`` ``non_causal_ratio``, measured by plan3d on an H200), interpolated in log length
    and held at the ends; (1, 1) for a kernel without a measurement."""
    t = _table("attention")
    return _curve_at(t["non_causal_ratio"].get(kernel), t["sequence_lengths"], seq_length)


def _curve_at(curve: dict[str, Any] | None, xs: list[float], x: float) -> tuple[float, float]:
    """(forward, backward) of a ``{forward, backward}`` curve over ``xs`` at ``x``, interpolated in log ``x`` and held
    at the ends; (1, 1) without a curve."""
    if curve is None:
        return 1.0, 1.0
    xs = [float(v) for v in xs]
    return (_interp_log(xs, [float(v) for v in curve["forward"]], x),
            _interp_log(xs, [float(v) for v in curve["backward"]], x))


def _at_occupancy(rates: tuple[float, float], kernel: str, units: float | None,
                  sm_count: int) -> tuple[float, float]:
    """``rates`` (saturated) at the occupancy of a call with ``units`` work units on ``sm_count`` SMs
    (``attention_occupancy``); unchanged when ``units`` is None."""
    if units is None:
        return rates
    occ = attention_occupancy(kernel, units / sm_count)
    return rates[0] * occ[0], rates[1] * occ[1]


def attention_query_tile() -> int:
    """Query rows per thread block of the fused-attention kernels (``attention.yaml`` ``occupancy.query_tile``)."""
    return int(_table("attention")["occupancy"]["query_tile"])


@functools.lru_cache(maxsize=None)
def _saturated_series(gpu_key: str, kernel: str) -> dict[str, Any]:
    """The ``attention.yaml`` series of ``kernel`` under the GPU entry ``gpu_key``, every generation brought to
    saturated occupancy (``_saturated``, on that entry's SM count, where its benchmarks ran); computed once."""
    entry = _table("attention")["gpus"][gpu_key]
    series, sms, n = entry["kernels"][kernel], int(entry["sm_count"]), len(_table("attention")["sequence_lengths"])
    return {**_saturated(series, kernel, sms, n),
            "earlier": [_saturated(g, kernel, sms, n) for g in series.get("earlier", [])]}


def _saturated(gen: dict[str, Any], kernel: str, sm_count: int, n: int) -> dict[str, Any]:
    """A series generation with each point divided by the occupancy of the benchmark it was measured with
    (``benchmark_units``: its work units at each sequence length, on a GPU of ``sm_count`` SMs): the rate at
    saturated occupancy. A generation without ``benchmark_units`` is taken as saturated."""
    units = gen.get("benchmark_units")
    if units is None:
        return gen
    occ = [attention_occupancy(kernel, float(u) / sm_count) for u in units[:n]]
    return {**gen, "forward": [float(v) / o[0] for v, o in zip(gen["forward"], occ)],
            "backward": [float(v) / o[1] for v, o in zip(gen["backward"], occ)]}


def _generation(series: dict[str, Any], software_date: str | None) -> tuple[list[float], list[float]]:
    """(forward, backward) values of a kernel's series for software of ``software_date`` (``YYYY-MM``): the series
    itself (the newest generation) when undated or when it has no ``earlier`` generations; else the generations by
    ``as_of``, interpolated linearly in time between the two around the date and held at the first / last outside
    them (``attention.yaml`` header)."""
    gens = [series, *series.get("earlier", [])]
    if software_date is None or len(gens) == 1:
        return [float(v) for v in series["forward"]], [float(v) for v in series["backward"]]
    gens.sort(key=lambda g: _months(g["as_of"]))
    t = _months(software_date)
    times = [_months(g["as_of"]) for g in gens]
    if t <= times[0] or t >= times[-1]:
        g = gens[0] if t <= times[0] else gens[-1]
        return [float(v) for v in g["forward"]], [float(v) for v in g["backward"]]
    i = bisect.bisect_right(times, t)
    w = (t - times[i - 1]) / (times[i] - times[i - 1])
    lo, hi = gens[i - 1], gens[i]
    return ([(1 - w) * float(a) + w * float(b) for a, b in zip(lo["forward"], hi["forward"])],
            [(1 - w) * float(a) + w * float(b) for a, b in zip(lo["backward"], hi["backward"])])


def attention_tflops(gpu: str, kernel: str, seq_length: float, head_dim: float,
                     software_date: str | None = None,
                     half_rate_tokens: float | None = None,
                     units: float | None = None) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s of the fused attention ``kernel`` on ``gpu`` at key length ``seq_length``
    (tokens) and ``head_dim``, interpolated in log sequence length (held at the table's ends) and scaled by the
    head-dim factor; None when the table has no series for them. ``half_rate_tokens``: below the table's shortest
    length, scale that length's rate by the saturation curve ``x / (x + half_rate_tokens)`` (the caller's kernel
    model) instead of holding it. A GPU listed as ``scaled_from`` another uses that
    GPU's curve shape scaled to its own long-sequence value. ``software_date`` (``YYYY-MM``, the run's container or
    release) picks the kernel library's generation where the table has more than one (``_generation``); None = the
    newest. ``units`` (the call's batch x query heads x query tiles; None: the benchmark's own shape, the table as
    published): the rate of a call with that much parallel work, each generation's points first divided by the
    occupancy of their benchmark shape (``benchmark_units`` on the benchmark GPU's SMs) and the result multiplied by
    the call's (``attention_occupancy`` at ``units`` over ``gpu``'s SMs).

    Raises:
        ValueError: ``software_date`` is not ``YYYY-MM``.
    """
    t = _table("attention")
    hit = _gpu_entry(t["gpus"], gpu)
    if hit is None:
        return None
    key, entry = hit
    xs = [float(x) for x in t["sequence_lengths"]]
    scale = 1.0
    if "scaled_from" in entry:
        src = entry["scaled_from"]
        if kernel != src["kernel"]:
            return None
        key = src["gpu"]
        series = t["gpus"][key]["kernels"][kernel]
        scale = float(src["asymptote_tflops"]) / float(series["forward"][-1])
    else:
        series = entry["kernels"].get(kernel)
        if series is None:
            return None
    if units is not None:
        series = _saturated_series(key, kernel)
    fwd_s, bwd_s = _generation(series, software_date)
    f_hd = _head_dim_factor(t, head_dim)
    fwd = _interp_log(xs, fwd_s, seq_length) * scale * f_hd
    bwd = _interp_log(xs, bwd_s, seq_length) * scale * f_hd
    if half_rate_tokens is not None and seq_length < xs[0]:
        below = (seq_length / (seq_length + half_rate_tokens)) / (xs[0] / (xs[0] + half_rate_tokens))
        fwd, bwd = fwd * below, bwd * below
    return _at_occupancy((fwd, bwd), kernel, units, int(entry["sm_count"]))


def _head_dim_factor(t: dict[str, Any], head_dim: float) -> float:
    """The table's ``head_dim_factor`` at ``head_dim``, interpolated in log head dim (held at the ends)."""
    hd = {float(k): float(v) for k, v in t["head_dim_factor"].items()}
    hds = sorted(hd)
    return _interp_log(hds, [hd[k] for k in hds], float(head_dim))


def attention_window_tflops(gpu: str, kernel: str, window: int, seq_length: float, head_dim: float,
                            software_date: str | None = None,
                            half_rate_tokens: float | None = None,
                            units: float | None = None) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s, over the window's FLOPs, of ``kernel``'s sliding-window attention on ``gpu``
    with a window of ``window`` keys, ``seq_length`` query tokens and ``head_dim``, from the kernel's measured
    ``sliding_window`` series (``attention.yaml``); None when the GPU's kernel has none.

    The series is read at ``seq_length`` (interpolated in log length, held at its ends) and scaled by the head-dim
    factor. A window other than the measured ``w0`` scales by the kernel's causal rate at twice each window
    (``attention_tflops`` at ``2w`` over ``2w0``, ``half_rate_tokens`` below the table): a causal query block sees
    half the sequence's keys on average and a windowed one its window, so the per-block work of a window ``w`` is
    that of a causal sequence of ``2w`` (an assumption; the measurement anchors the level). The series were measured
    at saturated occupancy (at least 15.5 work units per SM); ``units`` (the call's work units, None: as measured)
    scales them by ``attention_occupancy``.

    Raises:
        ValueError: ``software_date`` is not ``YYYY-MM``.
    """
    t = _table("attention")
    hit = _gpu_entry(t["gpus"], gpu)
    if hit is None or "kernels" not in hit[1]:
        return None
    series = (hit[1]["kernels"].get(kernel) or {}).get("sliding_window")
    if series is None:
        return None
    xs = [float(x) for x in series["sequence_lengths"]]
    f_hd = _head_dim_factor(t, head_dim) / _head_dim_factor(t, series["head_dim"])
    fwd = _interp_log(xs, [float(v) for v in series["forward"]], seq_length) * f_hd
    bwd = _interp_log(xs, [float(v) for v in series["backward"]], seq_length) * f_hd
    w0 = int(series["window"])
    if window != w0:
        at_w = attention_tflops(gpu, kernel, 2 * window, 128, software_date, half_rate_tokens)
        at_w0 = attention_tflops(gpu, kernel, 2 * w0, 128, software_date, half_rate_tokens)
        if at_w is not None and at_w0 is not None:
            fwd, bwd = fwd * at_w[0] / at_w0[0], bwd * at_w[1] / at_w0[1]
    return _at_occupancy((fwd, bwd), kernel, units, int(hit[1]["sm_count"]))


#: MoE flex dispatcher backends with a throughput table (Megatron-LM ``--moe-flex-dispatcher-backend``).
FLEX_DISPATCHER_BACKENDS = ("deepep", "hybridep")


def _check_flex_backend(backend: str) -> None:
    """Raises ``ValueError`` unless ``backend`` is one of ``FLEX_DISPATCHER_BACKENDS``."""
    if backend not in FLEX_DISPATCHER_BACKENDS:
        raise ValueError(f"moe_flex_dispatcher_backend {backend!r}: allowed {', '.join(FLEX_DISPATCHER_BACKENDS)}")


def _rates_on_grid(grid: dict[Any, Any], size: float, sms: float) -> tuple[float, float]:
    """(dispatch, combine) bytes/s from an ``ep_dispatch.yaml`` series ``{size: {sms: [dispatch, combine] GB/s}}``
    (size: EP ranks in one domain, or nodes across domains): linear in SMs at each measured size, then linear in
    size, both held beyond the measured points."""
    sizes = sorted(int(k) for k in grid)

    def at(n: int) -> tuple[float, float]:
        by_sms = grid[n]
        s_xs = [float(k) for k in sorted(int(k) for k in by_sms)]
        return tuple(_interp_lin(s_xs, [float(by_sms[int(k)][i]) for k in s_xs], sms)
                     for i in (0, 1))  # type: ignore[return-value]

    per_size = [at(n) for n in sizes]
    return tuple(_interp_lin([float(n) for n in sizes], [p[i] for p in per_size], size) * 1e9
                 for i in (0, 1))  # type: ignore[return-value]


def flex_dispatcher_default_sms(backend: str) -> int:
    """SMs the flex dispatcher ``backend`` runs on when the run sets none (``ep_dispatch.yaml`` ``default_sms``).

    Raises:
        ValueError: ``backend`` is not one of ``FLEX_DISPATCHER_BACKENDS``.
    """
    _check_flex_backend(backend)
    return int(_table("ep_dispatch")["backends"][backend]["default_sms"])


def ep_dispatch_bandwidth(gpu: str, backend: str, ranks: int, num_sms: int | None = None
                          ) -> tuple[float, float] | None:
    """(dispatch, combine) throughput in bytes/s of the flex dispatcher ``backend`` over ``ranks`` expert-parallel
    ranks of one NVLink domain of ``gpu``s with ``num_sms`` SMs (None: the backend's default), or None when the
    GPU has no measured series for the backend.

    A figure is DeepEP's "algorithm bandwidth": the BF16 bytes of the tokens one rank receives (each token once per
    destination rank holding any of its experts, its own rank included) over the Python call's time; the combine
    returns the same bytes (``ep_dispatch.yaml``: NVIDIA's Hybrid-EP measurements, DeepEP
    ``Hybrid-EP_Implementation.md``). Linear in ranks and in SMs between measured points, held beyond them.

    Raises:
        ValueError: ``backend`` is not one of ``FLEX_DISPATCHER_BACKENDS``.
    """
    sms = flex_dispatcher_default_sms(backend) if num_sms is None else num_sms
    hit = _gpu_entry(_table("ep_dispatch")["gpus"], gpu)
    if hit is None or backend not in hit[1]:
        return None
    return _rates_on_grid(hit[1][backend], float(ranks), float(sms))


def ep_internode_bandwidth(backend: str, domains: int, num_sms: int | None = None) -> tuple[float, float] | None:
    """(dispatch, combine) logical throughput in bytes/s of the flex dispatcher ``backend``'s kernels over an
    expert-parallel group spanning ``domains`` NVLink domains (nodes of 8 GPUs) with ``num_sms`` SMs (None: the
    backend's default across domains), or None when ``domains`` is below 2 (``ep_dispatch.yaml`` ``internode``:
    DeepEP's normal kernels, DeepSeek's measurement on H800; HybridEP, NVIDIA's on H100; a 400 Gb/s NIC per GPU).

    A figure counts the bytes of one rank's tokens once per distinct destination domain, its own included, over the
    call's time: DeepEP's dispatch was measured in FP8 (with its 1/128 scales), HybridEP's in BF16, both combines in
    BF16. Linear in domains and in SMs between measured points, held beyond them.

    Raises:
        ValueError: ``backend`` is not one of ``FLEX_DISPATCHER_BACKENDS``.
    """
    _check_flex_backend(backend)
    if domains < 2:
        return None
    series = _table("ep_dispatch")["internode"][backend]
    sms = series["default_sms"] if num_sms is None else num_sms
    return _rates_on_grid(series["nodes"], float(domains), float(sms))
