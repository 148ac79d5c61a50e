"""`lens-eval`: jlens' lens-quality evaluation (``jlens/eval.py``), several lenses side by side.

An item is a prompt and its ``intermediates`` (words the model should hold in mind there, not say). Each lens
reads the residual stream at one position (the last prompt token) at every block it reads (a Jacobian lens: its
fitted blocks); an intermediate's score under a lens is its best rank there: the smallest rank of any of its
single-token forms (:func:`anatomy_cli.text.targets.single_token_forms`) over those blocks. Ranks are 1-based
(1 + the number of strictly larger logits, as ``lens --stat rank``): jlens' 0-based rank r is r + 1 here, and its
hit ``r < k`` is ``rank <= k``. pass@k: the mean over the items of the fraction of an item's intermediates whose
best rank is at most k; an intermediate with no single-token form is a miss, counted in the fraction.

Pure functions over logits; no model. No torch at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    import torch

KS = (1, 5, 10)  # jlens' DEFAULT_KS


@dataclass(frozen=True)
class WordScore:
    """One intermediate: ``token_ids`` its single-token forms (empty: none, a miss under every lens); per lens
    (in the result's lens order) ``ranks`` the best 1-based rank and ``blocks`` the block reaching it first
    (None without a form)."""

    word: str
    token_ids: tuple[int, ...]
    ranks: tuple[int | None, ...]
    blocks: tuple[int | None, ...]


@dataclass(frozen=True)
class ItemScore:
    """One scored item: its prompt, the readout position (0-based, of the encoded prompt) and its words."""

    prompt: str
    position: int
    words: tuple[WordScore, ...]

    def hits(self, lens: int, k: int) -> float:
        """The fraction of this item's intermediates whose best rank under lens ``lens`` is at most ``k``."""
        ranks = [w.ranks[lens] for w in self.words]
        return sum(r is not None and r <= k for r in ranks) / len(ranks)


@dataclass(frozen=True)
class LensEval:
    """The evaluation of ``lenses`` (their ``--lens`` texts; ``labels``: the JSON keys and tsv columns naming
    them) on the set ``name``. ``blocks[j]``: the blocks lens j reads; ``items``: the scored items (an item with
    no intermediates is not scored: ``skipped``)."""

    name: str
    lenses: tuple[str, ...]
    labels: tuple[str, ...]
    blocks: tuple[tuple[int, ...], ...]
    items: tuple[ItemScore, ...]
    skipped: int = 0
    ks: tuple[int, ...] = KS

    def pass_at(self, lens: int, k: int) -> float:
        """pass@k of lens ``lens``: the mean over the items of :meth:`ItemScore.hits` (0.0 without items)."""
        return sum(i.hits(lens, k) for i in self.items) / len(self.items) if self.items else 0.0

    @property
    def no_form(self) -> tuple[str, ...]:
        """The intermediates (each once, in order) with no single-token form."""
        return tuple(dict.fromkeys(w.word for i in self.items for w in i.words if not w.token_ids))

    @property
    def n_words(self) -> int:
        return sum(len(i.words) for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        lenses = [{"lens": lens, "label": label, "blocks": list(blocks),
                   **{f"pass_at_{k}": self.pass_at(j, k) for k in self.ks}}
                  for j, (lens, label, blocks) in enumerate(zip(self.lenses, self.labels, self.blocks))]
        items = [{"prompt": item.prompt, "position": item.position, "pass_at_1": {
                     label: item.hits(j, 1) for j, label in enumerate(self.labels)},
                  "intermediates": [{"word": w.word, "token_ids": list(w.token_ids),
                                     "rank": dict(zip(self.labels, w.ranks)),
                                     "block": dict(zip(self.labels, w.blocks))} for w in item.words]}
                 for item in self.items]
        return {"set": self.name, "n_items": len(self.items), "skipped_items": self.skipped,
                "n_intermediates": self.n_words, "no_single_token": list(self.no_form), "ks": list(self.ks),
                "lenses": lenses, "items": items}


def best_rank(logits: torch.Tensor, token_ids: Sequence[int], blocks: Sequence[int]) -> tuple[int | None, int | None]:
    """``logits [n_blocks, vocab]`` (row i: block ``blocks[i]``, one position) -> ``(rank, block)``: the smallest
    1-based rank of any of ``token_ids`` over the rows (1 + the number of strictly larger logits in its row), and
    the first block reaching it; ``(None, None)`` without ids."""
    if not token_ids:
        return None, None
    import torch

    rows = logits.float()
    chosen = rows[:, list(token_ids)]  # [n_blocks, n_ids]
    ranks = (rows[:, None, :] > chosen[:, :, None]).sum(-1).min(dim=1).values  # [n_blocks]
    best = int(torch.argmin(ranks))  # the first minimum: the earliest block
    return int(ranks[best]) + 1, int(blocks[best])

