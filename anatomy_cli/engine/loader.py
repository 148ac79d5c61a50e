"""Who opens models and loads their weights: a :class:`Loader`, chosen per thread.

Commands open and load through :func:`current_loader`: :data:`DIRECT` (the files, every time) unless a
caller hands another with :func:`using_loader`: ``anatomy serve`` hands its cache (the same two methods,
models kept by file identity), and tests a caching loader. No monkeypatching: the choice is this thread's
context. No torch at import time.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Protocol

from anatomy_cli.engine.opening import OpenedModel
from anatomy_cli.engine.opening import open_model
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.scoped import scoped

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


class Loader(Protocol):
    """Opens models and loads their weights: :data:`DIRECT`, or a server's cache."""

    def open(self, spec: ModelSpec) -> OpenedModel: ...

    def load_weights(self, opened: OpenedModel) -> LoadedModel: ...


class DirectLoader:
    """Reads the files every time."""

    def open(self, spec: ModelSpec) -> OpenedModel:
        return open_model(spec)

    def load_weights(self, opened: OpenedModel) -> LoadedModel:
        from anatomy_cli.engine.loading import load_weights

        return load_weights(opened)


DIRECT = DirectLoader()
_LOADER: ContextVar[Loader] = ContextVar("anatomy_loader", default=DIRECT)


def current_loader() -> Loader:
    """The loader commands open and load through (:data:`DIRECT` unless :func:`using_loader` says else)."""
    return _LOADER.get()


def using_loader(loader: Loader) -> AbstractContextManager[Loader]:
    """Open and load through ``loader`` inside the block (this thread's context only)."""
    return scoped(_LOADER, loader)


@dataclass(frozen=True)
class GivenLoader:
    """A loader that hands out an already loaded model (the Python API's LoadedModel): a task's pipeline runs on
    it unchanged, whatever spec it is asked for."""

    lm: LoadedModel

    def open(self, spec: ModelSpec) -> OpenedModel:

        return OpenedModel(spec=spec, info=self.lm.info, tokenizer=self.lm.tokenizer, config=self.lm.model.config)

    def load_weights(self, opened: OpenedModel) -> LoadedModel:
        return self.lm


def release_memory() -> None:
    """Give freed memory back to the operating system: a garbage collection, then glibc's ``malloc_trim(0)``
    where there is glibc. A model whose weights were built in memory (a GGUF file's dequantized tensors) and then
    dropped leaves most of its pages in the allocator's heap, still counted in the process's RSS: the next model
    would load on top of them (``diff`` on a prompt peaked at A + B, issue 51 item 13). No-op elsewhere."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, where it is glibc
    except (OSError, AttributeError):  # musl has no malloc_trim: nothing to trim
        return
    trim(0)
