"""Shared test helpers: run the real CLI entry point in-process and capture its output and exit code."""
from __future__ import annotations

import json
import sys
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
