"""``plan3d explain --timeline``: the simulated schedule picture."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")


def test_explain_timeline_svg_is_written_and_deterministic(run_cli, tmp_path):
    args = ["explain", "--model", "llama3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "2",
            "--global-batch-size", "32", "--seq-length", "4096", "--zero-stage", "1", "--sequence-parallel"]
    a, b = tmp_path / "a.svg", tmp_path / "b.svg"
    r1 = run_cli(*args, "--timeline", str(a))
    r2 = run_cli(*args, "--timeline", str(b))
    assert r1.exit_code == 0 == r2.exit_code and a.exists() and a.read_text().startswith("<?xml")
    assert "interleaved, 4 stages x 2 chunks" in a.read_text()
    assert a.read_bytes() == b.read_bytes()


def test_timeline_png_and_bad_suffix(run_cli, tmp_path):
    base = ["explain", "--model", "llama3.1-8b", "--gpus", "8", "--pp", "4", "--global-batch-size", "16",
            "--seq-length", "2048"]
    png = tmp_path / "t.png"
    r = run_cli(*base, "--timeline", str(png))
    assert r.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    bad = run_cli(*base, "--timeline", str(tmp_path / "t.pdf"))
    assert bad.exit_code == 2 and "--timeline" in bad.stderr and ".svg or .png" in bad.stderr


@pytest.mark.parametrize("schedule,extra,title", [
    ("zb-v", ["--vpp", "2", "--framework", "torchtitan", "--zero-stage", "3"], "zb-v, 4 stages x 2 chunks"),
    ("dualpipev", ["--vpp", "2", "--framework", "torchtitan", "--zero-stage", "3"], "dualpipev, 4 stages x 2 chunks"),
    ("dualpipe", [], "dualpipe, 4 stages x 1 chunks"),
    ("combined-1f1b", ["--vpp", "2", "--ep", "8", "--etp", "1"], "combined-1f1b, 4 stages x 2 chunks"),
])
def test_timeline_draws_each_new_schedule(run_cli, tmp_path, schedule, extra, title):
    model = "mixtral-8x7b" if schedule == "combined-1f1b" else "llama3.1-8b"
    svg = tmp_path / f"{schedule}.svg"
    r = run_cli("explain", "--model", model, "--gpus", "64", "--tp", "2", "--pp", "4", "--sequence-parallel",
                "--global-batch-size", "64", "--seq-length", "2048", "--pipeline-schedule", schedule, *extra,
                "--timeline", str(svg))
    # DualPipe runs in none of the three frameworks: explain exits 1 naming the rule, the picture is still drawn
    assert r.exit_code == (1 if schedule == "dualpipe" else 0), r.stderr
    if schedule == "dualpipe":
        assert "schedule_framework" in r.stderr and "deepseek-ai/DualPipe" in r.stderr
    text = svg.read_text()
    assert title in text
    from cost_models.pipeline import PAIRING_SCHEDULES
    # overlapped forward-backward pairs are outlined in black
    assert ("stroke: #000000; stroke-width: 0.6" in text) == (schedule in PAIRING_SCHEDULES)
