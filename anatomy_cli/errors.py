"""User-facing errors.

Every expected failure is an :class:`AnatomyError` whose message is one line
that the CLI prints as ``error: <message>`` on stderr; ``exit_code`` is 1 for
runtime errors and 2 for usage errors. Library layers (engine, analyses) raise
these and never print.
"""

from __future__ import annotations

import os
import sys


class AnatomyError(Exception):
    """Base class: a runtime error with a one-line, user-facing message (exit 1)."""

    exit_code = 1


class UsageError(AnatomyError):
    """The user asked for something invalid: bad argument, empty prompt (exit 2)."""

    exit_code = 2


class ModelNotFound(AnatomyError):
    """No preset, local directory, HF cache entry or Hub repo matches the model spec."""


class ModelPathNotFound(ModelNotFound, UsageError):
    """A model path (``./model``, ``model.gguf``) that does not exist: a usage error (exit 2), as a missing
    dictionary or corpus is."""


class OfflineError(ModelNotFound):
    """The model is not in the local cache and the Hub cannot be reached. ``spec`` and ``need``: the model as given
    and what was wanted of it (models/resolve.py ``offline_message``'s arguments), where the error says them."""

    def __init__(self, message: str, spec: str | None = None, need: str | None = None) -> None:
        super().__init__(message)
        self.spec, self.need = spec, need


class CheckpointError(AnatomyError):
    """A checkpoint exists but cannot be read (corrupt, partial, wrong format)."""


class UnsupportedArchitecture(AnatomyError):
    """The model's architecture has no adapter; the message names the supported ones."""


class PromptTooLong(UsageError):
    """A prompt has more tokens than the model's context window."""


def quiet_broken_pipe() -> None:
    """After a closed stdout (``| head -1``): point stdout at devnull so Python's flush at exit cannot raise again.

    Standard library only: the `serve` client uses it before anything heavy is imported.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
