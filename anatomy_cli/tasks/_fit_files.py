"""What `fit-lens`'s files hold beside the lens (the stored precision, the prompts' digests) and what every fit's
summary reports beside its figures (:class:`FitCosts`). Writing them and the checkpoints: engine/checkpoint.py
(``fit-lens jacobian``'s state: its ``JacobianProgress``, started here with the line a resume writes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.engine.checkpoint import JacobianProgress
from anatomy_cli.tasks import notes
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.engine.estimate import EstimateRecord
    from anatomy_cli.engine.estimate import TimingsRecord

DTYPES = {"fp16": "float16", "fp32": "float32"}  # --dtype: the stored matrices' precision (torch names)
# A Jacobian lens file's key beside jlens' own: the digest of each fitted prompt's token ids, so that fit-lens merge
# can refuse fits that share a prompt
HASHES = "prompt_hashes"


@dataclass(frozen=True, kw_only=True)
class FitCosts:
    """A fit's summary beside its figures (``fit-lens jacobian``, ``fit-lens tuned``): the ``estimate`` printed
    before the fit, the ``timings`` measured, the held-out ``check`` (None: not run). Keywords, after the
    summary's own fields."""

    estimate: EstimateRecord | None = None
    timings: TimingsRecord | None = None
    check: dict[str, object] | None = None

    def costs(self) -> dict[str, object]:
        """The JSON form's last keys."""
        return {"estimate": self.estimate, "timings": self.timings, "held_out_check": self.check}


def jacobian_progress(checkpoint: Checkpoint | None, blocks: tuple[int, ...], d_model: int,
                      n_prompts: int) -> JacobianProgress:
    """``fit-lens jacobian``'s running sums, zero or resumed from ``checkpoint`` (a line says so)."""
    progress = JacobianProgress.start(checkpoint, blocks, d_model)
    if checkpoint is not None and progress.resumed:
        notes.info(f"resuming from {checkpoint.path}: {len(progress.done):,} of {counted(n_prompts, 'prompt')} done")
    return progress
