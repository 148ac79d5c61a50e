"""One batch of equal-length windows through the model: every per-layer and per-head figure, per window.

Layer rows follow ``trace``/``lens`` (docs/engine.md): row 0 is the embedding (``blocks.0.hook_resid_pre``),
row l the output of block l-1, raw, before the final norm. For every position of every window:

* the logit lens of row l is ``engine.unembed(lm, h_l)`` (the final norm with statistics from h_l, then the
  LM head); the model's final distribution is row L's. ``kl_nats``: KL(final || lens) in nats,
  ``top1_agree``: 1 when the lens' and the final distribution's most probable tokens agree, ``ce_bits``:
  -log2 p_lens(next token), at positions with a next token in the window (row L: the model's loss);
* ``resid_norm``: |h_l|; ``cos_to_embedding``: cos(h_l, h_0) (:func:`anatomy_cli.analyses.trace.cosine`);
  ``attn_out_norm`` / ``mlp_out_norm`` at row l: what block l-1's attention / MLP added (row 0: none);
* massive activations: each position's largest |h_l| over dimensions, and its dimension;
* with heads, per (layer, head) the scores of :func:`anatomy_cli.analyses.heads.pattern_scores` (entropy in
  nats, first-token mass, previous-token mass; queries 1..n-1).

Log-probabilities are float64 (as ``lens``; the logits themselves are in the model's dtype), every sum
float64. ``lens_every = N`` measures the lens at the positions p with ``p ≡ w (mod N)`` in window w (global
index), so every position in a window is measured equally often over N consecutive windows.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from anatomy_cli import engine
from anatomy_cli.analyses.heads import pattern_scores
from anatomy_cli.analyses.trace import cosine
from anatomy_cli.corpus.partial import Partial

# Logits per lens chunk: 2**23 float64 values are 64 MiB (GPT-2 small: 166 positions).
MAX_ELEMENTS = 2 ** 23
LN2 = math.log(2.0)


def measure(lm: engine.LoadedModel, ids: torch.Tensor, part: Partial, *, first_window: int, lens: bool = True,
            lens_every: int = 1, heads: bool = False) -> None:
    """Add the figures of the windows ``ids [batch, T]`` (global indices ``first_window + b``) to ``part``."""
    b, t = ids.shape
    ids = ids.to(lm.device)
    t0 = time.perf_counter()
    names = [*engine.residual_names(lm), *engine.layer_names(lm, "attn_out"), *engine.layer_names(lm, "mlp_out")]
    with torch.inference_mode(), engine.capture(lm, names) as store:
        # Windows of one batch have one length: no padding, so no mask and default positions (causal LMs only),
        # which keeps sdpa on its causal fast path.
        engine.forward(lm, ids)
    resid = [store[n] for n in engine.residual_names(lm)]
    rows = lm.n_layers + 1
    layer = {m: np.zeros((rows, b)) for m in ("resid_norm", "cos_to_embedding", "attn_out_norm", "mlp_out_norm")}
    win_max, win_dim = np.full((b, rows), -np.inf), np.zeros((b, rows), np.int64)
    h0 = resid[0].to(torch.float64)
    for l in range(rows):
        h = resid[l].to(torch.float64)                                   # [b, t, d]
        layer["resid_norm"][l] = h.norm(dim=-1).sum(-1).numpy(force=True)
        layer["cos_to_embedding"][l] = cosine(h, h0).sum(-1).numpy(force=True)
        if l > 0:
            for kind in ("attn_out", "mlp_out"):
                out = store[f"blocks.{l - 1}.hook_{kind}"].to(torch.float64)
                layer[f"{kind}_norm"][l] = out.norm(dim=-1).sum(-1).numpy(force=True)
        values, dims = h.abs().max(dim=-1)                               # [b, t]
        part.argmax[l] += torch.bincount(dims.flatten().cpu(), minlength=lm.d_model).numpy()
        best, at = values.max(dim=-1)                                    # first position with the largest
        win_max[:, l] = best.numpy(force=True)
        win_dim[:, l] = dims.gather(1, at[:, None])[:, 0].numpy(force=True)
    del store
    t1 = time.perf_counter()
    lens_sums = _lens(lm, resid, ids, first_window, lens_every) if lens else None
    t2 = time.perf_counter()
    head_sums = _heads(lm, ids) if heads else None
    t3 = time.perf_counter()

    full = np.full(rows, t)
    blocks = np.r_[0, np.full(rows - 1, t)]
    for w in range(b):
        part.add_window("resid_norm", layer["resid_norm"][:, w], full)
        part.add_window("cos_to_embedding", layer["cos_to_embedding"][:, w], full)
        part.add_window("attn_out_norm", layer["attn_out_norm"][:, w], blocks)
        part.add_window("mlp_out_norm", layer["mlp_out_norm"][:, w], blocks)
        part.add_max(win_max[w], win_dim[w])
        if lens_sums is not None:
            for metric, (sums, counts) in lens_sums.items():
                part.add_window(metric, sums[:, w], counts[:, w])
        if head_sums is not None:
            for metric, sums in head_sums.items():
                part.add_window(metric, sums[w] * (t - 1), np.full(len(sums[w]), t - 1))
    part.windows += b
    part.tokens += b * t
    for key, dt in (("forward", t1 - t0), ("lens", t2 - t1), ("heads", t3 - t2)):
        part.seconds[key] = part.seconds.get(key, 0.0) + dt


def lens_mask(b: int, t: int, first_window: int, every: int) -> torch.Tensor:
    """``[b, t]`` bool: the positions whose logit lens is measured (see the module docstring)."""
    p = torch.arange(t)
    w = torch.arange(first_window, first_window + b)
    return (p[None, :] - w[:, None]) % every == 0


def _lens(lm, resid, ids, first_window, every) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    b, t = ids.shape
    rows = len(resid)
    sel = lens_mask(b, t, first_window, every).to(lm.device)
    has_next = sel.clone()
    has_next[:, -1] = False
    window = torch.arange(b, device=lm.device)[:, None].expand(b, t)[sel]           # [n]
    nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)[sel]                          # next token (last: unused)
    ce_ok = has_next[sel]
    kl, top1, ce = (torch.zeros(rows, b, dtype=torch.float64) for _ in range(3))
    flat = [r[sel] for r in resid]                                                  # [n, d] per row
    n = len(window)
    chunk = max(1, MAX_ELEMENTS // lm.vocab_size)
    win_cpu, ok_cpu = window.cpu(), ce_ok.cpu()
    for start in range(0, n, chunk):
        sl = slice(start, min(start + chunk, n))
        w, ok, tgt = win_cpu[sl], ok_cpu[sl], nxt[sl]
        final = engine.unembed(lm, flat[-1][sl])
        final_top = final.argmax(-1)
        final = final.to(torch.float64)
        final_lse = torch.logsumexp(final, -1)
        p_final = torch.exp(final - final_lse[:, None])
        # KL(final || lens) = Σ p_f (log p_f - log q) with log q = x - logsumexp(x) and Σ p_f = 1:
        # (p_f·x_f - lse_f) - (p_f·x - lse), no [n, vocab] log-softmax per layer (a BLAS dot instead).
        self_dot = _rowdot(p_final, final) - final_lse
        for l in range(rows):
            x = final if l == rows - 1 else engine.unembed(lm, flat[l][sl])
            if l < rows - 1:
                top1[l].index_add_(0, w, (x.argmax(-1) == final_top).to(torch.float64).cpu())
                x = x.to(torch.float64)
                lse = torch.logsumexp(x, -1)
                kl[l].index_add_(0, w, (self_dot - (_rowdot(p_final, x) - lse)).clamp_min(0.0).cpu())
            else:
                lse = final_lse
                top1[l].index_add_(0, w, torch.ones(len(w), dtype=torch.float64))
            nll = (lse - x.gather(1, tgt[:, None])[:, 0]).cpu() / LN2
            ce[l].index_add_(0, w[ok], nll[ok])
    counts = torch.zeros(b, dtype=torch.int64).index_add_(0, win_cpu, torch.ones(n, dtype=torch.int64))
    ce_counts = torch.zeros(b, dtype=torch.int64).index_add_(0, win_cpu[ok_cpu], torch.ones(int(ok_cpu.sum()),
                                                                                          dtype=torch.int64))
    lens_n = counts[None].expand(rows, b).numpy()
    ce_n = ce_counts[None].expand(rows, b).numpy()
    return {"kl_nats": (kl.numpy(), lens_n), "top1_agree": (top1.numpy(), lens_n), "ce_bits": (ce.numpy(), ce_n)}


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[n]``: the dot product of each row of ``a [n, v]`` with the same row of ``b [n, v]`` (batched BLAS)."""
    return torch.bmm(a[:, None, :], b[:, :, None])[:, 0, 0]


def _heads(lm, ids) -> dict[str, list[np.ndarray]]:
    """Per window, ``[L * H]`` means over queries 1..T-1 of each score (a second forward, eager attention)."""
    encs = [engine.encode_ids(lm, row.tolist()) for row in ids.cpu()]
    scores = engine.attention_patterns(lm, encs, reduce=lambda _i, _l, a: pattern_scores(a), batch_size=len(encs))
    out: dict[str, list[np.ndarray]] = {"head_entropy_nats": [], "head_first_token": [], "head_prev_token": []}
    for s in scores:                                                                # [L, 3, H]
        arr = s.to(torch.float64).numpy()
        for k, metric in enumerate(out):
            out[metric].append(arr[:, k, :].reshape(-1))
    return out
