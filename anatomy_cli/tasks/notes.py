"""Warnings, informational lines and progress as data: what a task says goes to the current :class:`Notes`.

Below the CLI nothing prints. A task calls :func:`warn`, :func:`info` or :func:`status` (a context manager
yielding a :class:`Progress` with ``update(text)`` and ``counter(what, unit)``); whoever runs the task decides
where they go by installing a Notes with :func:`using_notes`: the CLI and the Python API hand the stderr sink
(:mod:`anatomy_cli.output.sink`), a test or a notebook can collect them (:class:`Collected`, the default, keeps
them in a list and shows nothing).

A long run can be cancelled from outside (``anatomy serve`` does so when a client disconnects or
``serve --cancel`` asks): whoever runs the task installs a check with :func:`cancellable`; every
:func:`status` block, each ``update`` and each ``counter`` step of its Progress, and :func:`check_cancelled`
(called by loops that report nothing) raise :class:`Cancelled` once the check answers a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from dataclasses import field
from typing import Protocol

from anatomy_cli.errors import AnatomyError
from anatomy_cli.scoped import scoped


class Progress(Protocol):
    def update(self, text: str) -> None: ...

    # ``tail()``: text shown after the count (generate's continuation so far), asked only when the line is drawn.
    def counter(self, what: str, unit: str, tail: Callable[[], str] | None = None) -> Callable[[int, int], None]: ...


class Notes(Protocol):
    """Where a task's words go: ``warn`` (``warning: …``), ``info`` (a plain line), ``status`` (a status line
    while a block runs, updatable)."""

    def warn(self, message: str) -> None: ...

    def info(self, message: str) -> None: ...

    def status(self, message: str) -> AbstractContextManager[Progress]: ...


class _Quiet:
    def update(self, text: str) -> None:
        return None

    def counter(self, what: str, unit: str, tail: Callable[[], str] | None = None) -> Callable[[int, int], None]:
        return lambda done, total: None


@dataclass
class Collected:
    """Notes kept as data: ``warnings`` and ``infos`` in order; status lines are not shown."""

    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def info(self, message: str) -> None:
        self.infos.append(message)

    @contextmanager
    def status(self, message: str) -> Iterator[Progress]:
        yield _Quiet()


_current: ContextVar[Notes | None] = ContextVar("anatomy_notes", default=None)
_fallback: Notes = Collected()


def set_default(notes: Notes) -> None:
    """Where notes go when no :func:`using_notes` block is active (the Python API: the stderr sink)."""
    global _fallback
    _fallback = notes


def current() -> Notes:
    """The Notes installed by :func:`using_notes` (else one that collects)."""
    notes = _current.get()
    return notes if notes is not None else _fallback


def using_notes(notes: Notes) -> AbstractContextManager[object]:
    """Send what tasks say inside the block to ``notes``."""
    return scoped(_current, notes)


def warn(message: str) -> None:
    current().warn(message)


def info(message: str) -> None:
    current().info(message)


@dataclass
class _Recording:
    """Notes that go where ``inner`` sends them, the warnings kept in ``kept`` too."""

    inner: Notes
    kept: list[str]

    def warn(self, message: str) -> None:
        self.kept.append(message)
        self.inner.warn(message)

    def info(self, message: str) -> None:
        self.inner.info(message)

    def status(self, message: str) -> AbstractContextManager[Progress]:
        return self.inner.status(message)


@contextmanager
def recorded() -> Iterator[list[str]]:
    """Inside the block the warnings go where they went (stderr for the CLI) and are kept, in order, in the list
    yielded: a result that carries what its run warned of (circuit's JSON ``warnings``)."""
    kept: list[str] = []
    with using_notes(_Recording(current(), kept)):
        yield kept


class Cancelled(AnatomyError):
    """The run was cancelled from outside (its message says by what); exit 130, as an interrupted run."""

    exit_code = 130


_cancel: ContextVar[Callable[[], str | None] | None] = ContextVar("anatomy_cancel", default=None)


def cancellable(check: Callable[[], str | None]) -> AbstractContextManager[object]:
    """Inside the block, ``check()`` is asked at every step a task reports; a reason (not None) ends the run
    there with :class:`Cancelled` (``cancelled REASON``: ``by …``, ``as …``)."""
    return scoped(_cancel, check)


def check_cancelled() -> None:
    """Raise :class:`Cancelled` when the installed check (:func:`cancellable`) gives a reason; else nothing."""
    check = _cancel.get()
    reason = check() if check is not None else None
    if reason is not None:
        raise Cancelled(f"cancelled {reason}")


class _Checked:
    """A Progress that checks for cancellation at every update and counter step."""

    def __init__(self, inner: Progress):
        self._inner = inner

    def update(self, text: str) -> None:
        check_cancelled()
        self._inner.update(text)

    def counter(self, what: str, unit: str, tail: Callable[[], str] | None = None) -> Callable[[int, int], None]:
        step = self._inner.counter(what, unit, tail)

        def checked(done: int, total: int) -> None:
            check_cancelled()
            step(done, total)

        return checked


@contextmanager
def _status(message: str) -> Iterator[Progress]:
    check_cancelled()
    with current().status(message) as progress:
        yield _Checked(progress)


def status(message: str) -> AbstractContextManager[Progress]:
    return _status(message)
