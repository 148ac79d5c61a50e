"""A lens over one batch of windows: per window and layer row, the sums of KL(final || lens), top-1 agreement,
cross-entropy and entropy (the figures are defined in :mod:`anatomy_cli.corpus.measure`). The logit lens reads
every row; a fitted lens (:class:`anatomy_cli.engine.fitted_lens.FittedLens`) reads its own rows, each mapped by
its translator (``FittedLens.transform``) before the same unembed, the last row as it is.

Its floor is the unembedding products, one ``[positions, d_model] x [d_model, vocab]`` per layer row; the
rest is a few fp32 passes over their logits:

* the final norm is applied once per layer row to every measured position of the batch;
* per block of positions, every row's logits come from one product of at most ``max_elements`` fp32 logits
  (at least one position), so the peak memory is bounded by a block whatever the batch;
* per logit row x, with the final row x_f and p_f = softmax(x_f):
  ``lse(x) = max x + log Σ exp(x - max x)``; ``KL = Σ p_f (x_f - x) + lse(x) - lse(x_f)`` (Σ p_f = 1);
  top-1 agreement: argmax x = argmax x_f; cross-entropy: ``(lse(x) - x[next]) / ln 2`` bits; entropy:
  ``log s - Σ e (x - max x) / s`` nats with ``e = exp(x - max x)``, ``s = Σ e``.

Elementwise work (exp, products) is fp32, as the logits; every sum over the vocabulary is accumulated in
float64: fp32 within runs of :data:`RUN` consecutive values, float64 over the runs (no float64 matrix).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from anatomy_cli import engine
from anatomy_cli.engine.fitted_lens import FittedLens

# fp32 logits per block: 2**23 are 32 MiB (SmolLM2: 5 positions x 31 rows); the peak is about twice this.
MAX_ELEMENTS = 2 ** 23
RUN = 16  # values summed in fp32 before the float64 sum over runs (256: lse 10x less exact)
LN2 = math.log(2.0)


def lens_mask(b: int, t: int, first_window: int, every: int) -> torch.Tensor:
    """``[b, t]`` bool: the positions whose logit lens is measured (``p ≡ w (mod every)`` in window w)."""
    p = torch.arange(t)
    w = torch.arange(first_window, first_window + b)
    return (p[None, :] - w[:, None]) % every == 0


METRICS = ("kl_nats", "top1_agree", "ce_bits", "entropy_nats")


def lens_sums(lm: engine.LoadedModel, resid: list[torch.Tensor], ids: torch.Tensor, first_window: int, every: int,
              *, fitted: FittedLens | None = None,
              max_elements: int = MAX_ELEMENTS) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{metric: (sums [L + 1, b], counts [L + 1, b])}`` for :data:`METRICS`; with ``fitted``, the rows it does
    not read have sums and counts 0.

    ``resid``: per residual row (index 0 = the `embed` row, index N + 1 = block N's output), ``[b, t, d_model]``.
    """
    with torch.inference_mode():
        out = _lens_sums(lm, resid, ids, first_window, every, max_elements, fitted)
    if fitted is None:
        return out
    full = {}
    for metric, (sums, counts) in out.items():
        s, n = np.zeros((len(resid), sums.shape[1])), np.zeros((len(resid), sums.shape[1]), np.int64)
        s[list(fitted.rows)], n[list(fitted.rows)] = sums, counts
        full[metric] = (s, n)
    return full


def _lens_sums(lm, resid, ids, first_window, every, max_elements, fitted):
    b, t = ids.shape
    sel = lens_mask(b, t, first_window, every).to(ids.device)
    has_next = sel.clone()
    has_next[:, -1] = False
    window = torch.arange(b, device=ids.device)[:, None].expand(b, t)[sel].cpu()      # [n]
    nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)[sel]                            # next token (last: unused)
    ce_ok = has_next[sel].cpu()
    stacked = torch.stack([r[sel] for r in resid])                                    # [L + 1, n, d]
    read = stacked if fitted is None else fitted.transform(stacked)                  # [rows, n, d]
    rows = read.shape[0]
    normed = engine.final_norm(lm, read)                                              # once
    n, d = normed.shape[1:]
    sums = {m: torch.zeros(rows, b, dtype=torch.float64) for m in METRICS}
    step = max(1, max_elements // (lm.vocab_size * rows))
    for start in range(0, n, step):
        sl = slice(start, min(start + step, n))
        x = engine.unembed(lm, normed[:, sl].reshape(-1, d), normed=True).float()
        kl, top1, ce, entropy = block_stats(x.view(rows, -1, x.shape[-1]), nxt[sl])
        w = window[sl]
        sums["kl_nats"].index_add_(1, w, kl)
        sums["top1_agree"].index_add_(1, w, top1)
        sums["ce_bits"].index_add_(1, w[ce_ok[sl]], ce[:, ce_ok[sl]])
        sums["entropy_nats"].index_add_(1, w, entropy)
    counts = torch.zeros(b, dtype=torch.int64).index_add_(0, window, torch.ones(n, dtype=torch.int64))
    ce_counts = torch.zeros(b, dtype=torch.int64).index_add_(0, window[ce_ok], torch.ones(int(ce_ok.sum()),
                                                                                        dtype=torch.int64))
    lens_n = counts[None].expand(rows, b).numpy()
    ce_n = ce_counts[None].expand(rows, b).numpy()
    return {m: (sums[m].numpy(), ce_n if m == "ce_bits" else lens_n) for m in METRICS}


def block_stats(x: torch.Tensor, nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` fp32 logits ``[rows, k, vocab]`` (the last row the final layer's; overwritten), ``nxt [k]`` the next
    tokens: float64 ``[rows, k]`` KL(final || row) in nats (0 on the last row), top-1 agreement, CE in bits,
    entropy in nats."""
    rows, k, _ = x.shape
    top_v, top_i = x.max(-1)                                                         # [rows, k]
    target = x.gather(2, nxt.view(1, k, 1).expand(rows, k, 1))[..., 0].double()
    final = x[-1]
    e_final = torch.exp(final - top_v[-1, :, None])                                 # p_f * s_f, fp32
    s_final = sum64(e_final)
    # Σ p_f (x_f - x) per row as Σ e_f (x_f - x) / s_f: the normalisation in float64, not by a rounded fp32 1/s_f
    kl = torch.zeros(rows, k, dtype=torch.float64, device=x.device)
    if rows > 1:
        kl[:-1] = sum64(torch.addcmul(e_final * final, e_final, x[:-1], value=-1.0)) / s_final
    shifted = x.sub_(top_v[..., None])                                              # x - max, in place
    e = shifted.exp()
    s = sum64(e)
    lse = top_v.double() + torch.log(s)
    entropy = (torch.log(s) - sum64(shifted.mul_(e)) / s).clamp_min(0.0)           # x is e (x - max) now
    kl[:-1] = (kl[:-1] + lse[:-1] - lse[-1]).clamp_min(0.0)
    top1 = (top_i == top_i[-1]).double()
    ce = (lse - target) / LN2
    return kl.cpu(), top1.cpu(), ce.cpu(), entropy.cpu()


def sum64(x: torch.Tensor) -> torch.Tensor:
    """``x [..., v]`` summed over the last dimension into float64: fp32 over runs of :data:`RUN`, float64 over
    the runs and the rest (a view, no copy of ``x``)."""
    cut = x.shape[-1] // RUN * RUN
    out = x[..., cut:].double().sum(-1)
    if cut:
        out += x[..., :cut].unfold(-1, RUN, RUN).sum(-1).double().sum(-1)
    return out
