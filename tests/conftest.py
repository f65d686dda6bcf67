"""Shared test helpers: run the real CLI entry point in-process and capture its output and exit code; say which
optional extras are missing (report header) and why tests were skipped, one line per reason, and the fuzz suite's
tally (terminal summary; under pytest-xdist the workers' tallies reach the controller in ``pytest_testnodedown``)."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """``run_cli("plan", "--format", "json")`` -> CliResult, through ``planner.cli.main`` (the console script)."""
    from planner.cli import main

    def _run(*args: str) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["plan3d", *args])
        code = 0
        try:
            main()
        except SystemExit as e:  # main() exits non-zero on errors
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return _run


#: Optional packages -> (the pip extra that installs them, the tests they turn on). README "Tests and extras".
EXTRAS = {
    "deepspeed": ("validators", "DeepSpeed's own DeepSpeedConfig on every emitted ds_config (test_emit_validators, "
                                "test_memory)"),
    "megatron.core": ("validators", "megatron-core's own argument and TransformerConfig checks (test_emit_validators, "
                                    "test_emit_model_settings, test_recompute)"),
    "torchtitan": ("none: pip install torchtitan==0.2.2 triton", "torchtitan's own JobConfig parsing "
                                                                 "(test_emit_validators)"),
    "matplotlib": ("plot", "memory, timeline and sweep plots (test_memory_cli, test_pipeline_timeline, test_sweep)"),
}


def _missing() -> list[tuple[str, str, str]]:
    out = []
    for mod, (extra, what) in EXTRAS.items():
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):  # a parent package missing
            found = False
        if not found:
            out.append((mod, extra, what))
    return out


def pytest_report_header(config):
    missing = _missing()
    if not missing:
        return "plan3d extras: all optional test dependencies installed"
    return ["plan3d extras missing (their tests skip): " + "; ".join(
        f"{mod} [extra: {extra}] -> {what}" for mod, extra, what in missing)]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist, on the controller: keep the fuzz tally a worker sent (``tests/fuzz/conftest.py``)."""
    report = getattr(node, "workeroutput", {}).get("plan3d_fuzz_report")
    if report is not None:
        from fuzz.fuzz_tally import REPORTS
        REPORTS.append(report)


def _fuzz_summary(terminalreporter) -> None:
    """The fuzz suite's tally (``tests/fuzz/fuzz_tally.py``), printed and written to ``PLAN3D_FUZZ_REPORT``
    (default ``.pytest_cache/plan3d_fuzz_report.json``) for ``benchmarks/bench_fuzz_slowest.py``."""
    tally = sys.modules.get("fuzz.fuzz_tally")
    if tally is None or not tally.REPORTS:
        return
    report = tally.merged_report(tally.REPORTS)
    lines = tally.summary_lines(report)
    terminalreporter.section(lines[0])
    for line in lines[1:]:
        terminalreporter.write_line(line)
    path = Path(os.environ.get("PLAN3D_FUZZ_REPORT", Path(terminalreporter.config.rootpath) / ".pytest_cache"
                               / "plan3d_fuzz_report.json"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
    except OSError:
        pass


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The fuzz suite's tally (``_fuzz_summary``); then one line per skip reason with its count (pytest -q prints
    none), so a skipped group never goes unseen."""
    _fuzz_summary(terminalreporter)
    reasons: Counter[str] = Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        lr = rep.longrepr
        reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    terminalreporter.section("skipped tests by reason (README: Tests and extras)", sep="-")
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:5d}  {reason}")
    for mod, extra, what in _missing():
        terminalreporter.write_line(f"missing {mod} [extra: {extra}]: {what}")


@pytest.fixture
def no_matplotlib(monkeypatch):
    """``import matplotlib`` fails, as on an install without the ``plot`` extra."""
    import builtins
    real_import = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
