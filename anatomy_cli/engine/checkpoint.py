"""Checkpoints of every fit (``fit-lens jacobian`` and ``tuned``, ``fit-sae --clt``) and the files fits write.

Every file is written atomically: to a temporary file beside it, then renamed (:func:`atomic_write`), so an
interrupted run never leaves half a file. A checkpoint is one ``torch.save`` dict: the fit's own state (weights,
optimiser, step or running sums; each fit names its keys) plus ``"settings"``, a dict of what a resume must match:
the run's options and a digest of its data (:func:`digest` of the token ids), so a checkpoint of other settings or
another corpus is refused, naming what differs (:meth:`Checkpoint.load`). The layout is the one the fits wrote
before this module: their checkpoints resume.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.errors import UsageError


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then a rename onto ``path``: never a half-written
    file (the folder made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def atomic_save(obj: object, path: Path) -> None:
    """``torch.save(obj)`` to ``path``, atomically."""
    import torch

    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def digest(value: object) -> str:
    """A sha256 of ``repr(value)``: the token ids a checkpoint was fitted on, in a few bytes."""
    return hashlib.sha256(repr(value).encode()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """A fit's ``--checkpoint`` file: ``settings`` (what a resume must match), written every ``every`` steps (or
    prompts) and after the last; ``command`` names the fit in a refusal."""

    path: Path
    settings: dict[str, object]
    every: int = 1
    command: str = "fit-lens"

    def load(self) -> dict[str, Any] | None:
        """The state saved at :attr:`path` (tensors on the CPU; None: no file yet), when its ``"settings"`` are
        this run's; UsageError (one line, naming the settings that differ) otherwise."""
        import torch

        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise UsageError(f"--checkpoint {self.path} is not a {self.command} checkpoint "
                             f"({type(exc).__name__})") from None
        theirs = state.get("settings") if isinstance(state, dict) else None
        if theirs != self.settings:
            what = ", ".join(k for k in self.settings
                             if not isinstance(theirs, dict) or theirs.get(k) != self.settings[k])
            raise UsageError(f"--checkpoint {self.path} was written with other settings ({what or 'not anatomy’s'}); "
                             "delete it or give another --checkpoint to start over")
        return dict(state)

    def save(self, state: dict[str, object]) -> None:
        """``state`` and the settings to :attr:`path`, atomically."""
        atomic_save({"settings": self.settings, **state}, self.path)

    def due(self, done: int, total: int) -> bool:
        """Whether the checkpoint is written after ``done`` of ``total`` steps: every :attr:`every`, and after the
        last."""
        return done % self.every == 0 or done == total
