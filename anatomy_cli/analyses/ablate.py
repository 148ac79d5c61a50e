"""Ablation: the metric after knocking out one component, and its change from the intact run.

The metric at the chosen position is the target's log-probability (float64 log-softmax
over the whole vocabulary), or with a foil the logit difference ``logit(target) -
logit(foil)``. ``effect`` = ablated metric - intact metric (negative: the component helped
the target). Pure functions: no model, no tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def metric_fn(target_id: int, foil_id: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``logits [n, vocab] -> float64 [n]``: ``log p(target)``, or ``logit[target] - logit[foil]``."""
    def metric(logits: torch.Tensor) -> torch.Tensor:
        if foil_id is not None:
            return logits[:, target_id].to(torch.float64) - logits[:, foil_id].to(torch.float64)
        return torch.log_softmax(logits.to(torch.float64), dim=-1)[:, target_id]
    return metric


@dataclass(frozen=True)
class AblationRow:
    """``component`` (``attn``, ``mlp``, ``head`` or ``expert``; ``head`` is None unless a head, ``expert`` None
    unless a routed expert of an MoE block) of ``layer`` knocked out at every position: the metric then, and
    ``effect`` = metric - intact metric."""

    layer: int
    component: str
    head: int | None
    metric: float
    effect: float
    expert: int | None = None

    @property
    def index(self) -> int | None:
        """The head, or the expert, this row knocked out (None for a whole attention or MLP output)."""
        return self.expert if self.component == "expert" else self.head

    def to_dict(self) -> dict[str, object]:
        """``layer component head metric effect``; an expert's row has ``expert`` in place of ``head``."""
        if self.component == "expert":
            return {"layer": self.layer, "component": self.component, "expert": self.expert, "metric": self.metric,
                    "effect": self.effect}
        return {"layer": self.layer, "component": self.component, "head": self.head, "metric": self.metric,
                "effect": self.effect}


@dataclass(frozen=True)
class Ablation:
    """All ablations of one prompt; ``clean_metric`` is the intact run's metric."""

    metric: str                  # "logprob" or "logit_diff"
    mode: str                    # "zero" or "mean"; expert rows: "reroute" or "zero"
    clean_metric: float
    rows: tuple[AblationRow, ...]

    @property
    def grid(self) -> str | None:
        """``head`` or ``expert`` when the rows are one per head (per routed expert): a layer x index grid; None
        for whole attention and MLP outputs."""
        return next((r.component for r in self.rows if r.component in ("head", "expert")), None)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "mode": self.mode, "clean_metric": self.clean_metric,
                "rows": [r.to_dict() for r in self.rows]}


def ablation(metric: str, mode: str, keys: Sequence[tuple[int, str, int | None]], values: torch.Tensor,
             clean: float) -> Ablation:
    """``keys[i] = (layer, component, index)`` of ablation i (index: the head, the expert of component ``expert``,
    else None); ``values``: float ``[len(keys)]``, its metric. Raises ValueError on a length mismatch."""
    if values.ndim != 1 or values.shape[0] != len(keys):
        raise ValueError(f"values must be [{len(keys)}], got {tuple(values.shape)}")
    rows = tuple(AblationRow(layer=layer, component=component, head=None if component == "expert" else index,
                             expert=index if component == "expert" else None, metric=m, effect=m - clean)
                 for (layer, component, index), m in zip(keys, values.detach().to("cpu", torch.float64).tolist()))
    return Ablation(metric=metric, mode=mode, clean_metric=clean, rows=rows)
