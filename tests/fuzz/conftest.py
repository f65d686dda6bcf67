"""Fixtures and the end-of-run report of the fuzz suite (budget and tally: fuzz_tally.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .fuzz_tally import FUZZ_N, SHARD, SHARDS, SHARES, TALLY


@pytest.fixture(scope="session")
def scratch():
    """The hostile files and every generated input, in a directory of its own (pytest's numbered temporary
    directories are shared with other runs and rotated under a long run); removed at the end."""
    import shutil
    import tempfile

    from .fuzz_strategies import Scratch
    root = Path(tempfile.mkdtemp(prefix="plan3d-fuzz-"))
    yield Scratch(root)
    shutil.rmtree(root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if not TALLY.runs:
        return
    tr = terminalreporter
    shard = f", shard {SHARD}/{SHARDS}" if SHARDS > 1 else ""
    tr.section(f"plan3d fuzz: {sum(TALLY.runs.values())} inputs (PLAN3D_FUZZ_N={FUZZ_N}{shard})")
    for g in SHARES:
        if g in TALLY.runs:
            n = len(TALLY.findings[g])
            tr.write_line(f"{g:14s} {TALLY.runs[g]:6d} inputs, {n} findings")
            if n:
                tr.write_line(TALLY.summary(g))
    if TALLY.memory:
        tr.write_line("peak memory grew most during (MiB):")
        for mib, a in TALLY.memory[:5]:
            tr.write_line(f"  {mib:7d}  plan3d {' '.join(a)[:200]}")
    tr.write_line("slowest inputs (wall s / CPU s):")
    for w, c, g, a, _ in TALLY.slowest[:10]:
        tr.write_line(f"  {w:7.2f} {c:7.2f}  {g:13s} plan3d {' '.join(a)[:200]}")
    path = Path(os.environ.get("PLAN3D_FUZZ_REPORT", Path(tr.config.rootpath) / ".pytest_cache"
                               / "plan3d_fuzz_report.json"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(TALLY.report(), indent=1) + "\n")
    except OSError:
        pass
