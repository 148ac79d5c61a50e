"""What decides a corpus run's figures: :class:`Settings` (shared by the worker, the activation store, the
runner and the manifest)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Settings:
    """What decides the figures: ``ctx`` tokens per window, ``bos`` (each window starts with BOS),
    ``max_tokens`` (None: all), ``lens`` (measure the logit lens) every ``lens_every`` positions, ``heads``,
    ``shard_windows`` windows per shard, ``allow_special``, ``experts`` (the MoE blocks' routing counts; in
the manifest only when set, so older runs resume). ``batch_size`` (windows per forward) is not
    part of the run's identity: it changes float rounding only."""

    ctx: int
    bos: bool
    max_tokens: int | None = None
    lens: bool = True
    lens_every: int = 1
    heads: bool = False
    shard_windows: int = 16
    allow_special: bool = False
    batch_size: int = 4
    save_activations: tuple[str, ...] = ()  # hook points whose activations are saved (corpus/activations.py)
    activation_dtype: str = "fp32"
    experts: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("batch_size")
        if self.save_activations:
            out["save_activations"] = list(self.save_activations)
        else:
            del out["save_activations"], out["activation_dtype"]
        if not self.experts:
            del out["experts"]
        return out
