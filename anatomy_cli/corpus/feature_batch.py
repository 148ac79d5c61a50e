"""One batch of windows' feature activations added to a shard's :class:`~anatomy_cli.corpus.feature_sums.FeatureSums`.

The activations stay on the model's device for the counts, sums, maxima and co-occurrence; only the firing entries
of the followed features go to the CPU, where they are binned and offered as candidates (top-k, bottom-k samples),
and the contexts of the candidates kept are read back from the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anatomy_cli.corpus.feature_sums import N_BINS
from anatomy_cli.corpus.feature_sums import Candidates
from anatomy_cli.corpus.feature_sums import FeatureSums
from anatomy_cli.corpus.feature_sums import bin_of
from anatomy_cli.corpus.feature_sums import choose
from anatomy_cli.corpus.feature_sums import keys

if TYPE_CHECKING:
    import torch


def add_batch(part: FeatureSums, acts: torch.Tensor, ids: torch.Tensor, first_window: int, *, seed: int,
              delphi: bool = False) -> None:
    """Add ``acts [B, T, d_sae]`` (float32) of windows ``ids [B, T]`` (the first one the run's window
    ``first_window``) to ``part``."""
    import torch

    sel = torch.as_tensor(part.features, device=acts.device)
    a = acts if len(part.features) == acts.shape[-1] else acts.index_select(-1, sel)
    fire = a > 0
    part.tokens += int(ids.numel())
    part.windows += int(ids.shape[0])
    part.fires += fire.sum((0, 1)).cpu().numpy()
    part.sums += a.double().sum((0, 1)).cpu().numpy()
    part.maxes = np.maximum(part.maxes, a.amax((0, 1)).double().cpu().numpy())
    if part.cooc is not None:
        fs = fire.reshape(-1, fire.shape[-1]).float()
        fa = (acts > 0).reshape(-1, acts.shape[-1]).float()
        part.cooc += (fs.T @ fa).round().long().cpu().numpy()
    b, t, f = (x.cpu().numpy() for x in fire.nonzero(as_tuple=True))
    vals = a[fire].cpu().numpy().astype(np.float32)
    window = b + first_window
    fid = part.features[f]
    if delphi:
        part.nonzero.append((np.stack([window, t, fid], 1), vals))
    bins = bin_of(vals)
    np.add.at(part.hist.reshape(-1), f * N_BINS + bins, 1)
    new = Candidates(part.top.width, f, vals, window, t, keys(part_seed(seed), window, t, fid), bins)
    part.top = _offer(part.top, new, "top", part.top_k, a, ids, b, first_window)
    part.samples = _offer(part.samples, new, "sample", part.quantile_size, a, ids, b, first_window)


def part_seed(seed: int) -> int:
    return int(seed) & ((1 << 63) - 1)


def _offer(kept: Candidates, new: Candidates, kind: str, k: int, a: torch.Tensor, ids: torch.Tensor, b: np.ndarray,
           first_window: int) -> Candidates:
    """``kept`` and ``new`` pooled and chosen again (their contexts copied only for the ones chosen); the contexts
    of the new ones chosen read from the batch."""
    import torch

    if not len(new):
        return kept
    new = new.take(choose(new, kind, k))  # a batch's own best first: fewer contexts to read
    chosen = choose(kept.columns(new), kind, k)
    fresh = chosen[chosen >= len(kept)] - len(kept)
    if len(fresh):
        width = kept.width
        half = width // 2
        rows = torch.as_tensor(new.window[fresh] - first_window, device=a.device)
        pos = torch.as_tensor(new.pos[fresh], device=a.device)[:, None] + torch.arange(-half, half + 1,
                                                                                      device=a.device)
        inside = (pos >= 0) & (pos < a.shape[1])
        p = pos.clamp(0, a.shape[1] - 1)
        r = rows[:, None].expand_as(p)
        col = torch.as_tensor(new.fidx[fresh], device=a.device)[:, None].expand_as(p)
        tok = torch.where(inside, ids.to(a.device)[r, p], torch.full_like(p, -1))
        act = torch.where(inside, a[r, p, col], torch.zeros((), device=a.device))
        assert new.ctx_tok is not None and new.ctx_act is not None
        new.ctx_tok[fresh] = tok.cpu().numpy()
        new.ctx_act[fresh] = act.float().cpu().numpy()
    return kept.pick(new, chosen)
