"""``corpus --experts``: expert load over a corpus, per MoE block, as additive counts and sums.

Per MoE block (``info.moe.sparse_blocks``) and batch of windows, from the block's ``hook_expert_indices`` and
``hook_expert_weights`` ``[batch, pos, k]`` (the experts the block chose and the weights it applied:
:func:`anatomy_cli.engine.moe.route`), :class:`ExpertSums` keeps

* ``tokens [B]`` (int64): the token positions routed (every position of every window), ``k`` slots each;
* ``slots [B, E]`` (int64): how many of those slots went to each expert;
* ``weight [B, E]`` (float64): the sum of the weights applied to each expert when chosen;
* ``pairs [B, E, E]`` (int64): how many positions chose both experts a and b (symmetric; the diagonal is
  ``slots``).

Counts are integers, so they merge exactly in any order; the weight sums are float64 sums of each batch's
float64 sum (on the CPU, deterministic), merged in shard order like every other corpus sum
(:mod:`anatomy_cli.corpus.partial`). :func:`summarize` turns them into the figures: ``load`` = slots / (tokens
· k) (the fraction of the block's token slots routed to the expert; a block's loads add up to 1),
``mean_weight`` = weight / slots, per block ``load_max_over_mean`` = max slots / mean slots and ``load_cv`` =
the coefficient of variation of the slots over experts (population standard deviation / mean), and per pair
``count`` and ``share`` = count / tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from anatomy_cli.models import sites

BLOCK_COLUMNS = ("block", "tokens", "top_k", "n_experts", "load_max_over_mean", "load_cv", "busiest_expert",
                 "idle_experts")
EXPERT_COLUMNS = ("block", "expert", "slots", "load", "mean_weight")
PAIR_COLUMNS = ("block", "expert_a", "expert_b", "count", "share")
INT_COLUMNS = ("block", "tokens", "top_k", "n_experts", "busiest_expert", "idle_experts", "expert", "slots",
               "expert_a", "expert_b", "count")
METRICS = ("expert_tokens", "expert_slots", "expert_pairs")
"""The shard table's metric names: ``index`` the block, block·E + expert, (block·E + a)·E + b (a < b)."""


