"""plan3d's MoE routing term against the routing kernels plan3d measured on an H200 (2026-12-04).

``benchmarks/moe_routing_device.py`` timed, on one H200, the token permutation of Megatron-LM's
``--moe-permute-fusion`` (Transformer Engine 2.8's Triton kernels, forward and backward, with and without the
``alltoall`` dispatcher's chunk sort), ``torch.topk`` over the router logits, Megatron-LM's unfused router and a plain
copy of the routed copies, for four published MoE models' routing shapes at 2,048-16,384 tokens
(``benchmarks/data/measured_h200_20261204_moe_routing.json``). This script derives from it:

- the share of the datasheet HBM bandwidth (4.8 TB/s) the permutation kernels reach, counting the bytes they must
  move (``moe_overhead.permute_passes``): per shape, the median (``PERMUTE_HBM_FRACTION``), and the copy's share;
- the least-squares fit ``a + b x tokens + c x tokens x experts`` of ``torch.topk``'s time, the stand-in for the
  fused router kernel (``ROUTER_KERNEL_S``), with its largest error;
- the model's routing kernels (the kernel part of ``moe_overhead.moe_routing_s``, evaluated here with the same
  functions: ``router_kernel_s`` each way plus ``permute_passes`` bytes at ``PERMUTE_HBM_FRACTION``; its fitted
  remainder ``MOE_TOKEN_COPY_S`` is printed beside them) against the measured fused path (permutation + two top-k
  calls), shape by shape, next to Megatron-LM's unfused router and permutation.

Run: ``.venv/bin/python benchmarks/moe_routing_measured.py``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from cluster_specs.loaders import get_cluster
from cost_models.moe_overhead import (MOE_TOKEN_COPY_S, PERMUTE_HBM_FRACTION, ROUTER_KERNEL_S, permute_passes,
                                     router_kernel_s)

DATA = Path(__file__).parent / "data" / "measured_h200_20261204_moe_routing.json"


def bytes_moved(r: dict) -> float:
    """HBM bytes a measured path must move, forward + backward (BF16 copies)."""
    copies_bytes = r["routed_copies"] * r["hidden"] * 2
    if r["path"] == "copy":
        return 2 * copies_bytes
    return 2 * permute_passes(r["top_k"], r["path"] == "fused" and r["chunk_sort"]) * copies_bytes


def hbm_shares(rows: list[dict], path: str, peak: float) -> list[float]:
    """Counted bytes / GPU seconds / datasheet bandwidth of each measured ``path`` record."""
    return [bytes_moved(r) / r["gpu_s"] / peak for r in rows if r["path"] == path and "gpu_s" in r]


def router_fit(rows: list[dict]) -> tuple[np.ndarray, float]:
    """Least squares ``a + b x tokens + c x tokens x experts`` of the ``topk`` records' GPU seconds: ((a, b, c), the
    largest relative error)."""
    topk = [r for r in rows if r["path"] == "topk" and "gpu_s" in r]
    x = np.array([[1.0, r["tokens"], r["tokens"] * r["experts"]] for r in topk])
    y = np.array([r["gpu_s"] for r in topk])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return coef, float(np.max(np.abs(x @ coef / y - 1)))


def load() -> tuple[dict, list[dict], float]:
    """(environment, timed records, the dgx-h200 datasheet HBM bytes/s)."""
    doc = json.loads(DATA.read_text())
    rows = [r for r in doc["moe_routing"] if "gpu_s" in r]
    return doc["environment"], rows, get_cluster("dgx-h200").gpu.hbm_bandwidth_bytes_per_s


def main() -> int:
    env, rows, peak = load()
    print(f"measured: {env['gpu']}, torch {env['torch']}, {env['date_utc']}; datasheet HBM {peak / 1e12:.1f} TB/s")

    print("\nshare of the datasheet HBM bandwidth, counted bytes / GPU time / peak")
    print(f"{'path':14s} {'shapes':>6s} {'min':>6s} {'median':>7s} {'max':>6s}")
    for path in ("fused", "fused_nosort", "copy"):
        xs = hbm_shares(rows, path, peak)
        print(f"{path:14s} {len(xs):6d} {min(xs):6.3f} {statistics.median(xs):7.3f} {max(xs):6.3f}")
    both = hbm_shares(rows, "fused", peak) + hbm_shares(rows, "fused_nosort", peak)
    large = [r for r in rows if r["tokens"] >= 4096]
    train = hbm_shares(large, "fused", peak) + hbm_shares(large, "fused_nosort", peak)
    print(f"permutation kernels, both: median {statistics.median(both):.3f} over {len(both)} shapes, "
          f"{statistics.median(train):.3f} over the {len(train)} with >= 4,096 tokens "
          f"(PERMUTE_HBM_FRACTION {PERMUTE_HBM_FRACTION})")

    coef, worst = router_fit(rows)
    print(f"\ntorch.topk over [tokens, experts]: {coef[0] * 1e6:.2f} us + {coef[1] * 1e9:.3f} ns/token"
          f" + {coef[2] * 1e12:.2f} ps/score, max error {worst:.0%} (ROUTER_KERNEL_S "
          f"{ROUTER_KERNEL_S[0] * 1e6:.2f} us, {ROUTER_KERNEL_S[1] * 1e9:.3f} ns, {ROUTER_KERNEL_S[2] * 1e12:.2f} ps)")

    print("\nforward + backward routing per layer: the model's kernels (router x 2 + permutation) vs measured (fused"
          " path + 2 x topk);\nthe fitted remainder MOE_TOKEN_COPY_S x copies comes on top in the model; Megatron-LM's"
          " unfused router and permutation (its chunk sort\nwhere the model has several local experts at EP 8, on"
          " both rows) for comparison")
    print(f"{'model':16s} {'tokens':>6s} {'sort':>5s} {'kernels us':>10s} {'measured us':>12s} {'ratio':>6s}"
          f" {'remainder us':>13s} {'unfused router us':>18s} {'unfused path us':>16s}")
    by_key = {(r["model"], r["tokens"], r["path"]): r for r in rows}
    ratios = []
    for (name, tokens, path), r in sorted(by_key.items()):
        if path not in ("fused", "fused_nosort"):
            continue
        sort = path == "fused" and r["chunk_sort"]
        router = 2 * router_kernel_s(tokens, r["experts"])
        model_s = router + bytes_moved(r) / (peak * PERMUTE_HBM_FRACTION)
        measured = r["gpu_s"] + 2 * by_key[(name, tokens, "topk")]["gpu_s"]
        ratios.append(model_s / measured)
        print(f"{name:16s} {tokens:6d} {str(sort):>5s} {model_s * 1e6:10.0f} {measured * 1e6:12.0f}"
              f" {model_s / measured:6.2f} {MOE_TOKEN_COPY_S * r['routed_copies'] * 1e6:13.0f}"
              f" {by_key[(name, tokens, 'router')]['gpu_s'] * 1e6:18.0f}"
              f" {by_key[(name, tokens, 'unfused')]['gpu_s'] * 1e6:16.0f}")
    print(f"kernels / measured: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
