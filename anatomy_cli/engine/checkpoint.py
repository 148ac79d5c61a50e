"""Checkpoints of every fit (``fit-lens jacobian`` and ``tuned``, ``fit-sae --clt``) and the files fits write.

Every file is written atomically: to a temporary file beside it, then renamed (:func:`atomic_write`), so an
interrupted run never leaves half a file. A checkpoint is one ``torch.save`` dict: the fit's own state (weights,
optimiser, step or running sums; each fit names its keys) plus ``"settings"``, a dict of what a resume must match:
the run's options and a digest of its data (:func:`digest` of the token ids), so a checkpoint of other settings or
another corpus is refused, naming what differs (:meth:`Checkpoint.load`). The layout is the one the fits wrote
before this module: their checkpoints resume.

``fit-lens jacobian``'s state is :class:`JacobianProgress`: the running float64 sums of ``J`` and which prompts
they hold, in this process and on Ray alike (one file layout: a fit started in one way resumes in the other).
Its layout is jlens' checkpoint (``jacobian_sum``, ``n_done``, ``next_idx``, ``source_layers``) plus ``skipped``,
``settings`` and ``done``: the indices (0-based, into the fit's prompts) of every prompt finished, the skipped ones
included. In one process the prompts finish in order, so ``done`` is ``0..next_idx-1``; on Ray they finish as the
workers return them, so ``done`` may have holes, and ``next_idx`` is the first prompt not done. A checkpoint
written before ``done`` existed holds ``0..next_idx-1``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    import torch


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


@dataclass
class JacobianProgress:
    """``fit-lens jacobian``'s running state: ``sums`` ``{block: float64 [d, d]}``, prompts fitted (``n_done``) and
    skipped, the indices of the prompts finished (``done``); ``resumed``: read from a checkpoint (not saved)."""

    sums: dict[int, torch.Tensor]
    n_done: int = 0
    skipped: int = 0
    done: set[int] = field(default_factory=set)
    resumed: bool = False

    @classmethod
    def start(cls, checkpoint: Checkpoint | None, blocks: tuple[int, ...], d_model: int) -> JacobianProgress:
        """Zero sums, or the state ``checkpoint`` holds when its file exists (its settings must be this run's:
        :meth:`Checkpoint.load`)."""
        import torch

        state = None if checkpoint is None else checkpoint.load()
        if state is None:
            return cls({b: torch.zeros(d_model, d_model, dtype=torch.float64) for b in blocks})
        done = state.get("done")
        return cls({int(b): t.double() for b, t in state["jacobian_sum"].items()}, int(state["n_done"]),
                   int(state.get("skipped", 0)),
                   set(range(int(state["next_idx"]))) if done is None else {int(i) for i in done}, resumed=True)

    def add(self, index: int, sums: dict[int, torch.Tensor] | None, fitted: int, skipped: int) -> None:
        """Prompt ``index`` finished: its ``J`` (``sums``, None when skipped) added."""
        for b, m in (sums or {}).items():
            self.sums[b] += m
        self.n_done += fitted
        self.skipped += skipped
        self.done.add(index)

    def next_idx(self, n_prompts: int) -> int:
        return next((i for i in range(n_prompts) if i not in self.done), n_prompts)

    def save_when_due(self, checkpoint: Checkpoint, n_prompts: int) -> None:
        """This state to ``checkpoint``'s file, atomically, when it is due (:meth:`Checkpoint.due`)."""
        if checkpoint.due(len(self.done), n_prompts):
            checkpoint.save({
                "jacobian_sum": self.sums, "n_done": self.n_done, "next_idx": self.next_idx(n_prompts),
                "skipped": self.skipped,
                "source_layers": list(self.sums), "done": sorted(self.done)})  # the blocks in order, as the settings
