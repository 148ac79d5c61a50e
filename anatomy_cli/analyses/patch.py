"""Activation patching: the metric on logits and the normalized grid.

The metric m is the logit difference ``logit(target) - logit(foil)``, or the target's
logit without a foil, at the last position. A patched run's value is
``(m - m_corrupt) / (m_clean - m_corrupt)``: 0 is the corrupt run, 1 the clean run.
When ``m_clean == m_corrupt`` the ratio is undefined and every value is None.
Pure functions: no model, no tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def logit_metric(target_id: int, foil_id: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``logits [n, vocab] -> float64 [n]``: ``logit[target] - logit[foil]``, or ``logit[target]``. It reads only
    those columns and says so in ``metric.token_ids`` (the engine then computes only them: ``metric_logits``)."""
    def metric(logits: torch.Tensor) -> torch.Tensor:
        m = logits[:, target_id].to(torch.float64)
        return m - logits[:, foil_id].to(torch.float64) if foil_id is not None else m
    metric.token_ids = (target_id,) if foil_id is None else (target_id, foil_id)  # type: ignore[attr-defined]
    return metric


def normalize(m: float, clean: float, corrupt: float) -> float | None:
    """``(m - corrupt) / (clean - corrupt)``; None when ``clean == corrupt``."""
    return None if clean == corrupt else (m - corrupt) / (clean - corrupt)


@dataclass(frozen=True)
class PatchCell:
    """One patched run: the site of ``layer`` at ``position`` (or ``head``, at every position)
    taken from the clean run. ``metric`` is m of the patched run, ``value`` the normalized m."""

    layer: int
    position: int | None
    head: int | None
    metric: float
    value: float | None

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


@dataclass(frozen=True)
class Patching:
    """The grid of one ``patch`` run: ``cells`` in layer order, then position (or head) order."""

    site: str
    metric: str                  # "logit_diff" (with a foil) or "logit"
    clean_metric: float
    corrupt_metric: float
    layers: tuple[int, ...]
    columns: tuple[int, ...]     # positions, or heads for site "head"
    cells: tuple[PatchCell, ...]

    def value(self, layer: int, column: int) -> float | None:
        """The normalized value of the cell at (``layer``, position or head ``column``)."""
        i, j = self.layers.index(layer), self.columns.index(column)
        return self.cells[i * len(self.columns) + j].value

    def to_dict(self) -> dict[str, Any]:
        return {"site": self.site, "metric": self.metric, "clean_metric": self.clean_metric,
                "corrupt_metric": self.corrupt_metric, "cells": [c.to_dict() for c in self.cells]}


def patching(site: str, metric: str, layers: Sequence[int], columns: Sequence[int], grid: torch.Tensor,
             clean: float, corrupt: float) -> Patching:
    """The result of a patch grid. ``grid``: float ``[len(layers), len(columns)]``, m of each patched run;
    ``columns`` are heads when ``site == "head"``, else positions. Raises ValueError on a shape mismatch."""
    if tuple(grid.shape) != (len(layers), len(columns)):
        raise ValueError(f"grid must be [{len(layers)}, {len(columns)}], got {tuple(grid.shape)}")
    per_head = site == "head"
    values = grid.detach().to("cpu", torch.float64).tolist()
    cells = tuple(PatchCell(layer=layer, position=None if per_head else c, head=c if per_head else None,
                            metric=m, value=normalize(m, clean, corrupt))
                  for layer, row in zip(layers, values) for c, m in zip(columns, row))
    return Patching(site=site, metric=metric, clean_metric=clean, corrupt_metric=corrupt,
                    layers=tuple(layers), columns=tuple(columns), cells=cells)
