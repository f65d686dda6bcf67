"""Time budgets and a progress line for work that plans repeatedly (issue 14: no call runs without bound).

``--objective min-gpus`` re-plans at every GPU count it tries, the search for the nearest feasible change re-plans
for every change, ``--solver enumerate`` evaluates every candidate. Each takes a ``Budget`` (wall seconds; ``None``
= unbounded) and stops, saying so, when it is spent, and reports its steps to a ``Progress``: a rich status line
on stderr while stderr is a terminal, nothing otherwise (so JSON on stdout and captured stderr stay clean and
deterministic).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

#: Wall seconds the repeated planning of one ``plan`` call may take (``plan --time-budget``): min-gpus tries
#: ~20 GPU counts at ~0.1-2 s each, the nearest-change search up to 13 searches.
DEFAULT_BUDGET_S = 60.0


class Budget:
    """A wall-clock allowance that starts when it is made. ``None`` seconds: never spent."""

    def __init__(self, seconds: float | None = DEFAULT_BUDGET_S):
        self.seconds = seconds
        self.start = time.monotonic()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    @property
    def spent(self) -> bool:
        return self.seconds is not None and self.elapsed_s >= self.seconds

    def remaining_s(self) -> float | None:
        return None if self.seconds is None else max(0.0, self.seconds - self.elapsed_s)


#: A progress callback: one line of text describing the step now running.
Progress = Callable[[str], None]


def no_progress(text: str) -> None:
    """The progress callback that shows nothing."""


@contextmanager
def progress_line(title: str, stream=None) -> Iterator[Progress]:
    """A rich status line ``title: <step>`` on ``stream`` (default stderr) while it is a terminal; else no-op."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        yield no_progress
        return
    from rich.console import Console
    console = Console(file=stream)
    t0 = time.monotonic()
    with console.status(f"{title}...") as status:
        def update(text: str) -> None:
            status.update(f"{title}: {text} ({time.monotonic() - t0:.0f} s)")
        yield update
