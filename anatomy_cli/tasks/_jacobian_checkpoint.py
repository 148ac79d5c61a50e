"""`fit-lens jacobian --checkpoint FILE`: the running float64 sums of ``J`` and which prompts they hold, written
atomically after completed prompts and resumed from, in this process and on Ray alike (one file layout: a fit
started in one way resumes in the other).

The layout is jlens' checkpoint (``jacobian_sum``, ``n_done``, ``next_idx``, ``source_layers``) plus ``skipped``,
``settings`` (what a resume must match) and ``done``: the indices (0-based, into the fit's prompts) of every
prompt finished, the skipped ones included. In this process the prompts finish in order, so ``done`` is
``0..next_idx-1``; on Ray they finish as the workers return them, so ``done`` may have holes, and ``next_idx`` is
the first prompt not done. A checkpoint written before ``done`` existed holds ``0..next_idx-1``. Written,
checked and read back by engine/checkpoint.py, as every fit's.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    import torch


@dataclass
class Progress:
    """The running state of a fit: ``sums`` ``{block: float64 [d, d]}``, prompts fitted (``n_done``) and skipped,
    and the indices of the prompts finished (``done``)."""

    sums: dict[int, torch.Tensor]
    n_done: int = 0
    skipped: int = 0
    done: set[int] = field(default_factory=set)

    def add(self, index: int, sums: dict[int, torch.Tensor] | None, fitted: int, skipped: int) -> None:
        """Prompt ``index`` finished: its ``J`` (``sums``, None when skipped) added."""
        for b, m in (sums or {}).items():
            self.sums[b] += m
        self.n_done += fitted
        self.skipped += skipped
        self.done.add(index)

    def next_idx(self, n_prompts: int) -> int:
        return next((i for i in range(n_prompts) if i not in self.done), n_prompts)


def start(path: Path | None, settings: dict[str, Any], blocks: tuple[int, ...], d_model: int,
          n_prompts: int) -> Progress:
    """A fresh :class:`Progress`, or the one ``path`` holds when it exists (its settings must be ``settings``:
    UsageError otherwise, naming what differs)."""
    import torch

    state = None if path is None else Checkpoint(path, settings).load()
    if path is None or state is None:
        return Progress({b: torch.zeros(d_model, d_model, dtype=torch.float64) for b in blocks})
    done = state.get("done")
    progress = Progress({int(b): t.double() for b, t in state["jacobian_sum"].items()}, int(state["n_done"]),
                        int(state.get("skipped", 0)),
                        set(range(int(state["next_idx"]))) if done is None else {int(i) for i in done})
    notes.info(f"resuming from {path}: {len(progress.done)} of {n_prompts} prompts done")
    return progress


def save(path: Path, progress: Progress, settings: dict[str, Any], n_prompts: int) -> None:
    """``progress`` to ``path``, atomically (engine/checkpoint.py)."""
    Checkpoint(path, settings).save({
        "jacobian_sum": progress.sums, "n_done": progress.n_done, "next_idx": progress.next_idx(n_prompts),
        "skipped": progress.skipped, "source_layers": list(settings["source_layers"]), "done": sorted(progress.done)})


def due(progress: Progress, every: int, n_prompts: int) -> bool:
    """Whether the checkpoint is written now: every ``every`` prompts finished, and after the last."""
    return Checkpoint(Path(), {}, every).due(len(progress.done), n_prompts)
