"""A context variable set for the length of a block (:func:`scoped`): the one way a caller installs what the
code below it reads (the loader, the notes sink, the cancellation check). Standard library only; any layer may
import it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def scoped(var: ContextVar[T], value: T) -> Iterator[T]:
    """``var`` is ``value`` inside the block (this thread's context), and what it was before after it."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
