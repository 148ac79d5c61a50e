"""What every picture says about itself (:class:`Caption`). Re-exported by :mod:`anatomy_cli.output.plots`; a
module of its own so that the drawing modules and the package need not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel


@dataclass(frozen=True)
class Caption:
    """What every picture says about itself: the command, the model, the prompt (shortened in the title),
    one line of detail (e.g. ``position 3 = ·very``) and whether the weights are random."""

    command: str
    model: str
    prompt: str | None = None
    detail: str | None = None
    untrained: bool = False

    @classmethod
    def of(cls, command: str, lm: LoadedModel, prompt: str | None = None, detail: str | None = None) -> Caption:
        """The caption for a loaded model: its short name (``lm.label``, else ``lm.name``), ``lm.untrained``."""
        return cls(command, getattr(lm, "label", None) or lm.name, prompt, detail, bool(lm.untrained))
