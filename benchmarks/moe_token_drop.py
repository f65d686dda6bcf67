"""Dropless vs drop-and-pad MoE routing: plan3d's step-time model against the Megatron-Bridge archive's pairs.

The Megatron-Bridge performance archive (``docs/performance-summary-archive.md``, NVIDIA-NeMo/Megatron-Bridge commit
4ab94dfad) reports Qwen3-30B-A3B on the same layouts twice: the 25.09 container ran token-drop (Megatron-Bridge
``apply_moe_token_drop``: ``moe_expert_capacity_factor`` 1.0 with ``moe_pad_expert_input_to_capacity``, v0.1.0rc4),
the 25.11 container dropless. Dropless routing syncs the host on the per-expert token counts before the experts;
drop-and-pad does not (Megatron-LM ``token_dispatcher.py``, ``_maybe_dtoh_and_synchronize``), which is what
``cost_models/moe_overhead.moe_host_exposed_s`` charges. The 25.11 rows are dev rows (``plan3d validate``); the 25.09
rows are built here from them (same model, layout and setup, the 25.09 measurement, capacity factor 1.0) and are
not fitted on. The two containers also differ in Transformer Engine version, so the measured ratio bounds what the
sync alone explains.

Prints, per layout: measured and predicted tokens/s/GPU for both routings, and the measured and predicted ratio.

Run: .venv/bin/python benchmarks/moe_token_drop.py
"""
from __future__ import annotations

import copy

from planner.published_rows import load_rows
from planner.validation import validate_row

#: (dev row, 25.09 token-drop tokens/s/GPU from the archive's "25.09 NeMo Container" tables)
PAIRS = (
    ("bridge-2511-h100-qwen3-30b-a3b-fp8cs-16", 10494),  # DGX-H100, 16 GPUs, pp 2 x vp 24, ep 8, mbs 2
    ("bridge-2511-b200-qwen3-30b-a3b-fp8mx-8", 18066),   # DGX-B200, 8 GPUs, ep 8, mbs 1
    ("bridge-2511-gb200-qwen3-30b-a3b-fp8mx-8", 22775),  # DGX-GB200, 8 GPUs, ep 8, mbs 4
)
SOURCE = ("Megatron-Bridge v0.1.0rc4 src/megatron/bridge/training/utils/moe_token_drop.py apply_moe_token_drop "
          "defaults: capacity factor 1.0, pad to capacity")


def token_drop_row(row: dict, tokens_per_s_per_gpu: float) -> dict:
    """``row`` run with drop-and-pad routing (capacity 1.0) and measured at ``tokens_per_s_per_gpu``."""
    r = copy.deepcopy(row)
    r["id"] = row["id"].replace("2511", "2509") + "-tokendrop"
    r["measured"] = {k: None for k in r["measured"]}
    r["measured"]["tokens_per_sec_per_gpu"] = tokens_per_s_per_gpu
    r["setup"] = {**r["setup"], "moe_expert_capacity_factor": 1.0,
                  "sources": {**r["setup"].get("sources", {}), "moe_expert_capacity_factor": SOURCE}}
    return r


def main() -> int:
    rows = {r["id"]: r for r in load_rows(None)}
    print(f"{'layout (dev row)':42s} {'dropless meas':>13s} {'pred':>7s} {'drop meas':>10s} {'pred':>7s} "
          f"{'ratio meas':>10s} {'pred':>5s}")
    for rid, measured in PAIRS:
        a = validate_row(rows[rid], check_feasibility=False)
        b = validate_row(token_drop_row(rows[rid], measured), check_feasibility=False)
        ma, pa = a.measured_tokens_per_s_per_gpu, a.predicted_tokens_per_s_per_gpu
        mb, pb = b.measured_tokens_per_s_per_gpu, b.predicted_tokens_per_s_per_gpu
        print(f"{rid:42s} {ma:13,.0f} {pa:7,.0f} {mb:10,.0f} {pb:7,.0f} {mb / ma:10.2f} {pb / pa:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
