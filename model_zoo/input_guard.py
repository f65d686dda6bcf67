"""Guards on input files and the quantities in them (issue 14: no traceback, no hang, no NaN in a plan).

* ``Plausible(lo, hi, why)``: ``Annotated[float, Plausible(...)]`` on a spec field. A value that parses but cannot
  describe a real model or machine (a bandwidth of 1e-297 bytes/s, NaN, 1e400) is refused with one line,
  ``field 'X' = V is outside [lo, hi] (why)``, instead of reaching the cost models, where it would come out as NaN,
  Infinity or a plan nobody can run. Each field states its own bound and where the bound comes from.
* ``read_text``: a file's text, refused in one line naming the file when it cannot be read, is larger than the
  reader's limit or is not UTF-8 (naming the line of the first bad byte).
* ``parse``: JSON or YAML text to Python values; a file nested too deeply, a number too long to read, or an
  alias expansion too large (a "billion laughs" YAML) is one line naming the file and the field.

This file is the same in ``model_zoo/input_guard.py`` and ``cluster_specs/input_guard.py`` (the zoo and the specs
import nothing of each other nor of the rest of plan3d); ``tests/test_hostile_input.py`` keeps the two identical.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic_core import PydanticCustomError, core_schema

#: pydantic error type of an out-of-range value (the loaders print it as ``field 'X' = V is outside ...``)
ERROR_TYPE = "plausible_range"
#: Nesting depth and number of values in one input file: the real ones (HF config.json, cluster YAML, model YAML)
#: are at most 4 levels deep with a few hundred values; the dataset of published runs 5 levels, ~20,000 values.
MAX_DEPTH = 32
MAX_VALUES = 200_000
#: Integers longer than any float (1.8e308): no quantity of plan3d needs one; they overflow float arithmetic.
MAX_INT_BITS = 1024


def fmt_number(v: Any) -> str:
    """A number as an error message quotes it: an int of up to 18 digits as typed, a longer one or a float to 6
    significant digits (ints too large for a float included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return repr(v)[:40]
    if isinstance(v, int) and abs(v) < 10**18:
        return str(v)
    if isinstance(v, int):
        return format(Decimal(v), ".6g") if v.bit_length() <= 4 * MAX_INT_BITS else f"an integer of {v.bit_length()} bits"
    return f"{v:.6g}"


@dataclass(frozen=True)
class Plausible:
    """Closed range ``[lo, hi]`` of a finite value (units of the field), with the reason for its bounds."""

    lo: float
    hi: float
    why: str

    def check(self, v: Any) -> Any:
        if v is None:
            return v
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (isinstance(v, int) or math.isfinite(v))
        if not ok or not self.lo <= v <= self.hi:
            raise PydanticCustomError(ERROR_TYPE, "= {value} is outside [{lo}, {hi}] ({why})",
                                      {"value": fmt_number(v), "lo": fmt_number(self.lo), "hi": fmt_number(self.hi),
                                       "why": self.why})
        return v

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        # before pydantic's lax conversion, which reads YAML ``true`` as the integer 1
        return core_schema.no_info_before_validator_function(
            self._not_bool, core_schema.no_info_after_validator_function(self.check, handler(source)))

    def _not_bool(self, v: Any) -> Any:
        if isinstance(v, bool):
            raise PydanticCustomError(ERROR_TYPE, "= {value} is not a number (a number in [{lo}, {hi}]: {why})",
                                      {"value": str(v).lower(), "lo": fmt_number(self.lo), "hi": fmt_number(self.hi),
                                       "why": self.why})
        return v

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        out = handler(schema)
        out.update(minimum=self.lo, maximum=self.hi)
        return out

    def message(self, field: str, v: Any) -> str | None:
        """``None`` if ``v`` is inside, else the one-line ``field 'X' = V is outside [lo, hi] (why)``."""
        try:
            self.check(v)
        except PydanticCustomError as e:
            return f"field '{field}' {e.message()}"
        return None


def read_text(path: Path, max_bytes: int, error: type[Exception], what: str = "file") -> str:
    """The UTF-8 text of ``path`` (at most ``max_bytes`` bytes), else ``error`` with one line naming the file."""
    try:
        if Path(path).is_dir():
            raise error(f"{what} '{path}' is a directory; give the file")
        if not Path(path).is_file():  # a FIFO or a device would block or never end
            raise error(f"{what} '{path}': cannot read: no such file" if not Path(path).exists() else
                        f"{what} '{path}' is not a regular file")
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{what} '{path}': cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise error(f"{what} '{path}': larger than {max_bytes // 2**20} MiB; a real one is a few KiB (is it the "
                    f"right file?)") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{what} '{path}': line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                    f"{e.start}: {e.reason}); save it as UTF-8") from None


class _DuplicateKey(Exception):
    """A JSON object names one key twice (``_unique_keys``)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` ``object_pairs_hook``: the object as a dict, ``_DuplicateKey`` if a key repeats (the standard
    parser keeps the last value silently; a config.json with two ``hidden_size`` is another model)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def parse(text: str, fmt: str, where: str, error: type[Exception]) -> Any:
    """``text`` parsed as ``json`` or ``yaml`` (safe_load), then checked by ``check_shape``. JSON syntax errors and
    YAML errors are left to the caller (they name line and column); the rest is ``error`` naming ``where``."""
    import yaml
    try:  # libyaml's loader where PyYAML was built with it (4x faster; it caps nesting at 1,000 levels itself)
        data = (json.loads(text, object_pairs_hook=_unique_keys) if fmt == "json" else
                yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except _DuplicateKey as e:
        raise error(f"{where}: field '{str(e.args[0])[:80]}' is given twice; json.loads would keep the last "
                    f"silently, so say which one is meant") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    except (json.JSONDecodeError, yaml.YAMLError):
        raise
    except ValueError as e:  # an integer literal longer than Python's int-conversion limit (4300 digits)
        raise error(f"{where}: a number too long to read ({' '.join(str(e).split())[:120]})") from None
    check_shape(data, where, error)
    return data


def check_shape(data: Any, where: str, error: type[Exception]) -> None:
    """``error`` naming the field if ``data`` nests deeper than MAX_DEPTH, holds more than MAX_VALUES values
    (counting every expansion of a YAML alias) or an integer longer than MAX_INT_BITS bits."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    n = 0
    while stack:
        x, depth, field = stack.pop()
        n += 1
        if n > MAX_VALUES:
            raise error(f"{where}: more than {MAX_VALUES:,} values (YAML aliases expanding?)")
        if depth > MAX_DEPTH:
            raise error(f"{where}: field '{field[:80]}' is nested more than {MAX_DEPTH} levels deep")
        if isinstance(x, dict):
            stack.extend((v, depth + 1, f"{field}.{k}" if field else str(k)) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, depth + 1, f"{field}[{i}]") for i, v in enumerate(x))
        elif isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > MAX_INT_BITS:
            raise error(f"{where}: field '{field[:80]}' = {fmt_number(x)} is outside every plausible range "
                        f"(an integer larger than any float)")
