"""The logit lens at every layer and position: a grid of next-token distributions.

The grid's rows are the residual stream's readings, named as everywhere (docs/engine.md#layers): ``embed``
(the embedding), then N = block N's output (raw, before the final norm), the last being block L−1; each is
read through the final norm (its
statistics recomputed from that vector) and the unembedding. The grid is data, as tuned-lens's
``PredictionTrajectory``: :class:`LensGrid` keeps, per cell, the top tokens, the entropy, the KL
divergence from the final layer and a target token's rank, and offers them as statistics
(:meth:`LensGrid.stat`); tables and pictures read the same object.

The grid is computed in blocks of positions, every layer of a block in one batched product of at most
``max_elements`` logits (at least one position), so the peak memory is bounded by a block whatever
the prompt's length; the statistics are float64 on the CPU, whatever the model's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace

import torch

from anatomy_cli.analyses.next_token import Describe
from anatomy_cli.models.sites import residual_label
from anatomy_cli.text.records import token_record

STATS = ("prob", "logprob", "rank", "entropy", "kl")
"""What :meth:`LensGrid.stat` returns per cell: the top token's probability or natural-log
probability, the target's 1-based rank, the entropy (nats), KL(final || layer) (nats)."""


@dataclass(frozen=True)
class LensGrid:
    """The logit lens over ``layers`` x ``positions``; tensors are ``[rows, pos]`` (``[rows, pos, k]``).
    ``layers`` names the rows (:func:`anatomy_cli.models.sites.residual_label`: ``embed``, then blocks 0..L−1).

    ``top_ids``/``top_logprobs``: the k most probable tokens of each cell, best first (natural log).
    ``entropies``: entropy of each cell's distribution in nats. ``kls``: KL(final || layer) in nats,
    the final distribution being the last block's at the same position (0 on that row). ``target_*``: the
    target token's natural-log probability and 1-based rank (1 + the number of strictly more
    probable tokens), None without a target. ``target_first_layer[p]``: the first row's name (``embed`` or a
    block; over all rows, also those :meth:`select` leaves out) whose top-1 token is the target, None if none.
    ``top_tokens[r][p][i]``: the display form of ``top_ids[r, p, i]``; ``top_texts`` the decoded text
    (None for a partial UTF-8 piece). ``k_given``: whether ``top`` lists belong in :meth:`to_dict`. ``lens``: the
    lens's kind (``logit``, ``jacobian``, ``tuned``), ``lens_source`` its file or directory, ``unfitted`` the rows
    (``embed`` or blocks) a fitted lens has no reading for, which the grid leaves out.
    """

    layers: tuple[int | str, ...]
    positions: tuple[int, ...]
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    entropies: torch.Tensor
    kls: torch.Tensor
    top_tokens: tuple[tuple[tuple[str, ...], ...], ...]
    top_texts: tuple[tuple[tuple[str | None, ...], ...], ...]
    target_id: int | None = None
    target_token: str | None = None
    target_text: str | None = None
    target_logprobs: torch.Tensor | None = None
    target_ranks: torch.Tensor | None = None
    target_first_layer: tuple[int | str | None, ...] | None = None
    k_given: bool = False
    lens: str = "logit"
    lens_source: str | None = None
    unfitted: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        shape = (len(self.layers), len(self.positions))
        for name in ("entropies", "kls", "target_logprobs", "target_ranks"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
        if tuple(self.top_ids.shape[:2]) != shape or self.top_ids.shape != self.top_logprobs.shape:
            raise ValueError(f"top_ids/top_logprobs must be {list(shape)} + [k]")

    # ---- statistics, one value per cell: float64 [rows, pos] (rank: int64)
    def probability(self) -> torch.Tensor:
        """The top-1 token's probability in [0, 1]."""
        return self.top_logprobs[..., 0].exp()

    def logprob(self) -> torch.Tensor:
        """The top-1 token's natural-log probability (<= 0)."""
        return self.top_logprobs[..., 0]

    def entropy(self) -> torch.Tensor:
        """Entropy of the cell's distribution, nats, in [0, log(vocab)]."""
        return self.entropies

    def kl(self) -> torch.Tensor:
        """KL(final || layer), nats, >= 0; 0 on the last layer."""
        return self.kls

    def rank(self) -> torch.Tensor:
        """The target's 1-based rank. Raises ValueError without a target."""
        if self.target_ranks is None:
            raise ValueError("rank needs a target token")
        return self.target_ranks

    def stat(self, name: str) -> torch.Tensor:
        """One of :data:`STATS` by name: ``[rows, pos]``."""
        methods: dict[str, Callable[[], torch.Tensor]] = {
            "prob": self.probability, "logprob": self.logprob, "rank": self.rank, "entropy": self.entropy,
            "kl": self.kl}
        if name not in methods:
            raise ValueError(f"unknown statistic {name!r}; use one of {', '.join(STATS)}")
        return methods[name]()

    def select(self, layers: Sequence[int | str]) -> LensGrid:
        """The rows named ``layers`` (values of :attr:`layers`: ``embed`` or blocks, in the order given)."""
        index = [self.layers.index(l) for l in layers]
        pick = lambda t: None if t is None else t[index]
        return replace(self, layers=tuple(layers), top_ids=self.top_ids[index], top_logprobs=self.top_logprobs[index],
                       entropies=self.entropies[index], kls=self.kls[index],
                       top_tokens=tuple(self.top_tokens[i] for i in index),
                       top_texts=tuple(self.top_texts[i] for i in index),
                       target_logprobs=pick(self.target_logprobs), target_ranks=pick(self.target_ranks))

    def keep_top(self, k: int | None) -> LensGrid:
        """The grid with the first ``k`` top tokens per cell (None: 1, and no ``top`` lists in :meth:`to_dict`),
        e.g. the table's view of a grid computed with more tokens for an HTML page's hover text."""
        n = k or 1
        return replace(self, top_ids=self.top_ids[..., :n], top_logprobs=self.top_logprobs[..., :n],
                       top_tokens=tuple(tuple(cell[:n] for cell in row) for row in self.top_tokens),
                       top_texts=tuple(tuple(cell[:n] for cell in row) for row in self.top_texts),
                       k_given=k is not None)

    def cells(self) -> list[dict[str, object]]:
        """One dict per (layer, position), layer-major: the JSON ``cells`` (see docs/commands/lens.md)."""
        ids, lps = self.top_ids.tolist(), self.top_logprobs.tolist()
        ent, kl = self.entropies.tolist(), self.kls.tolist()
        t_lp = self.target_logprobs.tolist() if self.target_logprobs is not None else None
        t_rank = self.target_ranks.tolist() if self.target_ranks is not None else None
        out = []
        for r, layer in enumerate(self.layers):
            for c, pos in enumerate(self.positions):
                cell: dict[str, object] = {
                    "layer": layer, "position": pos,
                    **token_record(ids[r][c][0], self.top_tokens[r][c][0], self.top_texts[r][c][0]),
                    "probability": math.exp(lps[r][c][0]),
                    "logprob": lps[r][c][0], "entropy": ent[r][c], "kl": kl[r][c]}
                if t_lp is not None and t_rank is not None:
                    cell["target_rank"] = t_rank[r][c]
                    cell["target_probability"] = math.exp(t_lp[r][c])
                if self.k_given:
                    tops, texts = self.top_tokens[r][c], self.top_texts[r][c]
                    cell["top"] = [{"rank": i + 1, **token_record(tid, tops[i], texts[i]),
                                    "probability": math.exp(lp), "logprob": lp}
                                   for i, (tid, lp) in enumerate(zip(ids[r][c], lps[r][c]))]
                out.append(cell)
        return out

    def to_dict(self) -> dict[str, object]:
        target = None
        if self.target_id is not None:
            target = {**token_record(self.target_id, self.target_token or "", self.target_text),
                      "first_layer": list(self.target_first_layer or ())}
        return {"lens": {"kind": self.lens, "source": self.lens_source, "unfitted": list(self.unfitted)},
                "layers": list(self.layers), "positions": list(self.positions), "target": target,
                "cells": self.cells()}


# Logits per chunk: 2**24 float64 values are 128 MiB; GPT-2 small's 13 x 15 rows are 9.8 M.
MAX_ELEMENTS = 2 ** 24


def lens_grid(resid: torch.Tensor, unembed: Callable[[torch.Tensor], torch.Tensor], *, describe: Describe,
              positions: Sequence[int] | None = None, k: int | None = None, target_id: int | None = None,
              max_elements: int = MAX_ELEMENTS, progress: Callable[[int, int], None] | None = None,
              rows: Sequence[int] | None = None) -> LensGrid:
    """The logit lens of every row of ``resid``.

    Args:
        resid: float [n_layers + 1, pos, d_model], the residual stream (row 0 = the embedding, named
            ``embed``; row N + 1 = block N's output before the final norm, named N); the last row is the
            KL reference.
        unembed: ``h [n, d_model] -> logits [n, vocab]``: final norm (statistics from each row)
            and LM head, e.g. ``lambda h: engine.unembed(lm, h)``. Called once on one row (the
            vocabulary's size), then per block of positions: the last layer's rows, then the others.
        describe: ``token_id -> (display, text)``.
        positions: the absolute positions of ``resid``'s columns (default 0..pos-1).
        k: how many top tokens per cell to keep and report (None: 1, and no ``top`` lists).
        target_id: a token whose rank and probability every cell reports.
        max_elements: at most this many logits per ``unembed`` call (at least one position's
            ``n_layers + 1`` rows): the peak memory is a few times this many float64 values.
        progress: ``(positions done, positions)`` after each block.
        rows: the residual row (0 = ``embed``, N + 1 = block N) of each row of ``resid``, in stream order, the
            last one the last block (default ``0 .. n_layers``: every row): a fitted lens reads some rows only.

    Raises ValueError for a resid that is not 3-D (a programming error).
    """
    if resid.ndim != 3:
        raise ValueError(f"resid must be [n_layers + 1, pos, d_model], got {list(resid.shape)}")
    n_rows, n_pos, d_model = resid.shape
    row_ids = tuple(rows) if rows is not None else tuple(range(n_rows))
    if len(row_ids) != n_rows:
        raise ValueError(f"rows names {len(row_ids)} rows; resid has {n_rows}")
    vocab = unembed(resid[-1, :1]).shape[-1]
    kk = min(k or 1, vocab)
    step = max(1, max_elements // (vocab * n_rows))  # positions per block, every layer of them in one product
    blocks: list[dict[str, torch.Tensor]] = []
    for start in range(0, n_pos, step):
        # The peak is one block's logits and statistics, whatever the prompt's length.
        end = min(start + step, n_pos)
        final = _log_softmax(unembed(resid[-1, start:end]))                 # [block, vocab]: the last layer first
        part = [_stats(final, final, kk, target_id)]
        if n_rows > 1:
            flat = resid[:-1, start:end].reshape(-1, d_model)               # layer-major [L * block, d_model]
            part.insert(0, _stats(_log_softmax(unembed(flat)), final, kk, target_id))
        blocks.append({key: torch.cat([q[key] for q in part]).reshape(n_rows, end - start, *part[0][key].shape[1:])
                       for key in part[0]})
        if progress is not None:
            progress(end, n_pos)
    stats = {key: torch.cat([b[key] for b in blocks], dim=1) for key in blocks[0]}

    ids = stats["top_ids"].tolist()
    names = {i: describe(i) for i in {i for row in ids for cell in row for i in cell} | (
        {target_id} if target_id is not None else set())}
    first = None
    if target_id is not None:
        top1 = stats["top_ids"][..., 0] == target_id                # [rows, pos]
        first = tuple(residual_label(row_ids[int(top1[:, p].nonzero()[0])]) if bool(top1[:, p].any()) else None
                      for p in range(n_pos))
    return LensGrid(
        layers=tuple(residual_label(r) for r in row_ids),
        positions=tuple(positions) if positions is not None else tuple(range(n_pos)),
        top_ids=stats["top_ids"], top_logprobs=stats["top_logprobs"], entropies=stats["entropy"],
        kls=stats["kl"],
        top_tokens=tuple(tuple(tuple(names[i][0] for i in cell) for cell in row) for row in ids),
        top_texts=tuple(tuple(tuple(names[i][1] for i in cell) for cell in row) for row in ids),
        target_id=target_id, target_token=names[target_id][0] if target_id is not None else None,
        target_text=names[target_id][1] if target_id is not None else None,
        target_logprobs=stats.get("target_logprob"), target_ranks=stats.get("target_rank"),
        target_first_layer=first, k_given=k is not None)


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.detach().to("cpu", torch.float64), dim=-1)


def _stats(logp: torch.Tensor, final: torch.Tensor, k: int, target_id: int | None) -> dict[str, torch.Tensor]:
    """Per-row statistics of ``logp [n, vocab]``; row i is at position ``i % pos`` of ``final [pos, vocab]``."""
    n_pos, vocab = final.shape
    by_layer = logp.view(-1, n_pos, vocab)
    values, ids = torch.topk(logp, k, dim=-1)
    out = {"top_ids": ids, "top_logprobs": values,
           # p * log p with p = 0 (underflow) is 0: log_softmax of finite logits is finite
           "entropy": -(logp.exp() * logp).sum(-1),
           "kl": (final.exp() * (final - by_layer)).sum(-1).reshape(-1).clamp_min(0.0)}
    if target_id is not None:
        t = logp[:, target_id]
        out["target_logprob"] = t
        out["target_rank"] = (logp > t[:, None]).sum(-1) + 1
    return out
