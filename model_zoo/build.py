"""A ``ModelSpec`` from a mapping of its fields, every failure one line naming the file (or model) and the field."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import ModelSpecError
from .input_guard import ERROR_TYPE
from .spec import ModelSpec


def _validation_message(where: str, exc: ValidationError) -> str:
    """One line naming the first failing field."""
    errs = exc.errors()
    if not errs:
        return f"{where}: invalid model spec"
    e = errs[0]
    loc = ".".join(str(x) for x in e.get("loc", ()) if x != "__root__")
    msg = str(e.get("msg", "invalid value")).replace("\n", " ")
    msg = msg.removeprefix("Value error, ")
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    if e.get("type") == ERROR_TYPE:  # Plausible: "field 'X' = V is outside [lo, hi] (why)"
        return f"{where}: field '{loc}' {msg}{more}"
    if loc:
        return f"{where}: field '{loc}': {msg}{more}"
    return f"{where}: {msg}{more}"


def spec_from_dict(where: str, data: dict[str, Any]) -> ModelSpec:
    """``ModelSpec(**data)``; a ``ModelSpecError`` naming ``where`` and the first failing field otherwise."""
    try:
        return ModelSpec(**data)
    except ValidationError as exc:
        raise ModelSpecError(_validation_message(where, exc)) from None
    except TypeError as exc:  # e.g. non-mapping moe
        raise ModelSpecError(f"{where}: {exc}") from None
