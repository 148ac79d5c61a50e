"""The one stderr sink: errors, warnings, informational lines, ``wrote FILE`` and the status line.

Every message that is not a result goes through here (stdout carries results only, docs/output.md):
``error: ...`` as one line, ``warning: ...``, a plain line, ``wrote FILE (detail)``, and on a terminal one
self-erasing status line (:func:`status`) that long runs update (:meth:`Status.update`: `corpus` hands
``update`` to the corpus runner as its progress callback, so the layer below imports nothing of this).
rich is imported only when a status line is drawn.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.units import minutes

if TYPE_CHECKING:
    from rich.spinner import Spinner


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


FORCE_ENV = "ANATOMY_STATUS"  # set (not 0/empty) to get the status lines on a stderr that is not a terminal


class Status:
    """The status line being shown: :meth:`update` replaces its text (nothing when no line is shown).

    ``show(text)``: how a line is shown other than by a spinner (a served command's client, or a plain
    stderr line when ``$ANATOMY_STATUS`` asks for them off a terminal).
    """

    def __init__(self, spinner: Spinner | None = None, show: Callable[[str], None] | None = None, every: float = 0.25,
                 width: int | None = None):
        self._spinner = spinner
        self._show = show
        self._every = every
        self._width = width  # the line's columns (the spinner's console); None: the terminal's

    def update(self, text: str) -> None:
        if self._spinner is not None:
            from rich.text import Text

            self._spinner.update(text=Text(text))
        elif self._show is not None:
            self._show(text)

    def counter(self, what: str, unit: str, tail: Callable[[], str] | None = None) -> Callable[[int, int], None]:
        """A progress callback ``(done, total)`` for the layers below: ``what: done/total unit · ETA m:ss``,
        redrawn at most every quarter second (a plain line: every second), and at the end. ``tail()``: text
        shown after it (`generate`'s continuation so far), its end kept where the line would be too wide."""
        start, shown = time.monotonic(), [0.0]

        def step(done: int, total: int) -> None:
            now = time.monotonic()
            if done < total and now - shown[0] < self._every:
                return
            shown[0] = now
            line = progress_line(what, done, total, unit, now - start)
            self.update(line if tail is None else with_tail(line, tail(), self._width))

        return step


def with_tail(line: str, text: str, width: int | None = None) -> str:
    """``line · text`` on one line of ``width`` columns (default: the terminal's), the text's newlines shown
    as ``⏎`` and its start cut (``…``) where it does not fit."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    text = text.replace("\r", "").replace("\n", "⏎")
    room = max(width - len(line) - 6, 10)  # the spinner and the separator
    if len(text) > room:
        text = "…" + text[len(text) - room + 1:]
    return f"{line} · {text}"


def progress_line(what: str, done: int, total: int, unit: str, elapsed: float) -> str:
    """``lens: 120/5,000 positions · ETA 1:23`` (no ETA before the first step is done, nor after the last)."""
    line = f"{what}: {done:,}/{total:,} {unit}"
    if 0 < done < total:
        line += f" · ETA {minutes(elapsed / done * (total - done))}"
    return line


def _forced() -> bool:
    return os.environ.get(FORCE_ENV, "") not in ("", "0")


def _plain(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_live: list[Spinner] = []  # the one status line being shown (rich allows one live display at a time)


@contextmanager
def status(message: str) -> Iterator[Status]:
    """Show ``message`` with a spinner on stderr while the block runs, when stderr is a terminal; yields a
    :class:`Status` whose ``update(text)`` changes the line.

    Nothing at all when stderr is not a terminal (pipelines, logs, tests), unless ``$ANATOMY_STATUS`` asks
    for the lines: then each is a plain stderr line (an update at most once a second). Nested calls
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
    remote = getattr(sys.stderr, "remote_status", None)
    if not sys.stderr.isatty():
        if _forced():  # asked for ($ANATOMY_STATUS): plain lines, also in a served command's piped stderr
            _plain(message)
            yield Status(show=_plain, every=1.0)
        else:
            yield Status()
        return
    if remote is not None:  # a command run by `anatomy serve`: its client shows the line while the work happens
        with remote(message) as show:
            yield Status(show=show)
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
            yield Status(spinner, width=console.width)
        finally:
            _live.pop()


class StderrNotes:
    """The task layer's :class:`~anatomy_cli.tasks.notes.Notes` on this sink: warnings, lines and status lines
    on stderr, as the CLI and the Python API show them."""

    def warn(self, message: str) -> None:
        warn(message)

    def info(self, message: str) -> None:
        info(message)

    def status(self, message: str) -> AbstractContextManager[Status]:
        return status(message)


STDERR = StderrNotes()
