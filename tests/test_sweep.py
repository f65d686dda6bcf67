"""planner.sweep / plan3d sweep: grid order, deterministic rows, JSONL + CSV + plot, errors on one line."""
from __future__ import annotations

import csv
import io
import json
import sys

import pytest

import planner
from planner.errors import PlanInputError
from planner.sweeps import COLUMNS, Grid, load_grid, scenarios, sweep, to_csv, to_jsonl

GRID = {"models": ["llama3.1-8b", "mixtral-8x7b"], "clusters": ["dgx-h100"], "gpus": [8, 12, 16],
        "global_batch_sizes": [256], "seq_lengths": [4096]}


@pytest.fixture(scope="module")
def rows_serial():
    return sweep(GRID, max_workers=1)


def test_grid_order_and_count():
    g = load_grid({**GRID, "seq_lengths": [2048, 4096], "objectives": ["throughput", "headroom"]})
    sc = scenarios(g)
    assert len(sc) == g.num_scenarios == 2 * 1 * 3 * 1 * 2 * 2
    assert [s.index for s in sc] == list(range(len(sc)))
    assert (sc[0].model, sc[0].gpus, sc[0].seq_length, sc[0].objective) == ("llama3.1-8b", 8, 2048, "throughput")
    assert (sc[1].objective, sc[2].seq_length) == ("headroom", 4096)  # objectives vary fastest
    assert sc[-1].model == "mixtral-8x7b"


def test_rows_match_plan(rows_serial):
    r = rows_serial[0]
    doc = planner.plan("llama3.1-8b", "dgx-h100", gpus=8, global_batch_size=256, seq_length=4096, top_k=1)
    p = doc.plans[0]
    assert r.status == "ok" and (r.tp, r.pp, r.dp, r.micro_batch_size) == (
        p.parallel.tp, p.parallel.pp, p.parallel.dp, p.parallel.micro_batch_size)
    assert r.step_s == p.time.step_s and r.mfu == p.throughput.mfu and r.peak_bytes == p.memory.peak_bytes
    # cost proxy: GPU-seconds per token -> GPU-hours per 1e9 tokens
    assert r.gpu_hours_per_billion_tokens == pytest.approx(8 * p.time.step_s / (256 * 4096) * 1e9 / 3600, rel=1e-5)
    statuses = [x.status for x in rows_serial]
    assert statuses == ["ok", "error", "ok", "infeasible", "error", "ok"]
    assert "not a multiple of the node size" in rows_serial[1].reason
    assert rows_serial[3].reason.startswith("no feasible plan") and "memory binds" in rows_serial[3].reason


def test_process_pool_is_deterministic(rows_serial):
    pooled = sweep(GRID, max_workers=2)
    assert to_jsonl(pooled) == to_jsonl(rows_serial)
    assert to_csv(pooled) == to_csv(rows_serial)


def test_jsonl_and_csv(rows_serial):
    lines = to_jsonl(rows_serial).splitlines()
    assert len(lines) == 6 and list(json.loads(lines[0])) == list(COLUMNS)
    table = list(csv.DictReader(io.StringIO(to_csv(rows_serial))))
    assert len(table) == 6 and table[1]["tp"] == "" and table[0]["model"] == "llama3.1-8b"


@pytest.mark.parametrize("grid,says", [
    ({"clusters": ["dgx-h100"], "gpus": [8]}, "grid: models: Field required"),
    ({**GRID, "objectives": ["fastest"]}, "grid: objectives.0"),
    ({**GRID, "gpus": [0]}, "grid: gpus: must be positive integers"),
    ({**GRID, "seq_lengths": [True]}, "grid: seq_lengths: must be positive integers"),  # not length 1
    ({**GRID, "models": [""]}, "grid: models: names must not be empty"),
    ({**GRID, "tp": 2}, "grid: tp: Extra inputs are not permitted"),
    ({**GRID, "objectives": ["min-gpus"]}, "grid: objective min-gpus needs exactly one of"),
])
def test_bad_grid_one_line(grid, says):
    with pytest.raises(PlanInputError, match=says):
        load_grid(grid)


def test_min_gpus_rows():
    rows = sweep({"models": ["llama3.1-8b"], "clusters": ["dgx-h100"], "gpus": [64], "global_batch_sizes": [256],
                  "objectives": ["min-gpus"], "target_step_s": 20.0}, max_workers=1)
    doc = planner.plan("llama3.1-8b", "dgx-h100", gpus=64, global_batch_size=256, objective="min-gpus",
                       target_step_s=20.0, top_k=1)
    assert rows[0].status == "ok" and rows[0].num_gpus == doc.input.cluster.num_gpus < 64


def test_scalars_become_lists():
    g = Grid(models="llama3.1-8b", clusters="dgx-h100", gpus=8)
    assert g.models == ["llama3.1-8b"] and g.gpus == [8]


def test_unknown_model_is_an_input_error():
    from model_zoo import ModelSpecError
    with pytest.raises(ModelSpecError, match="unknown model 'no-such-model'"):
        sweep({**GRID, "models": ["no-such-model"]}, max_workers=1)


def test_ray_missing_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed (CI does not install ray)
    with pytest.raises(PlanInputError, match=r"--executor ray needs Ray: pip install 'plan3d\[ray\]'"):
        sweep(GRID, executor="ray")


def test_cli_sweep_writes_files(tmp_path, run_cli):
    pytest.importorskip("matplotlib")
    grid = tmp_path / "grid.yaml"
    grid.write_text("models: [llama3.1-8b]\nclusters: [dgx-h100, dgx-b200]\ngpus: [8, 16]\n"
                    "global_batch_sizes: [128]\n")
    r = run_cli("sweep", str(grid), "--output", str(tmp_path / "out"), "--plot", "--workers", "1")
    assert r.exit_code == 0, r.stderr
    out = tmp_path / "out"
    assert r.stdout.split() == [str(out / "sweep.jsonl"), str(out / "sweep.csv"), str(out / "sweep.png")]
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "sweep.jsonl").read_text().splitlines()) == 4
    assert "4 scenarios, 4 planned" in r.stderr


def test_cli_sweep_errors(tmp_path, run_cli):
    r = run_cli("sweep", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and "cannot read" in r.stderr and r.stderr.count("\n") == 1
    grid = tmp_path / "g.yaml"
    grid.write_text("models: [llama3.1-8b]\nclusters: [dgx-h100]\ngpus: [8]\n")
    r = run_cli("sweep", str(grid), "--plot")
    assert r.exit_code == 2 and "--plot writes sweep.png" in r.stderr
    r = run_cli("sweep", str(grid), "--executor", "dask")
    assert r.exit_code == 2 and "--executor dask: must be one of process, ray" in r.stderr


def test_cli_jsonl_equals_api(tmp_path, run_cli, rows_serial):
    import yaml
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    r = run_cli("sweep", str(grid), "--workers", "2")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == to_jsonl(rows_serial)
    assert "6 scenarios, 3 planned, 3 infeasible or invalid" in r.stderr


def test_planner_sweep_stays_the_function():
    """``planner.sweep(grid)`` (README) raised "'module' object is not callable" once the submodule of the same name
    had been imported (by the CLI or a first call): the module is ``planner.sweeps`` now."""
    import planner
    import planner.sweeps  # noqa: F401 (what the CLI and a first call import)
    # (the API wraps its functions to take numpy scalars: the function is the wrapper's __wrapped__)
    assert callable(planner.sweep) and planner.sweep.__wrapped__ is planner.sweeps.sweep
