"""The one stderr sink: errors, warnings, informational lines, ``wrote FILE`` and the status line.

Every message that is not a result goes through here (stdout carries results only, docs/output.md):
``error: ...`` as one line, ``warning: ...``, a plain line, ``wrote FILE (detail)``, and on a terminal one
self-erasing status line (:func:`status`) that long runs update (:meth:`Status.update`: `corpus` hands
``update`` to the corpus runner as its progress callback, so the layer below imports nothing of this).
rich is imported only when a status line is drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def error_line(message: str) -> None:
    """Print ``error: message`` as one line on stderr (newlines folded)."""
    text = " ".join(str(message).split("\n")).strip()
    print(f"error: {text}", file=sys.stderr)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def info(message: str) -> None:
    """Print an informational line on stderr."""
    print(message, file=sys.stderr)


def wrote(path: str | Path, detail: str | None = None) -> None:
    """``wrote FILE`` (``wrote FILE (detail)``) on stderr, once a file is written."""
    info(f"wrote {path}" + (f" ({detail})" if detail else ""))


class Status:
    """The status line being shown: :meth:`update` replaces its text (nothing when no line is shown)."""

    def __init__(self, spinner: Any = None):
        self._spinner = spinner

    def update(self, text: str) -> None:
        if self._spinner is not None:
            from rich.text import Text

            self._spinner.update(text=Text(text))


_live: list[Any] = []  # the one status line being shown (rich allows one live display at a time)


@contextmanager
def status(message: str) -> Iterator[Status]:
    """Show ``message`` with a spinner on stderr while the block runs, when stderr is a terminal; yields a
    :class:`Status` whose ``update(text)`` changes the line.

    Nothing at all when stderr is not a terminal (pipelines, logs, tests). Nested calls
    replace the text and restore it on exit. Lines printed to stderr meanwhile (warnings)
    appear above the spinner; the spinner line is erased at the end, so no blank line is left.
    stdout is never touched. In a command run by `anatomy serve`, the client shows the line.
    """
    if _live:
        from rich.text import Text

        spinner, before = _live[-1], _live[-1].text
        spinner.update(text=Text(message))
        try:
            yield Status(spinner)
        finally:
            spinner.update(text=before)
        return
    if not sys.stderr.isatty():
        yield Status()
        return
    remote = getattr(sys.stderr, "remote_status", None)
    if remote is not None:  # a command run by `anatomy serve`: its client shows the line while the work happens
        with remote(message):
            yield Status()
        return
    from rich.console import Console
    from rich.live import Live
    from rich.spinner import Spinner
    from rich.text import Text

    spinner = Spinner("dots", text=Text(message), style="dim")
    console = Console(file=sys.stderr, highlight=False, markup=False, emoji=False)
    with Live(spinner, console=console, transient=True, refresh_per_second=8, redirect_stdout=False,
              redirect_stderr=True):
        _live.append(spinner)
        try:
            yield Status(spinner)
        finally:
            _live.pop()
