"""Fixtures of the fuzz suite, and its tally handed to the end-of-run report (budget, tally and report:
fuzz_tally.py; printed by tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from .fuzz_tally import REPORTS, TALLY


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


def pytest_sessionfinish(session):
    """Hand this process's tally to the end-of-run summary (``tests/conftest.py``): directly, or under pytest-xdist
    through the worker's ``workeroutput``, which reaches the controller's ``pytest_testnodedown``."""
    if not TALLY.runs:
        return
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["plan3d_fuzz_report"] = TALLY.report()
    else:
        REPORTS.append(TALLY.report())