@dataclass
class ExpertSums:
    """The sums of the module docstring for ``blocks`` (the MoE blocks, in order), ``n_experts`` each, ``top_k``
    chosen per position."""

    blocks: tuple[int, ...]
    n_experts: int
    top_k: int
    tokens: np.ndarray
    slots: np.ndarray
    weight: np.ndarray
    pairs: np.ndarray

    @classmethod
    def empty(cls, blocks: tuple[int, ...], n_experts: int, top_k: int) -> ExpertSums:
        b, e = len(blocks), n_experts
        return cls(tuple(blocks), e, top_k, np.zeros(b, np.int64), np.zeros((b, e), np.int64),
                   np.zeros((b, e), np.float64), np.zeros((b, e, e), np.int64))

    def names(self) -> list[str]:
        """The hook points to capture: per MoE block its chosen experts and their weights."""
        return [sites.name(b, p) for b in self.blocks for p in (sites.Point.expert_indices, sites.Point.expert_weights)]

    def add(self, store: dict[str, Any]) -> None:
        """Add one batch: ``store`` holds :meth:`names`, each ``[batch, pos, k]`` (every position counted)."""
        import torch

        for row, b in enumerate(self.blocks):
            idx = store[sites.name(b, sites.Point.expert_indices)].detach().cpu().reshape(-1, self.top_k)
            w = store[sites.name(b, sites.Point.expert_weights)].detach().cpu().double().reshape(-1, self.top_k)
            chosen = torch.zeros(idx.shape[0], self.n_experts, dtype=torch.float64).scatter_(1, idx, 1.0)
            weights = torch.zeros_like(chosen).scatter_(1, idx, w)
            self.tokens[row] += idx.shape[0]
            self.slots[row] += chosen.sum(0).numpy().astype(np.int64)
            self.weight[row] += weights.sum(0).numpy()
            self.pairs[row] += (chosen.T @ chosen).numpy().astype(np.int64)   # 0/1 products: exact integers

    def merge(self, other: ExpertSums) -> ExpertSums:
        """``self`` followed by ``other``, in place; returns self."""
        if (other.blocks, other.n_experts, other.top_k) != (self.blocks, self.n_experts, self.top_k):
            raise ValueError("expert sums of another model cannot be merged")
        self.tokens = self.tokens + other.tokens
        self.slots = self.slots + other.slots
        self.weight = self.weight + other.weight
        self.pairs = self.pairs + other.pairs
        return self

    def copy(self) -> ExpertSums:
        return ExpertSums(self.blocks, self.n_experts, self.top_k, self.tokens.copy(), self.slots.copy(),
                          self.weight.copy(), self.pairs.copy())

    # ---- the shard table's rows (metric, index, n, sum) and the metadata that reads them back
    def meta(self) -> dict[str, Any]:
        return {"blocks": list(self.blocks), "n_experts": self.n_experts, "top_k": self.top_k}

    def rows(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        e = self.n_experts
        blocks = np.asarray(self.blocks, np.int64)
        a, b = np.triu_indices(e, 1)
        row, pair = np.nonzero(self.pairs[:, a, b])
        index = np.concatenate([blocks, (blocks[:, None] * e + np.arange(e)).ravel(),
                                (blocks[row] * e + a[pair]) * e + b[pair]])
        n = np.concatenate([self.tokens, self.slots.ravel(), self.pairs[row, a[pair], b[pair]]])
        total = np.concatenate([np.zeros(len(blocks)), self.weight.ravel(), np.zeros(len(row))])
        metric = [METRICS[0]] * len(blocks) + [METRICS[1]] * self.slots.size + [METRICS[2]] * len(row)
        return metric, index.astype(np.int64), n.astype(np.int64), total.astype(np.float64)

    @classmethod
    def from_rows(cls, meta: dict[str, Any], names: np.ndarray, index: np.ndarray, n: np.ndarray,
                  total: np.ndarray) -> ExpertSums:
        sums = cls.empty(tuple(meta["blocks"]), meta["n_experts"], meta["top_k"])
        e = sums.n_experts
        row_of = np.full(max(sums.blocks, default=0) + 1, -1, np.int64)
        row_of[list(sums.blocks)] = np.arange(len(sums.blocks))
        at = names == METRICS[0]
        sums.tokens[row_of[index[at]]] = n[at]
        at = names == METRICS[1]
        rows, cols = row_of[index[at] // e], index[at] % e
        sums.slots[rows, cols], sums.weight[rows, cols] = n[at], total[at]
        diag = np.arange(e)
        sums.pairs[:, diag, diag] = sums.slots
        at = names == METRICS[2]
        rows, a, b = row_of[index[at] // (e * e)], index[at] // e % e, index[at] % e
        sums.pairs[rows, a, b] = n[at]
        sums.pairs[rows, b, a] = n[at]
        return sums


def summarize(sums: ExpertSums) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(blocks, experts, pairs)``: the rows of :data:`BLOCK_COLUMNS`, :data:`EXPERT_COLUMNS` and
    :data:`PAIR_COLUMNS` (pairs a < b that were chosen together at least once, by block, then a, then b)."""
    blocks, experts, pairs = [], [], []
    a, b = np.triu_indices(sums.n_experts, 1)
    for row, block in enumerate(sums.blocks):
        tokens, slots = int(sums.tokens[row]), sums.slots[row]
        mean = slots.mean()
        blocks.append({"block": block, "tokens": tokens, "top_k": sums.top_k, "n_experts": sums.n_experts,
                       "load_max_over_mean": float(slots.max() / mean) if mean else None,
                       "load_cv": float(slots.std() / mean) if mean else None,
                       "busiest_expert": int(slots.argmax()) if mean else None,
                       "idle_experts": int((slots == 0).sum())})
        for e, s in enumerate(slots.tolist()):
            experts.append({"block": block, "expert": e, "slots": s,
                            "load": s / (tokens * sums.top_k) if tokens else None,
                            "mean_weight": float(sums.weight[row, e] / s) if s else None})
        counts = sums.pairs[row, a, b]
        for i in np.nonzero(counts)[0].tolist():
            pairs.append({"block": block, "expert_a": int(a[i]), "expert_b": int(b[i]), "count": int(counts[i]),
                          "share": int(counts[i]) / tokens})
    return blocks, experts, pairs
