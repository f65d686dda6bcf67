"""Refit the step-time model's free parameters on the dev rows (coordinate descent on the mean group MAPE).

Prints the fitted values; they are then written by hand, with this provenance, into cost_models/step_time.py and the
cluster YAMLs' calibration (TT500: grand-teton-h100's power_limit_clock_fraction). The Omni-Path bus efficiency of
jean-zay-a100 is no longer fitted: it is the measured NCCL figure (cluster YAML).
Run: .venv/bin/python benchmarks/fit_step_time.py
"""
from __future__ import annotations

import cost_models.step_time as st
from cluster_specs.spec import ClusterSpec
from planner.validation import load_rows, validate_row, ValidationReport

ROWS = load_rows()
ATTN = {"H100": 0.5, "B200": 0.5, "GB200": 0.5, "A100": 0.5}
_orig_attn = st._attn_eff


def _attn(cluster):
    g = cluster.gpu.name.upper()
    for k in ("GB200", "B200", "H100", "H200", "A100"):
        if k in g:
            return ATTN["H100" if k == "H200" else k] * cluster.clock_fraction
    return _orig_attn(cluster)


st._attn_eff = _attn

#: calibration.power_limit_clock_fraction of the power-capped clusters (grand-teton-h100), swept by TT500
CLOCK = {"capped": 0.825}
ClusterSpec.clock_fraction = property(
    lambda c: CLOCK["capped"] if (c.calibration.power_limit_clock_fraction or 1.0) < 1 else 1.0)

PARAMS = {
    "KAPPA": (lambda v: setattr(st, "KAPPA", v), [1.5, 2, 2.5, 3, 3.5, 4, 5]),
    "PASS_MEG": (lambda v: st.ELEMENTWISE_PASSES.update(megatron=v, nemo=v), [2, 4, 6, 8, 12]),
    "PASS_DS": (lambda v: st.ELEMENTWISE_PASSES.update(deepspeed=v), [8, 12, 16, 24, 32]),
    "PASS_TT": (lambda v: st.ELEMENTWISE_PASSES.update(torchtitan=v), [16, 24, 32, 48, 64]),
    "PASS_TTC": (lambda v: st.ELEMENTWISE_PASSES.update(torchtitan_compile=v), [2, 4, 6, 8, 12]),
    "TP_OVL": (lambda v: st.TP_OVERLAP_EXPOSED.update(megatron=v, nemo=v), [0.0, 0.15, 0.3, 0.5]),
    "TT_TP": (lambda v: st.TP_OVERLAP_EXPOSED.update(torchtitan=v), [0.0, 0.15, 0.3, 0.5, 0.7]),
    "TT_EFF": (lambda v: st.FRAMEWORK_COMPUTE_EFFICIENCY.update(torchtitan=v, torchtitan_compile=v),
               [0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 1.0]),
    "EP_OVL": (lambda v: setattr(st, "EP_OVERLAP_EXPOSED", v), [0.0, 0.2, 0.4, 0.5, 0.6, 1.0]),
    "ATT_S0": (lambda v: setattr(st, "ATTN_HALF_SEQ", v), [0, 512, 1024, 2048, 4096]),
    "MOE_EXP": (lambda v: st.MOE_EXPERT_HOST_S.update(mx=v), [0, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.5e-3, 0.7e-3]),
    "MOE_BF16": (lambda v: st.MOE_EXPERT_HOST_S.update(bf16=v), [0, 0.1e-3, 0.2e-3, 0.4e-3]),
    "MOE_CS": (lambda v: st.MOE_EXPERT_HOST_S.update(cs=v), [0.4e-3, 0.8e-3, 1.0e-3, 1.2e-3, 1.4e-3, 1.6e-3, 2e-3]),
    "MOE_TOK": (lambda v: setattr(st, "MOE_TOKEN_COPY_S", v), [0, 1e-8, 2e-8, 3e-8, 5e-8]),
    "UNF": (lambda v: setattr(st, "UNFUSED_SCORE_PASSES", v), [4, 6, 8, 10, 12]),
    "ATT_H100": (lambda v: ATTN.update(H100=v), [0.28, 0.3, 0.32, 0.34, 0.37, 0.4, 0.44, 0.48]),
    "ATT_B200": (lambda v: ATTN.update(B200=v, GB200=v), [0.3, 0.32, 0.35, 0.38, 0.42, 0.46, 0.5, 0.55]),
    "TT500": (lambda v: CLOCK.update(capped=v), [0.65, 0.7, 0.75, 0.8, 0.825, 0.85, 0.9, 1.0]),
}


def score() -> tuple[float, float, dict]:
    rep = ValidationReport([validate_row(r, check_feasibility=False) for r in ROWS])
    g = rep.group_mape()
    return sum(m for _, m in g.values()) / len(g) + 0.5 * rep.mape, rep.mape, g


if __name__ == "__main__":
    import sys
    cur = {"KAPPA": 2, "PASS_MEG": 12, "PASS_DS": 24, "PASS_TT": 64, "PASS_TTC": 4, "TP_OVL": 0.0, "TT_TP": 0.15,
           "TT_EFF": 0.82, "EP_OVL": 0.6, "ATT_S0": 512, "MOE_EXP": 0.0004, "MOE_BF16": 0.0, "MOE_CS": 0.0012,
           "MOE_TOK": 2e-8, "UNF": 8, "ATT_H100": 0.3, "ATT_B200": 0.38, "TT500": 0.825}
    for k, v in cur.items():
        PARAMS[k][0](v)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    for rnd in range(rounds):
        for name, (setter, grid) in PARAMS.items():
            best = None
            for v in sorted(set(grid + [cur[name]])):
                setter(v)
                s = score()[0]
                if best is None or s < best[0]:
                    best = (s, v)
            cur[name] = best[1]
            setter(best[1])
            print(rnd, name, best[1], round(best[0], 2), flush=True)
    s, mape, g = score()
    print("fitted", cur)
    print("overall MAPE", round(mape, 2), {k: (n, round(m, 1)) for k, (n, m) in g.items()})
