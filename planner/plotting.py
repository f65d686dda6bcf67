"""The pictures' shared plumbing (``plot`` extra): the file suffix, a headless deterministic pyplot, and saving with
one-line errors. matplotlib is imported only when a picture is drawn."""
from __future__ import annotations

from pathlib import Path

from .errors import PlanInputError


def picture_path(option: str, path: str | Path) -> tuple[Path, str]:
    """``path`` and its format (``png`` or ``svg``); ``PlanInputError`` naming ``option`` otherwise."""
    p = Path(path)
    fmt = p.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png"):
        raise PlanInputError(f"{option} {p}: file must end in .svg or .png")
    return p, fmt


def require_matplotlib(option: str) -> None:
    """The one check that the ``plot`` extra (matplotlib) is installed: a one-line ``PlanInputError`` naming
    ``option`` otherwise. The commands call it before their work (a sweep, a search), so a missing extra fails at
    once rather than after minutes of planning; every drawing function calls it too."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlanInputError(f"{option} needs matplotlib: pip install 'plan3d[plot]'") from None


def pyplot(option: str):
    """``matplotlib.pyplot`` on the Agg backend with deterministic SVG element ids (same input, same bytes)."""
    require_matplotlib(option)
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "plan3d"
    import matplotlib.pyplot as plt
    return plt


def save(fig, path: Path, fmt: str, option: str) -> Path:
    """Write ``fig`` to ``path`` (no date in SVG metadata) and close it; an OS error is ``PlanInputError``."""
    import matplotlib.pyplot as plt
    try:
        fig.savefig(path, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    except OSError as e:
        raise PlanInputError(f"{option} {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return path
