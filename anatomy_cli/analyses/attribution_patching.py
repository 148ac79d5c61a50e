"""Attribution patching and attribution ablation: estimates beside exact reruns.

An estimate is the first-order change of the metric, ``(a_new - a) . dm/da`` at the run being
edited (``engine.gradients``). ``--check N`` reruns the N cells with the largest ``|estimate|``
exactly; :func:`compare` puts the two side by side and scores the agreement:

* ``pearson``: Pearson's r between estimated and exact changes over the checked cells (None for
  fewer than 2 cells or a constant column);
* ``top_agreement``: of the ``k = ceil(N / 2)`` checked cells with the largest ``|estimate|``, the
  fraction that are also among the k with the largest ``|exact|`` change (1.0: the estimate ranks
  the strongest cells as the exact runs do).

Pure functions: no model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Checked:
    """One cell rerun exactly: its key (``layer``, and ``position``/``head``/``component`` as the grid
    names them), the estimated and the exact change of the metric, and both normalized values
    (patch: ``/ (m_clean - m_corrupt)``; ablate: None)."""

    key: dict[str, object]
    estimate: float
    exact: float
    estimate_value: float | None = None
    exact_value: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {**self.key, "estimate": self.estimate, "exact": self.exact,
                "estimate_value": self.estimate_value, "exact_value": self.exact_value}


@dataclass(frozen=True)
class Check:
    """The checked cells, largest ``|estimate|`` first, and the agreement scores (module docstring)."""

    cells: tuple[Checked, ...]
    pearson: float | None
    top_k: int
    top_agreement: float | None

    def to_dict(self) -> dict[str, object]:
        return {"cells": [c.to_dict() for c in self.cells], "pearson": self.pearson, "top_k": self.top_k,
                "top_agreement": self.top_agreement}


def largest(estimates: torch.Tensor, n: int) -> list[int]:
    """Indices of the ``n`` largest ``|estimates|`` (flat index into any shape), largest first; ties by index."""
    flat = estimates.detach().reshape(-1).to("cpu", torch.float64).abs().tolist()
    return sorted(range(len(flat)), key=lambda i: (-flat[i], i))[:max(0, n)]


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's r of two equally long sequences; None for fewer than 2 values or a constant sequence."""
    if len(x) != len(y):
        raise ValueError(f"sequences of different lengths: {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    a, b = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    a, b = a - a.mean(), b - b.mean()
    denominator = float(a.norm() * b.norm())
    return None if denominator == 0 or not math.isfinite(denominator) else float(a @ b) / denominator


def compare(keys: Sequence[Mapping[str, object]], estimates: Sequence[float], exacts: Sequence[float], *,
            scale: float | None = None) -> Check:
    """The check of cells ``keys`` (largest ``|estimate|`` first): estimated and exact changes of the metric.

    ``scale``: ``m_clean - m_corrupt`` for patching (values are changes divided by it), None otherwise.
    """
    if not len(keys) == len(estimates) == len(exacts):
        raise ValueError("keys, estimates and exacts must be equally long")
    norm = (lambda v: None if not scale else v / scale)
    cells = tuple(Checked(dict(k), float(e), float(x), norm(float(e)), norm(float(x)))
                  for k, e, x in zip(keys, estimates, exacts))
    k = math.ceil(len(cells) / 2)
    agreement = None
    # No ranking where one side is all zeros (e.g. CLEAN = CORRUPT): the top k would be any k, "1.00" a fluke.
    if cells and any(c.estimate for c in cells) and any(c.exact for c in cells):
        by_est = set(sorted(range(len(cells)), key=lambda i: -abs(cells[i].estimate))[:k])
        by_exact = set(sorted(range(len(cells)), key=lambda i: -abs(cells[i].exact))[:k])
        agreement = len(by_est & by_exact) / k
    return Check(cells=cells, pearson=pearson([c.estimate for c in cells], [c.exact for c in cells]), top_k=k,
                 top_agreement=agreement)
