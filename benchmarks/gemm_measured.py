"""plan3d's GEMM term against the GEMMs plan3d measured on an H200 (``benchmarks/measure_device.py``, 2026-12-04).

``cost_models.gemm.gemm_time`` charges a GEMM its MAMF-rate compute time plus ``KAPPA`` times the time to stream its
operands from HBM; ``moe_overhead.HOST_GEMM_S`` is the host time of one expert GEMM call, exposed where the GPU
work is shorter. This script sets both against one machine's measurements
(``benchmarks/data/measured_h200_20261204.json``) on the ``dgx-h200`` cluster's rates. It prints:

- dense BF16 GEMMs over (M, N, K): the model's time over the measured one, and the ``KAPPA`` each measurement implies,
  ``(t_measured - 2MNK / rate) x HBM / bytes``, against the cluster's MAMF rate and against this board's own
  sustained rate (the median of its large GEMMs, power-bound at 700 W);
- dense FP8 GEMMs over the same shapes: the model's time over the measured one, with the output streamed at the
  1-byte operand width (as ``gemm_time`` is called for FP8) and at the 16 bits the kernels write;
- MoE expert GEMMs (four published models' expert shapes, 4 and 16 local experts, 128-4096 tokens per expert): the
  model (one ``gemm_time`` per expert) against one grouped GEMM (``torch._grouped_mm``) and against a loop of one
  GEMM call per expert, and the host time per call the loop shows where it is host-bound.

These are kernels run alone, on one board: a training step runs them between NCCL and elementwise kernels, so the
fitted ``KAPPA`` is an in-training figure (``gemm.KAPPA``'s comment). Nothing here is fitted; the figures are what the
closing notes of issue 9 quote. Run: ``.venv/bin/python benchmarks/gemm_measured.py``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from cluster_specs.loaders import get_cluster
from cost_models import gemm
from cost_models.moe_overhead import HOST_GEMM_S
from gemm_published import implied_kappa  # benchmarks/ is on sys.path when a script in it runs

DATA = Path(__file__).parent / "data" / "measured_h200_20261204.json"


def quartiles(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f}"


def main() -> int:
    doc = json.loads(DATA.read_text())
    env = doc["environment"]
    cluster = get_cluster("dgx-h200")
    rate, hbm = gemm.mamf_rate(cluster, "bf16"), gemm.hbm_rate(cluster)
    print(f"measured: {env['gpu']}, torch {env['torch']}, cuDNN {env['cudnn']}, {env['date_utc']}")
    print(f"model: dgx-h200 bf16 MAMF {rate / 1e12:.1f} TFLOP/s, HBM {hbm / 1e12:.2f} TB/s, KAPPA {gemm.KAPPA:g}")

    dense = [r for r in doc["gemm"] if r.get("dtype") == "bf16" and "subset" not in r and "seconds" in r]
    large = [r for r in dense if min(r["m"], r["n"], r["k"]) >= 4096]
    sustained = statistics.median(r["tflops"] for r in large) * 1e12
    ratio = [gemm.gemm_time(r["m"], r["k"], r["n"], rate, hbm, 2.0) / r["seconds"] for r in dense]
    k_mamf = [implied_kappa(r["m"], r["n"], r["k"], r["seconds"], rate, hbm) for r in dense]
    k_sus = [implied_kappa(r["m"], r["n"], r["k"], r["seconds"], sustained, hbm) for r in dense]
    print(f"\ndense BF16, {len(dense)} shapes (M 1k-16k, N 512-28k, K 512-16k): best {max(r['tflops'] for r in dense):.0f}"
          f" TFLOP/s, median of the {len(large)} with every dimension >= 4096 {sustained / 1e12:.0f}")
    print(f"  model time / measured, quartiles: {quartiles(ratio)}")
    print(f"  implied KAPPA at the MAMF rate, quartiles: {quartiles(k_mamf)}")
    print(f"  implied KAPPA at the board's sustained rate, quartiles: {quartiles(k_sus)}")

    # FP8 (E4M3 operands, per-tensor scales, 16-bit output: torch._scaled_mm(out_dtype=bfloat16), as Transformer
    # Engine's FP8 GEMMs write the activation dtype); plan3d streams an FP8 GEMM's output at its 1-byte operand width
    fp8 = [r for r in doc["gemm"] if r.get("dtype") == "fp8_e4m3" and "subset" not in r and "seconds" in r]
    rate8 = gemm.mamf_rate(cluster, "fp8")
    big8 = statistics.median(r["tflops"] for r in fp8 if min(r["m"], r["n"], r["k"]) >= 4096)
    print(f"\ndense FP8, {len(fp8)} shapes: best {max(r['tflops'] for r in fp8):.0f} TFLOP/s, median of the large ones "
          f"{big8:.0f} (model MAMF {rate8 / 1e12:.0f})")
    as_shipped = [gemm.gemm_time(r["m"], r["k"], r["n"], rate8, hbm, 1.0) / r["seconds"] for r in fp8]
    out16 = [(gemm.gemm_time(r["m"], r["k"], r["n"], rate8, hbm, 1.0)
              + gemm.KAPPA * r["m"] * r["n"] / hbm) / r["seconds"] for r in fp8]
    print(f"  model time / measured, quartiles: {quartiles(as_shipped)} (output streamed at 1 byte, as shipped); "
          f"{quartiles(out16)} (at 2 bytes)")

    print("\nMoE expert GEMMs: model (E x gemm_time) / measured grouped GEMM, and the loop of E calls")
    print(f"{'model':16s} {'gemm':4s} {'E':>3s} " + " ".join(f"{t:>6d}" for t in (128, 256, 512, 1024, 2048, 4096))
          + "   tokens per expert")
    host = []
    by_key: dict[tuple, dict[int, dict]] = {}
    for r in doc["grouped_gemm"]:
        by_key.setdefault((r["model"], r["gemm"], r["local_experts"], r["k"], r["n"]), {})[r["tokens_per_expert"]] = r
    for (name, which, e, k, n), per in by_key.items():
        cells = []
        for tpe, r in sorted(per.items()):
            model_s = e * gemm.gemm_time(tpe, k, n, rate, hbm, 2.0)
            cells.append(f"{model_s / r['grouped_s']:6.2f}")
            if r["loop_s"] > 1.5 * r["grouped_s"]:  # host-bound: the GPU work is well below the calls' host time
                host.append(r["loop_s"] / e)
        print(f"{name:16s} {which:4s} {e:3d} " + " ".join(cells))
    print(f"\nhost time per GEMM call where the loop is host-bound ({len(host)} cases): median "
          f"{statistics.median(host) * 1e6:.1f} us, range {min(host) * 1e6:.1f}-{max(host) * 1e6:.1f} us "
          f"(eager PyTorch F.linear from Python; HOST_GEMM_S {HOST_GEMM_S * 1e6:g} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
