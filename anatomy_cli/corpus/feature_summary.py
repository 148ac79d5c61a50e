"""The merged :class:`~anatomy_cli.corpus.feature_sums.FeatureSums` as rows: per feature its statistics, its top
contexts, the contexts sampled from its activation intervals, the features it fires with most often.

Quantile groups, as SAEDashboard draws them (``sae_dashboard/sequence_data_generator.py`` ``get_indices_dict`` and
``utils_fns.py`` ``random_range_indices``, jbloomAus/SAEDashboard at db4839a): ``n_quantiles`` intervals of equal
width over ``[0, max]``, each ``[lower, upper]`` (both ends included), and ``quantile_size`` tokens drawn uniformly
without replacement from those whose activation lies in it. Here only firing tokens (activation > 0) are drawn
(SAEDashboard's lowest interval also holds the tokens where the feature is 0), and the draw is the bottom-k sample
by each token's seeded key (feature_sums.py ``keys``), from the per-bin samples the pass kept: exact where an
interval's edges fall on the histogram's bin edges, and within a bin cut by an edge drawn from that bin's kept
tokens only. delphi's own sampler (``delphi/latents/samplers.py`` ``split_quantiles``: equal-count slices of the
examples sorted by activation, ``random.sample`` with seed 22) runs on what ``--delphi`` writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from anatomy_cli.corpus.feature_sums import EDGES
from anatomy_cli.corpus.feature_sums import Candidates
from anatomy_cli.corpus.feature_sums import FeatureSums

if TYPE_CHECKING:
    from collections.abc import Callable


def status(fires: int, tokens: int) -> str:
    """``dead`` (never fires), ``always-on`` (fires at every token) or ``""``."""
    return "dead" if fires == 0 else "always-on" if fires == tokens else ""


def hist_edges() -> list[float]:
    """The histogram's bin edges (0 first, inf last)."""
    return [0.0, *EDGES.tolist(), float("inf")]


def feature_rows(s: FeatureSums, cooccur_top: int) -> list[dict[str, object]]:
    """One row per followed feature: ``feature``, ``fires``, ``frequency`` (fires / tokens), ``mean_activation``
    (over the tokens where it fires; None when dead), ``max_activation``, ``status``, ``histogram`` (counts per bin,
    :func:`hist_edges`), ``cooccurring`` (the ``cooccur_top`` features firing with it on most tokens: ``feature``,
    ``tokens``, ``fraction`` of its own firing tokens; ties: the lower id)."""
    rows = []
    for i, fid in enumerate(s.features.tolist()):
        fires = int(s.fires[i])
        row: dict[str, object] = {
            "feature": fid, "fires": fires, "frequency": fires / s.tokens if s.tokens else 0.0,
            "mean_activation": float(s.sums[i] / fires) if fires else None,
            "max_activation": float(s.maxes[i]), "status": status(fires, s.tokens),
            "histogram": s.hist[i].tolist()}
        if s.cooc is not None:
            counts = s.cooc[i].copy()
            counts[fid] = 0
            order = np.lexsort((np.arange(len(counts)), -counts))[:cooccur_top]
            row["cooccurring"] = [{"feature": int(g), "tokens": int(counts[g]),
                                   "fraction": float(counts[g] / fires) if fires else 0.0}
                                  for g in order if counts[g] > 0]
        rows.append(row)
    return rows


def context_rows(s: FeatureSums, n_quantiles: int, pieces: Any) -> list[dict[str, object]]:
    """The contexts: per feature its top ones (``kind`` ``top``, ``rank`` 0..), then per interval from the highest
    (``kind`` ``quantile``, ``quantile`` n-1..0 as SAEDashboard lists them, ``lower``/``upper``), each with
    ``activation``, ``window``, ``position``, ``tokens``/``token_ids``/``activations`` of the context and ``at`` (the
    token's index in it). ``pieces(ids) -> list[str]`` decodes token ids."""
    out: list[dict[str, object]] = []
    tops, samples = _by_feature(s.top.fidx), _by_feature(s.samples.fidx)  # one sort, not a scan per feature
    for i, fid in enumerate(s.features.tolist()):
        top = s.top.take(tops(i))
        out += [_context(top, j, fid, "top", pieces, rank=j) for j in range(len(top))]
        if n_quantiles <= 0 or s.maxes[i] <= 0:
            continue
        mine = s.samples.take(samples(i))
        bounds = np.linspace(0.0, float(s.maxes[i]), n_quantiles + 1)
        for q in range(n_quantiles - 1, -1, -1):
            lo, hi = float(bounds[q]), float(bounds[q + 1])
            inside = np.flatnonzero((mine.act >= lo) & (mine.act <= hi))
            inside = inside[np.lexsort((mine.pos[inside], mine.window[inside], mine.key[inside]))]
            for j in inside[:s.quantile_size]:
                out.append(_context(mine, int(j), fid, "quantile", pieces, quantile=q, lower=lo, upper=hi))
    return out


def _by_feature(fidx: np.ndarray) -> Callable[[int], np.ndarray]:
    """``of(i)``: the indices where ``fidx == i``, ascending (``np.flatnonzero(fidx == i)``), from one stable sort."""
    order = np.argsort(fidx, kind="stable")
    ends = np.searchsorted(fidx[order], np.arange(int(fidx.max(initial=-1)) + 2))

    def of(i: int) -> np.ndarray:
        return order[ends[i]:ends[i + 1]] if i + 1 < len(ends) else order[:0]

    return of


def _context(c: Candidates, j: int, fid: int, kind: str, pieces: Any, **extra: object) -> dict[str, object]:
    assert c.ctx_tok is not None and c.ctx_act is not None
    valid = c.ctx_tok[j] >= 0
    ids = c.ctx_tok[j][valid].tolist()
    half = c.width // 2
    at = half - int((~valid[:half]).sum())
    return {"feature": fid, "kind": kind, "rank": extra.pop("rank", None), "quantile": extra.pop("quantile", None),
            "lower": extra.pop("lower", None), "upper": extra.pop("upper", None),
            "activation": float(c.act[j]), "window": int(c.window[j]), "position": int(c.pos[j]), "at": at,
            "tokens": pieces(ids), "token_ids": ids, "activations": [float(v) for v in c.ctx_act[j][valid]]}
