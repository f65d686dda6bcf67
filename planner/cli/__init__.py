"""The ``plan3d`` command line (typer + rich), a thin layer over the Python API (``planner.api``).

Exit codes: 0 success, 1 no feasible plan, 2 bad input, 3 a bug. Errors are one line on stderr, never a traceback.

One module per job: ``app`` (the typer app), ``options`` (choices, shared options, defaults), ``output`` (tables,
files, launch configs), and the commands: ``plan_cmd``, ``layout_cmds`` (evaluate, memory, explain),
``validate_cmd``, ``fallback_cmd``, ``sweep_cmd``, ``catalog_cmds`` (models, clusters, schema). Importing them
registers the commands, in the order ``plan3d --help`` lists them.
"""
from __future__ import annotations

import math
import sys

from . import plan_cmd, layout_cmds, validate_cmd, fallback_cmd, sweep_cmd, catalog_cmds  # noqa: F401  registration
from .app import app
from .options import AT_RISK_DEFAULT, HEADROOM_DEFAULT

__all__ = ["AT_RISK_DEFAULT", "HEADROOM_DEFAULT", "app", "main"]


def _nan_message(e) -> str | None:
    """A bounded number option given NaN fails every bound, so click names a bound ("less than or equal to 0.5");
    name the problem instead (None when the value is not NaN)."""
    param = getattr(e, "param", None)
    for flag in getattr(param, "opts", None) or ():
        for i, arg in enumerate(sys.argv):
            value = arg.partition("=")[2] if arg.startswith(f"{flag}=") else (
                sys.argv[i + 1] if arg == flag and i + 1 < len(sys.argv) else None)
            try:
                if value is not None and math.isnan(float(value)):
                    return f"{flag} {value}: must be a finite number"
            except ValueError:
                continue
    return None


def _one_line(text: object) -> str:
    """``text`` on one line (usage errors and loader messages can hold newlines)."""
    return " ".join(str(text).split())


def main() -> None:
    """Console-script entry point: run the app, turning every expected error into one line and an exit code.

    An exception nobody expected is a bug: one line naming it and where it was raised, exit 3 (``PLAN3D_DEBUG=1``
    re-raises it with the traceback)."""
    import os

    from typer.exceptions import Abort, Exit, TyperException

    from cluster_specs import ClusterSpecError
    from model_zoo import ModelSpecError

    from ..errors import NoFeasiblePlan, PlanInputError
    try:
        app(standalone_mode=False, prog_name="plan3d")
    except (PlanInputError, ModelSpecError, ClusterSpecError) as e:
        sys.stderr.write(f"plan3d: error: {_one_line(e)}\n")
        sys.exit(2)
    except NoFeasiblePlan as e:
        sys.stderr.write(f"plan3d: {_one_line(e)}\n")
        sys.exit(1)
    except Abort:
        sys.stderr.write("plan3d: aborted\n")
        sys.exit(130)
    except TyperException as e:  # usage errors: unknown option, bad value, out of range
        if type(e).__name__ == "NoArgsIsHelpError":  # typer vendors click: match the class by name  # bare ``plan3d``: the help text, as ``plan3d --help`` prints it
            sys.stderr.write(e.format_message() + "\n")
        else:
            sys.stderr.write(f"plan3d: error: {_nan_message(e) or _one_line(e.format_message())}\n")
        sys.exit(2)
    except Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # a bug: one line, never a traceback (tests/fuzz counts these)
        if os.environ.get("PLAN3D_DEBUG"):
            raise
        from ..errors import internal_error_line
        sys.stderr.write(internal_error_line(e) + "\n")
        sys.exit(3)


if __name__ == "__main__":  # pragma: no cover
    main()
