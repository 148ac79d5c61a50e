"""What decides a corpus run's figures: :class:`Settings` (shared by the worker, the activation store, the
runner and the manifest)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """What decides the figures: ``ctx`` tokens per window, ``bos`` (each window starts with BOS),
    ``max_tokens`` (None: all), ``lens`` (the lenses measured, ``logit``, ``tuned:DIR``, ``jacobian:FILE`` with
absolute paths; ``()``: none) every ``lens_every`` positions, ``heads``,
    ``shard_windows`` windows per shard, ``allow_special``, ``experts`` (the MoE blocks' routing counts; in
the manifest only when set, so older runs resume). ``batch_size`` (windows per forward) is not
    part of the run's identity: it changes float rounding only."""

    ctx: int
    bos: bool
    max_tokens: int | None = None
    lens: tuple[str, ...] = ("logit",)
    lens_every: int = 1
    heads: bool = False
    shard_windows: int = 16
    allow_special: bool = False
    batch_size: int = 4
    save_activations: tuple[str, ...] = ()  # hook points whose activations are saved (corpus/activations.py)
    activation_dtype: str = "fp32"
    experts: bool = False

    def __post_init__(self) -> None:
        lens = ("logit",) if self.lens is True else () if self.lens is False else tuple(self.lens)
        object.__setattr__(self, "lens", lens)  # True/False as before fitted lenses; a list through Ray's hands

    @property
    def fitted(self) -> tuple[str, ...]:
        """The fitted lenses measured (``kind:PATH``), in order."""
        return tuple(text for text in self.lens if text != "logit")

    def to_dict(self) -> dict[str, object]:
        """The manifest's settings: ``lens`` true for the logit lens alone (as before fitted lenses), false for
        none, else the list of lenses."""
        out = dataclasses.asdict(self)
        out.pop("batch_size")
        out["lens"] = True if self.lens == ("logit",) else False if not self.lens else list(self.lens)
        if self.save_activations:
            out["save_activations"] = list(self.save_activations)
        else:
            del out["save_activations"], out["activation_dtype"]
        if not self.experts:
            del out["experts"]
        return out
