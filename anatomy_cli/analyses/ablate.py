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
    """``component`` (``attn``, ``mlp`` or ``head``; ``head`` is None unless a head) of ``layer``
    knocked out at every position: the metric then, and ``effect`` = metric - intact metric."""

    layer: int
    component: str
    head: int | None
    metric: float
    effect: float

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class Ablation:
    """All ablations of one prompt; ``clean_metric`` is the intact run's metric."""

    metric: str                  # "logprob" or "logit_diff"
    mode: str                    # "zero" or "mean"
    clean_metric: float
    rows: tuple[AblationRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "mode": self.mode, "clean_metric": self.clean_metric,
                "rows": [r.to_dict() for r in self.rows]}


def ablation(metric: str, mode: str, keys: Sequence[tuple[int, str, int | None]], values: torch.Tensor,
             clean: float) -> Ablation:
    """``keys[i] = (layer, component, head)`` of ablation i; ``values``: float ``[len(keys)]``, its metric.
    Raises ValueError on a length mismatch."""
    if values.ndim != 1 or values.shape[0] != len(keys):
        raise ValueError(f"values must be [{len(keys)}], got {tuple(values.shape)}")
    rows = tuple(AblationRow(layer=layer, component=component, head=head, metric=m, effect=m - clean)
                 for (layer, component, head), m in zip(keys, values.detach().to("cpu", torch.float64).tolist()))
    return Ablation(metric=metric, mode=mode, clean_metric=clean, rows=rows)
