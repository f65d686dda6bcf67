"""Errors the CLI turns into one line on stderr: ``PlanInputError`` exits 2 (bad input), ``NoFeasiblePlan``
exits 1 (the job cannot be placed)."""


class PlanInputError(ValueError):
    """Bad user input; the message names the field and the allowed values."""


class NoFeasiblePlan(RuntimeError):
    """No configuration satisfies the constraints; the message says which binds and by how much."""


def option_error(exc, options: dict[str, str]) -> PlanInputError:
    """A pydantic ``ValidationError`` of an object built from command-line options, as the one-line input error
    naming the option (``options``: field name -> option, e.g. ``seq_length`` -> ``--seq-length``)."""
    e = exc.errors()[0]
    field = ".".join(str(x) for x in e.get("loc", ()))
    name = options.get(field, f"field '{field}'")
    msg = " ".join(str(e.get("msg", "invalid value")).split())
    return PlanInputError(f"{name} {msg.removeprefix('= ')}" if msg.startswith("= ") else f"{name}: {msg}")


class PlanInternalError(RuntimeError):
    """A bug: plan3d produced something it must never produce (e.g. a non-finite number in the plan document).
    The message names the field; ``planner.cli.main`` prints it as an internal error (exit 3)."""


def internal_error_line(exc: BaseException) -> str:
    """One line for an unexpected exception: its type, message and the innermost frame of our code (a bug report)."""
    import traceback
    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = fr.filename.replace("\\", "/").split("/")
        if any(p in ("planner", "cost_models", "model_zoo", "cluster_specs") for p in parts[-3:-1]):
            where = f" at {'/'.join(parts[-2:])}:{fr.lineno}"
            break
    msg = " ".join(str(exc).split())[:300]
    return (f"plan3d: internal error: {type(exc).__name__}: {msg}{where} (a bug; please report it with the "
            f"command line; PLAN3D_DEBUG=1 shows the traceback)")
