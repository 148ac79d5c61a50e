"""One batch of equal-length windows through the model: every per-layer and per-head figure, per window.

Layer rows are indexed 0..L here (in the sums; the tables name them ``embed``, then block N for row N + 1,
docs/engine.md#layers): row 0 is the embedding (``blocks.0.hook_resid_pre``), row l the output of block l-1,
raw, before the final norm. For every position of every window:

* the logit lens of row l is ``engine.unembed(lm, h_l)`` (the final norm with statistics from h_l, then the
  LM head); the model's final distribution is row L's. ``kl_nats``: KL(final || lens) in nats,
  ``top1_agree``: 1 when the lens' and the final distribution's most probable tokens agree, ``ce_bits``:
  -log2 p_lens(next token), at positions with a next token in the window (row L: the model's loss),
  ``entropy_nats``: the lens distribution's entropy;
* a fitted lens (``tuned:DIR``, ``jacobian:FILE``) the same figures, from ``engine.unembed`` of its translated
  rows (``FittedLens.transform``), under its kind's keys (``tuned.kl_nats``); the rows it does not read have none;
* ``bytes``: the UTF-8 bytes of the text the windows' tokens cover (``token_bytes[id]`` summed);
* ``resid_norm``: |h_l|; ``cos_to_embedding``: cos(h_l, h_0) (:func:`anatomy_cli.analyses.trace.cosine`);
  ``attn_out_norm`` / ``mlp_out_norm`` at row l: what block l-1's attention / MLP added (row 0: none);
* massive activations: each position's largest |h_l| over dimensions, and its dimension;
* with ``part.experts`` (``--experts``), per MoE block the experts chosen at every position and their weights
  (:class:`~anatomy_cli.corpus.expert_sums.ExpertSums`, from the same forward);
* with heads, per (layer, head) the scores of :func:`anatomy_cli.analyses.heads.pattern_scores` (entropy in
  nats, first-token mass, previous-token mass; queries 1..n-1).

The lens is :func:`anatomy_cli.corpus.lens_sums.lens_sums`: fp32 logits and softmax, every sum over the
vocabulary and over positions accumulated in float64. ``lens_every = N`` measures the lens at the positions
p with ``p ≡ w (mod N)`` in window w (global index), so every position in a window is measured equally
often over N consecutive windows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from anatomy_cli import engine
from anatomy_cli.analyses.heads import pattern_scores
from anatomy_cli.analyses.trace import cosine
from anatomy_cli.corpus.lens_sums import lens_sums
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.partial import lens_metric
from anatomy_cli.engine.fitted_lens import FittedLens
from anatomy_cli.models import sites


def measure(lm: engine.LoadedModel, ids: torch.Tensor, part: Partial, *, first_window: int,
            lenses: Sequence[tuple[str, FittedLens | None]] = (("logit", None),), lens_every: int = 1,
            heads: bool = False, token_bytes: np.ndarray | None = None) -> None:
    """Add the figures of the windows ``ids [batch, T]`` (global indices ``first_window + b``) to ``part``.
    ``lenses``: ``(kind, fitted lens or None for the logit lens)`` each; ``token_bytes``: int64 ``[vocab]``, the
    bytes of text each token id covers (None: no bytes counted)."""
    b, t = ids.shape
    ids = ids.to(lm.device)
    t0 = time.perf_counter()
    names = [*engine.residual_names(lm), *engine.layer_names(lm, "attn_out"), *engine.layer_names(lm, "mlp_out")]
    if part.experts is not None:
        names += part.experts.names()
    with torch.inference_mode(), engine.capture(lm, names) as store:
        # Windows of one batch have one length: no padding, so no mask and default positions (causal LMs only),
        # which keeps sdpa on its causal fast path.
        engine.forward(lm, ids)
    resid = [store[n] for n in engine.residual_names(lm)]
    if part.experts is not None:
        part.experts.add(store)
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
                out = store[sites.name(l - 1, kind)].to(torch.float64)
                layer[f"{kind}_norm"][l] = out.norm(dim=-1).sum(-1).numpy(force=True)
        values, dims = h.abs().max(dim=-1)                               # [b, t]
        part.argmax[l] += torch.bincount(dims.flatten().cpu(), minlength=lm.d_model).numpy()
        best, at = values.max(dim=-1)                                    # first position with the largest
        win_max[:, l] = best.numpy(force=True)
        win_dim[:, l] = dims.gather(1, at[:, None])[:, 0].numpy(force=True)
    del store
    t1 = time.perf_counter()
    lens_out = {lens_metric(kind, metric): value for kind, fitted in lenses
                for metric, value in lens_sums(lm, resid, ids, first_window, lens_every, fitted=fitted).items()}
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
        if lens_out:
            for metric, (sums, counts) in lens_out.items():
                part.add_window(metric, sums[:, w], counts[:, w])
        if head_sums is not None:
            for metric, per_window in head_sums.items():
                part.add_window(metric, per_window[w] * (t - 1), np.full(len(per_window[w]), t - 1))
    part.windows += b
    part.tokens += b * t
    if token_bytes is not None:
        part.bytes += int(token_bytes[ids.cpu().numpy()].sum())
    for key, dt in (("forward", t1 - t0), ("lens", t2 - t1), ("heads", t3 - t2)):
        part.seconds[key] = part.seconds.get(key, 0.0) + dt


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
