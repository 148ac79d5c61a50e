"""Pictures for ``--plot FILE``: one module per command, drawn with matplotlib (Agg).

This package's ``__init__`` imports no matplotlib: commands call :func:`check_path`
before the model loads (bad suffix or directory fails fast), and only a command
that was given ``--plot`` imports a picture module (``anatomy_cli.output.plots.trace``,
...), which imports matplotlib. Each picture module has one ``figure(...)``
function that reads the same result object as the table and returns a
``matplotlib.figure.Figure``; :func:`save` writes it and names the file on stderr.

``FILE.html`` is an interactive page drawn with plotly (:mod:`anatomy_cli.output.html`), and no
matplotlib is imported for it: :func:`draw` imports ``anatomy_cli.output.html.<command>`` for
``.html`` and ``anatomy_cli.output.plots.<command>`` otherwise, both with a ``figure(...)`` of the
same arguments. A command whose HTML module does not exist yet still writes a page: :func:`save`
given a matplotlib figure and an ``.html`` path embeds the PNG (no hover values) and says so.

A stdin batch writes one file per prompt: ``PATH`` with ``-1``, ``-2``, ... before
the suffix (``lens.png`` -> ``lens-1.png``, ``lens-2.png``), see :func:`numbered`.
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import overload

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.output import html
from anatomy_cli.output import sink
from anatomy_cli.output.plots.caption import Caption  # noqa: F401  (the package's name)
from anatomy_cli.tasks._checks import writable

if TYPE_CHECKING:
    from types import ModuleType

    from matplotlib.figure import Figure

    from anatomy_cli.output.html import Page

SUFFIXES = (".png", ".svg", ".pdf", ".html")


@overload
def check_path(path: None, option: str = ..., made: Path | None = ...) -> None: ...
@overload
def check_path(path: Path | str, option: str = ..., made: Path | None = ...) -> Path: ...
@overload
def check_path(path: Path | str | None, option: str = ..., made: Path | None = ...) -> Path | None: ...


def check_path(path: Path | str | None, option: str = "--plot", made: Path | None = None) -> Path | None:
    """Check a ``--plot`` path before anything slow happens; returns it as a Path (None stays None).

    Raises UsageError (exit 2) for a suffix other than .png/.svg/.pdf or a path that is a
    directory; AnatomyError (exit 1) when the directory does not exist or cannot be written.
    ``made``: a folder the command creates before the picture is written (its ``--out DIR``); a path whose
    folder does not exist yet passes when that folder is ``made`` or inside it (:func:`make_folder` creates it).
    Nothing is created or left behind.
    """
    if path is None:
        return None
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        got = f"'{path.suffix}'" if path.suffix else "no suffix"
        raise UsageError(f"{option} {str(path)!r}: the suffix chooses the format and must be "
                         f".png, .svg, .pdf or .html ({got})")
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a directory: give a file name such as {path / 'plot.png'}")
    folder = path.parent
    if made is not None and not folder.exists() and _inside(folder, Path(made)):
        return path
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise AnatomyError(f"cannot write {option} {str(path)!r}: the directory {str(folder)!r} {what}")
    if not writable(folder) or (path.exists() and not os.access(path, os.W_OK)):
        raise AnatomyError(f"cannot write {option} {str(path)!r}: no permission to write there")
    return path


def _inside(folder: Path, parent: Path) -> bool:
    folder, parent = folder.absolute(), parent.absolute()
    return folder == parent or parent in folder.parents


def make_folder(path: Path) -> Path:
    """``path``'s folder created where it does not exist yet (a picture inside a fresh ``--out DIR``, as
    :func:`check_path` let through); returns ``path``. AnatomyError when it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnatomyError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    return path


def numbered(path: Path, index: int | None) -> Path:
    """``PATH`` for one prompt, ``PATH`` with ``-index`` before the suffix for prompt ``index`` of a batch."""
    return path if index is None else path.with_name(f"{path.stem}-{index}{path.suffix}")


def is_html(path: Path | str | None) -> bool:
    """True when ``path`` asks for an interactive HTML page (suffix ``.html``)."""
    return path is not None and Path(path).suffix.lower() == ".html"


def module(command: str, path: Path) -> ModuleType:
    """The picture module of ``command`` for ``path``'s format: ``anatomy_cli.output.html.<command>`` for
    ``.html``, else ``anatomy_cli.output.plots.<command>``; a command with no HTML module (``attribute``) draws
    its matplotlib picture for ``.html`` too (:func:`save` puts it in a page as a PNG)."""
    if is_html(path) and importlib.util.find_spec(f"anatomy_cli.output.html.{command}") is not None:
        return importlib.import_module(f"anatomy_cli.output.html.{command}")
    return importlib.import_module(f"anatomy_cli.output.plots.{command}")


def draw(command: str, path: Path, index: int | None, *args: object, **kwargs: object) -> Path:
    """``save(module(command, path).figure(*args, **kwargs), path, index)``: the picture of ``command``
    in the format of ``path``'s suffix. Returns the file written."""
    return save(module(command, path).figure(*args, **kwargs), path, index)


def save(fig: Any, path: Path, index: int | None = None) -> Path:
    """Write ``fig`` to ``numbered(path, index)`` in the format its suffix names; one stderr line names it.

    ``fig`` is a matplotlib Figure or, for ``.html``, an :class:`anatomy_cli.output.html.Page` (a
    matplotlib Figure with an ``.html`` path is embedded as a PNG in a page). SVG and PDF carry no
    date and SVG ids come from a fixed salt, so the same input gives the same bytes. Raises
    AnatomyError when the file cannot be written.
    """
    target = numbered(path, index)
    try:
        if is_html(target):
            _page(fig).write(target)
        else:
            from anatomy_cli.output.plots._base import write

            write(fig, target)
    except OSError as exc:
        raise AnatomyError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    sink.wrote(target)
    return target


def _page(fig: Figure | Page) -> Page:
    """A Page as it is; a matplotlib Figure (a command without an HTML module) as a page around its PNG."""
    if isinstance(fig, html.Page):
        return fig
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    suptitle = getattr(fig, "_suptitle", None)
    title = suptitle.get_text() if suptitle is not None else "anatomy"
    page = html.Page(title=title.split("\n")[0], lines=title.split("\n")[1:])
    page.add(html.Part('<img alt="plot" src="data:image/png;base64,'
                       + base64.b64encode(buffer.getvalue()).decode("ascii") + '">'))
    return page.add(html.notes(["a picture without hover values: this command has no interactive HTML module yet"]))
