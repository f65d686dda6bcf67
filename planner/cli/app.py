"""The typer application every ``plan3d`` command registers on, and its root options (``--version``)."""
from __future__ import annotations

import sys
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="plan3d: plan DP x PP x TP x CP x EP layouts for large-transformer training.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("plan3d")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
            v = "unknown"
        sys.stdout.write(f"plan3d {v}\n")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """plan3d: plan DP x PP x TP x CP x EP layouts for large-transformer training."""

