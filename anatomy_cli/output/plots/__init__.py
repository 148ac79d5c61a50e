"""Pictures for ``--plot FILE``: one module per command, drawn with matplotlib (Agg).

This package's ``__init__`` imports no matplotlib: commands call :func:`check_path`
before the model loads (bad suffix or directory fails fast), and only a command
that was given ``--plot`` imports a picture module (``anatomy_cli.output.plots.trace``,
...), which imports matplotlib. Each picture module has one ``figure(...)``
function that reads the same result object as the table and returns a
``matplotlib.figure.Figure``; :func:`save` writes it and names the file on stderr.

A stdin batch writes one file per prompt: ``PATH`` with ``-1``, ``-2``, ... before
the suffix (``lens.png`` -> ``lens-1.png``, ``lens-2.png``), see :func:`numbered`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.errors import AnatomyError, UsageError

SUFFIXES = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class Caption:
    """What every picture says about itself: the command, the model, the prompt (shortened in the title),
    one line of detail (e.g. ``position 3 = ·very``) and whether the weights are random."""

    command: str
    model: str
    prompt: str | None = None
    detail: str | None = None
    untrained: bool = False

    @classmethod
    def of(cls, command: str, lm: Any, prompt: str | None = None, detail: str | None = None) -> Caption:
        """The caption for a loaded model: its short name (``lm.label``, else ``lm.name``), ``lm.untrained``."""
        return cls(command, getattr(lm, "label", None) or lm.name, prompt, detail, bool(lm.untrained))


def check_path(path: Path | str | None, option: str = "--plot") -> Path | None:
    """Check a ``--plot`` path before anything slow happens; returns it as a Path (None stays None).

    Raises UsageError (exit 2) for a suffix other than .png/.svg/.pdf or a path that is a
    directory; AnatomyError (exit 1) when the directory does not exist or cannot be written.
    Nothing is created or left behind.
    """
    if path is None:
        return None
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        got = f"'{path.suffix}'" if path.suffix else "no suffix"
        raise UsageError(f"{option} {str(path)!r}: the suffix chooses the format and must be "
                         f".png, .svg or .pdf ({got})")
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a directory: give a file name such as {path / 'plot.png'}")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise AnatomyError(f"cannot write {option} {str(path)!r}: the directory {str(folder)!r} {what}")
    if not _writable(folder) or (path.exists() and not os.access(path, os.W_OK)):
        raise AnatomyError(f"cannot write {option} {str(path)!r}: no permission to write there")
    return path


def _writable(folder: Path) -> bool:
    # os.access says yes to root even on read-only mounts and /proc; creating a file is the real test.
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".anatomy-plot-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def numbered(path: Path, index: int | None) -> Path:
    """``PATH`` for one prompt, ``PATH`` with ``-index`` before the suffix for prompt ``index`` of a batch."""
    return path if index is None else path.with_name(f"{path.stem}-{index}{path.suffix}")


def save(fig: Any, path: Path, index: int | None = None) -> Path:
    """Write ``fig`` to ``numbered(path, index)`` in the format its suffix names; one stderr line names it.

    SVG and PDF carry no date and SVG ids come from a fixed salt, so the same input gives the
    same bytes. Raises AnatomyError when the file cannot be written.
    """
    from anatomy_cli.output.plots._base import write

    target = numbered(path, index)
    try:
        write(fig, target)
    except OSError as exc:
        raise AnatomyError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    print(f"wrote {target}", file=sys.stderr)
    return target
