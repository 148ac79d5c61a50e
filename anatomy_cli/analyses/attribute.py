"""Token attribution: one row per input token, its attribution to the metric and its share.

The metric f is read at the last position: the target's log-probability (nats), or with a foil the
logit difference ``logit(target) - logit(foil)`` (the metrics of ``ablate``; :func:`metric_fn`).
``share = attribution / sum(|attribution|)`` over the prompt's tokens (the shares' absolute values add
up to 1; None when every attribution is 0). For integrated gradients the result carries the
completeness check: the attributions should add up to ``f(x) - f(baseline)``; ``delta`` is Captum's
convergence delta (their difference) and ``relative_error = |delta| / |f(x) - f(baseline)|``;
``converged`` says whether it is within ``max_rel_error`` and ``tries`` lists every step count tried.
The agreement check (:func:`agreement`) is Spearman's rank correlation between two methods' per-token
attributions (average ranks for ties). Pure functions: no model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from anatomy_cli.analyses.ablate import metric_fn

__all__ = ["Agreement", "Completeness", "TokenAttribution", "TokenRow", "agreement", "metric_fn", "spearman",
           "token_attribution"]


@dataclass(frozen=True)
class TokenRow:
    position: int
    token_id: int
    token: str
    attribution: float
    share: float | None

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


@dataclass(frozen=True)
class Completeness:
    """Integrated gradients' check: ``sum_attributions`` against ``difference = f(x) - f(baseline)``."""

    sum_attributions: float
    baseline_metric: float
    difference: float
    delta: float
    relative_error: float | None
    max_rel_error: float | None = None
    converged: bool | None = None
    tries: tuple[tuple[int, float], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {**vars(self), "tries": [{"steps": n, "relative_error": e} for n, e in self.tries]}


@dataclass(frozen=True)
class Agreement:
    """``--check``: ``method``'s attributions (``scores`` by position) against the main ones, Spearman's
    ``rank_correlation`` over ``positions`` (None with fewer than 3, or when one side is constant)."""

    method: str
    baseline: str | None
    positions: tuple[int, ...]
    scores: tuple[float, ...]
    rank_correlation: float | None

    def to_dict(self) -> dict[str, object]:
        return {"method": self.method, "baseline": self.baseline, "positions": list(self.positions),
                "attributions": list(self.scores), "rank_correlation": self.rank_correlation}


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their average rank (scipy's ``rankdata`` default)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the ranks; None for < 3 values or a constant side."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} values against {len(b)}")
    if len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = math.fsum(ra) / len(ra), math.fsum(rb) / len(rb)
    cov = math.fsum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = math.fsum((x - ma) ** 2 for x in ra), math.fsum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else None


def agreement(main: TokenAttribution, method: str, baseline: str | None, scores: torch.Tensor) -> Agreement:
    """``scores`` (``[pos]``) against ``main``'s rows; the first position is left out when ``main`` kept it
    (its attribution is 0 by construction there)."""
    other = scores.detach().to("cpu", torch.float64).reshape(-1).tolist()
    if len(other) != len(main.rows):
        raise ValueError(f"{len(other)} scores for {len(main.rows)} tokens")
    keep = [r.position for r in main.rows if not (main.kept_first and r.position == 0)]
    rho = spearman([main.rows[p].attribution for p in keep], [other[p] for p in keep])
    return Agreement(method, baseline, tuple(keep), tuple(other), rho)


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
    kept_first: bool = False
    layer: int | None = None
    site: str | None = None
    check: Agreement | None = None

    @property
    def converged(self) -> bool | None:
        return None if self.completeness is None else self.completeness.converged

    def to_dict(self) -> dict[str, object]:
        return {"method": self.method, "metric": self.metric, "value": self.value, "baseline": self.baseline,
                "kept_first": self.kept_first, "layer": self.layer, "site": self.site, "steps": self.steps,
                "converged": self.converged, "rows": [r.to_dict() for r in self.rows],
                "completeness": None if self.completeness is None else self.completeness.to_dict(),
                "check": None if self.check is None else self.check.to_dict()}


def token_attribution(method: str, metric: str, ids: Sequence[int], pieces: Sequence[str], scores: torch.Tensor,
                      value: float, *, baseline: str | None = None, steps: int | None = None,
                      baseline_metric: float | None = None, delta: float | None = None,
                      max_rel_error: float | None = None, tries: Sequence[tuple[int, float]] = (),
                      kept_first: bool = False, layer: int | None = None, site: str | None = None) -> TokenAttribution:
    """The result for ``scores`` (float ``[pos]``, one per token of ``ids``/``pieces``). With
    ``baseline_metric`` and ``delta`` (integrated gradients) the completeness check is filled in, ``converged``
    when ``max_rel_error`` is given. Raises ValueError on a length mismatch."""
    values = scores.detach().to("cpu", torch.float64).reshape(-1).tolist()
    if not len(values) == len(ids) == len(pieces):
        raise ValueError(f"{len(values)} scores for {len(ids)} tokens")
    total = math.fsum(abs(v) for v in values)
    rows = tuple(TokenRow(i, int(t), p, v, v / total if total else None)
                 for i, (t, p, v) in enumerate(zip(ids, pieces, values)))
    check = None
    if baseline_metric is not None and delta is not None:
        difference = value - baseline_metric
        err = abs(delta) / abs(difference) if difference else None
        converged = None if max_rel_error is None else err is not None and err <= max_rel_error
        check = Completeness(sum_attributions=math.fsum(values), baseline_metric=baseline_metric,
                             difference=difference, delta=delta, relative_error=err, max_rel_error=max_rel_error,
                             converged=converged, tries=tuple(tries))
    return TokenAttribution(method=method, metric=metric, value=value, baseline=baseline, steps=steps, rows=rows,
                            completeness=check, kept_first=kept_first, layer=layer, site=site)
