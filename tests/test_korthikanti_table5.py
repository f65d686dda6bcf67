"""``evaluate`` with flash attention off and dropout on against Korthikanti et al. 2022 Table 5 (issue 9: <= 3%
mean and <= 6% max error over the eight A100 runs; Calculon, the best open analytic peer, gives 3.65% / 8.87%)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import planner
from model_zoo import get_model
from model_zoo.spec import ModelSpec

DATA = yaml.safe_load((Path(__file__).parent / "data" / "korthikanti22_table5.yaml").read_text())


def _model(name: str) -> ModelSpec:
    m = DATA["models"][name]
    if m.get("zoo"):
        return get_model(m["zoo"])
    h, a = m["hidden_size"], m["num_attention_heads"]
    return ModelSpec(name=name, source=DATA["source"]["transcription"], family="gpt", num_layers=m["num_layers"],
                     hidden_size=h, num_attention_heads=a, num_kv_heads=a, head_dim=h // a, ffn_hidden_size=4 * h,
                     gated_mlp=False, activation="gelu", normalization="layernorm", qkv_bias=True, linear_bias=True,
                     vocab_size=51200, tie_word_embeddings=True, position_embedding="learned",
                     max_position_embeddings=DATA["seq_length"])


def _predict(run: dict, mode: str) -> float:
    doc = planner.evaluate(_model(run["model"]), DATA["cluster"], gpus=run["gpus"],
                           global_batch_size=run["global_batch_size"], seq_length=DATA["seq_length"],
                           precision=DATA["precision"], flash_attention=False, dropout=True, tp=DATA["tp"],
                           pp=run["pp"], vpp=run["vpp"], micro_batch_size=run["micro_batch_size"], zero_stage=0,
                           recompute="full" if mode == "full" else "selective", sequence_parallel=mode != "full")
    plan = doc.plans[0]
    assert plan.feasible, (run["model"], mode, plan.violations)
    return plan.time.step_s


CASES = [(r, mode) for r in DATA["runs"] for mode in ("full", "selective")]
#: per-run ceiling of the issue (6%); the mean ceiling (3%) is asserted over all eight below
MAX_ERROR = 0.06
MAX_MEAN_ERROR = 0.03


@pytest.mark.parametrize("run,mode", CASES, ids=[f"{r['model']}-{m}" for r, m in CASES])
def test_each_table5_run_within_six_percent(run, mode):
    measured = run[f"{mode}_s"]
    assert _predict(run, mode) == pytest.approx(measured, rel=MAX_ERROR)


def test_table5_mean_error_within_three_percent():
    errors = [abs(_predict(r, mode) / r[f"{mode}_s"] - 1) for r, mode in CASES]
    assert sum(errors) / len(errors) <= MAX_MEAN_ERROR, [f"{e:.3f}" for e in errors]

