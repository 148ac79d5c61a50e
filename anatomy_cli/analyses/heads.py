"""`anatomy heads`: what each attention head does, as five scores per (layer, head).

Definitions (docs/commands/heads.md gives the sources: Olsson et al. 2022, "In-context Learning
and Induction Heads", and TransformerLens's head detector, ``transformer_lens/head_detector.py``).
For a pattern ``A`` (query × key, rows summing to 1) over positions ``0..n-1``:

* ``entropy``: ``-Σ_k A[q, k] ln A[q, k]`` in nats, mean over queries ``q = 1..n-1``;
* ``first_token``: ``A[q, 0]``, the mass on position 0 (the "attention sink"), mean over ``q = 1..n-1``;
* ``prev_token``: ``A[q, q-1]``, mean over ``q = 1..n-1``.

Query 0 is left out of all three: in a causal model it can only attend to itself. On ``r r``,
``seq_len`` distinct random tokens repeated (starting at position ``start``), for each query
``q = start + seq_len + j`` of the second copy (``j = 0..seq_len-1``):

* ``induction``: ``A[q, start + j + 1]``, the token after the earlier occurrence, mean over ``j``;
* ``duplicate_token``: ``A[q, start + j]``, the earlier occurrence itself, mean over ``j``.

Pure: tensors in, frozen results out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass

import torch

from anatomy_cli.errors import UsageError

SCORES = ("entropy", "first_token", "prev_token", "induction", "duplicate_token")


def random_repeat(candidates: Sequence[int], seq_len: int, seed: int) -> list[int]:
    """``seq_len`` distinct ids drawn from ``candidates`` with ``torch.Generator().manual_seed(seed)``, twice.

    Returns ``2 * seq_len`` ids. Distinct, so each token of the second copy has exactly one earlier
    occurrence. Raises UsageError when ``seq_len`` < 2 or exceeds ``len(candidates)``.
    """
    if seq_len < 2:
        raise UsageError(f"--seq-len must be at least 2, got {seq_len}")
    if seq_len > len(candidates):
        raise UsageError(f"--seq-len {seq_len} is more than the {len(candidates)} ordinary tokens to draw from")
    g = torch.Generator().manual_seed(seed)
    picked = [int(candidates[j]) for j in torch.randperm(len(candidates), generator=g)[:seq_len].tolist()]
    return picked + picked


def pattern_scores(pattern: torch.Tensor) -> torch.Tensor:
    """``[3, n_heads]``: entropy (nats), first_token, prev_token of ``pattern [n_heads, n, n]`` (n >= 2)."""
    a = pattern[:, 1:]                                           # queries 1..n-1: [heads, n-1, n], a view
    # One head at a time: a temporary of one head's pattern, not a second copy of the layer's.
    entropy = torch.stack([torch.special.entr(a[h]).sum(-1, dtype=torch.float64).mean() for h in range(len(a))])
    first = a[:, :, 0].double().mean(-1)
    prev = torch.diagonal(a, dim1=1, dim2=2).double().mean(-1)   # a[:, q-1, q-1] = A[q, q-1]
    return torch.stack([entropy, first, prev]).float()


def repeat_scores(pattern: torch.Tensor, *, start: int, seq_len: int) -> torch.Tensor:
    """``[2, n_heads]``: induction and duplicate_token of ``pattern [n_heads, n, n]`` on a repeated sequence."""
    j = torch.arange(seq_len)
    q = start + seq_len + j
    induction = pattern[:, q, start + j + 1].double().mean(-1)
    duplicate = pattern[:, q, start + j].double().mean(-1)
    return torch.stack([induction, duplicate]).float()


@dataclass(frozen=True)
class HeadScores:
    """The five scores of one head (see the module docstring); entropy in nats, the others in [0, 1]."""

    layer: int
    head: int
    entropy: float
    first_token: float
    prev_token: float
    induction: float
    duplicate_token: float


@dataclass(frozen=True)
class Heads:
    """One :class:`HeadScores` per (layer, head), in ``sort`` order, at most ``top`` of them.

    ``measured_on``: ``prompt`` when entropy/first_token/prev_token come from the prompt,
    ``random`` when from the repeated random sequence. ``random_token_ids``: the ``seq_len`` ids
    of one copy. ``n_heads_total``: rows before ``top``.
    """

    rows: tuple[HeadScores, ...]
    measured_on: str
    seq_len: int
    seed: int
    random_token_ids: tuple[int, ...]
    sort: str | None
    n_heads_total: int

    def to_dict(self) -> dict[str, object]:
        return {"measured_on": self.measured_on, "seq_len": self.seq_len, "seed": self.seed,
                "random_token_ids": list(self.random_token_ids), "sort": self.sort,
                "n_heads_total": self.n_heads_total, "heads": [asdict(r) for r in self.rows]}


def heads(pattern: torch.Tensor, repeat: torch.Tensor, *, measured_on: str, seq_len: int, seed: int,
          random_token_ids: Sequence[int], sort: str | None = None, top: int | None = None) -> Heads:
    """Scores per head from ``pattern [n_layers, 3, n_heads]`` (:func:`pattern_scores` per layer) and
    ``repeat [n_layers, 2, n_heads]`` (:func:`repeat_scores` per layer).

    ``sort``: a score name, descending (``entropy``: ascending, the sharpest heads first);
    None keeps layer, head order. ``top``: keep the first N. Raises UsageError for an unknown
    ``sort`` or ``top`` < 1, ValueError when the shapes disagree.
    """
    if sort is not None and sort not in SCORES:
        raise UsageError(f"unknown --sort '{sort}'; use one of {', '.join(SCORES)}")
    if top is not None and top < 1:
        raise UsageError(f"--top must be at least 1, got {top}")
    if pattern.dim() != 3 or pattern.shape[1] != 3 or repeat.shape != (pattern.shape[0], 2, pattern.shape[2]):
        raise ValueError(f"scores are {tuple(pattern.shape)} and {tuple(repeat.shape)}; expected [L, 3, H], [L, 2, H]")
    both = torch.cat([pattern, repeat], dim=1).tolist()
    rows = [HeadScores(layer, head, *(both[layer][s][head] for s in range(5)))
            for layer in range(len(both)) for head in range(len(both[layer][0]))]
    if sort is not None:
        sign = 1.0 if sort == "entropy" else -1.0
        rows.sort(key=lambda r: sign * getattr(r, sort))  # stable: ties keep layer, head order
    return Heads(rows=tuple(rows[:top] if top else rows), measured_on=measured_on, seq_len=seq_len, seed=seed,
                 random_token_ids=tuple(random_token_ids), sort=sort, n_heads_total=len(rows))
