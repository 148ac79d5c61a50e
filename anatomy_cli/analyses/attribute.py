"""Token attribution: one row per input token, its attribution to the metric and its share.

The metric f is read at the last position: the target's log-probability (nats), or with a foil the
logit difference ``logit(target) - logit(foil)`` (the metrics of ``ablate``; :func:`metric_fn`).
``share = attribution / sum(|attribution|)`` over the prompt's tokens (the shares' absolute values add
up to 1; None when every attribution is 0). For integrated gradients the result carries the
completeness check: the attributions should add up to ``f(x) - f(baseline)``; ``delta`` is Captum's
convergence delta (their difference) and ``relative_error = |delta| / |f(x) - f(baseline)|``.
Pure functions: no model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from anatomy_cli.analyses.ablate import metric_fn

__all__ = ["Completeness", "TokenAttribution", "TokenRow", "metric_fn", "token_attribution"]


@dataclass(frozen=True)
class TokenRow:
    position: int
    token_id: int
    token: str
    attribution: float
    share: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class Completeness:
    """Integrated gradients' check: ``sum_attributions`` against ``difference = f(x) - f(baseline)``."""

    sum_attributions: float
    baseline_metric: float
    difference: float
    delta: float
    relative_error: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class TokenAttribution:
    """One prompt's attribution: ``method``, ``metric`` (``logprob`` or ``logit_diff``), ``value`` = f(x),
    ``baseline``/``steps`` (None where the method has none), ``rows`` in position order."""

    method: str
    metric: str
    value: float
    baseline: str | None
    steps: int | None
    rows: tuple[TokenRow, ...]
    completeness: Completeness | None

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "metric": self.metric, "value": self.value, "baseline": self.baseline,
                "steps": self.steps, "rows": [r.to_dict() for r in self.rows],
                "completeness": None if self.completeness is None else self.completeness.to_dict()}


def token_attribution(method: str, metric: str, ids: Sequence[int], pieces: Sequence[str], scores: torch.Tensor,
                      value: float, *, baseline: str | None = None, steps: int | None = None,
                      baseline_metric: float | None = None, delta: float | None = None) -> TokenAttribution:
    """The result for ``scores`` (float ``[pos]``, one per token of ``ids``/``pieces``). With
    ``baseline_metric`` and ``delta`` (integrated gradients) the completeness check is filled in.
    Raises ValueError on a length mismatch."""
    values = scores.detach().to("cpu", torch.float64).reshape(-1).tolist()
    if not len(values) == len(ids) == len(pieces):
        raise ValueError(f"{len(values)} scores for {len(ids)} tokens")
    total = math.fsum(abs(v) for v in values)
    rows = tuple(TokenRow(i, int(t), p, v, v / total if total else None)
                 for i, (t, p, v) in enumerate(zip(ids, pieces, values)))
    check = None
    if baseline_metric is not None and delta is not None:
        difference = value - baseline_metric
        check = Completeness(sum_attributions=math.fsum(values), baseline_metric=baseline_metric,
                             difference=difference, delta=delta,
                             relative_error=abs(delta) / abs(difference) if difference else None)
    return TokenAttribution(method=method, metric=metric, value=value, baseline=baseline, steps=steps, rows=rows,
                            completeness=check)
