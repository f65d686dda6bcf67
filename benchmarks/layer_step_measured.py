"""plan3d's per-layer GEMM and attention terms against a one-GPU training step measured on an H200.

``benchmarks/measure_device.py`` section ``layer_step`` (``benchmarks/data/measured_h200_20261204_layer_step.json``,
2026-12-04) ran the forward and backward of two 4-layer stacks in eager PyTorch (BF16, SDPA's FlashAttention-2 as
torchtitan calls it) and profiled the GPU kernel time by class: Llama 3 8B's layer at 8192 tokens, and one TP-8
rank's share of Llama 3 70B's layer at 4096 tokens (8 query heads, 1 KV head, FFN 3584, no communication). For each,
this script prints the model's time on the ``dgx-h200`` cluster (``torchtitan`` framework, micro-batch 1) next to the
measured kernel time per layer:

- weight GEMMs: ``cost_models.gemm.layer_gemms_s``'s forward plus its backward (dgrad and wgrad, each the forward's
  work: Narayanan et al. SC21 Sec. 5.1, as the step-time model charges them);
- fused attention: ``cost_models.attention.attention_core_s`` (forward, backward), which reads the kernel series at
  the call's occupancy and multiplies by ``ATTENTION_TRAINING_SHARE``; the share the step implies is printed beside it.

One board, short steps, no communication: what the ratios show is what a multi-GPU run adds beyond one GPU's kernels
(``ATTENTION_TRAINING_SHARE``'s and ``gemm.KAPPA``'s comments). Nothing here is fitted; the figures are what the
closing notes of issue 9 quote. Run: ``.venv/bin/python benchmarks/layer_step_measured.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

from cluster_specs.loaders import get_cluster
from cost_models.attention import ATTENTION_TRAINING_SHARE, attention_core_s
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.gemm import layer_gemms_s
from model_zoo.loaders import get_model

DATA = Path(__file__).parent / "data" / "measured_h200_20261204_layer_step.json"
#: measured stack -> (plan3d model, tensor parallel size it stands for)
STACKS = {"llama3-8b-layer": ("llama3.1-8b", 1), "llama3-70b-layer-tp8-rank": ("llama3.1-70b", 8)}


def main() -> int:
    doc = json.loads(DATA.read_text())
    cluster = get_cluster("dgx-h200")
    env = doc["environment"]
    print(f"measured: {env['gpu']}, torch {env['torch']}, cuDNN {env['cudnn']}, {env['date_utc']}")
    print(f"{'stack':28s} {'term':10s} {'model ms':>9s} {'measured ms':>12s} {'model/meas':>11s}")
    for rec in doc["layer_step"]:
        name, tp = STACKS[rec["model"]]
        layers = rec["layers"]
        job = TrainingJob(global_batch_size=8, seq_length=rec["seq"])
        par = ParallelConfig(tp=tp, pp=1, dp=8 // tp, micro_batch_size=1, sequence_parallel=False)
        model = get_model(name)
        gemm_model = sum(layer_gemms_s(model, cluster, job, par, 0, "torchtitan")[i] for i in (0, 3))
        gemm_meas = rec["kernel_s_by_class"]["gemm"] / layers
        att = attention_core_s(model, cluster, job, par, "torchtitan")
        kern = rec["attention_kernels_s"]
        att_f = sum(v for k, v in kern.items() if "fwd" in k) / layers
        att_b = sum(kern.values()) / layers - att_f
        rows = (("GEMMs", gemm_model, gemm_meas), ("attn fwd", att[0], att_f), ("attn bwd", att[1], att_b))
        for term, m, t in rows:
            print(f"{rec['model']:28s} {term:10s} {1e3 * m:9.2f} {1e3 * t:12.2f} {m / t:11.2f}")
        share = ATTENTION_TRAINING_SHARE * (att[0] + att[1]) / (att_f + att_b)
        print(f"{'':28s} attention share the step implies: {share:.2f} (model {ATTENTION_TRAINING_SHARE})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
