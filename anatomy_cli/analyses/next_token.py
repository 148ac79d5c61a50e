"""Next-token distribution: probabilities, log-probabilities, top-k and a target's rank.

Pure functions over a logits vector; no model, no tokenizer. Token strings come
from a caller-supplied ``describe(token_id) -> (display, text)`` function so the
analysis stays independent of the tokenizer.

Probabilities are a float64 ``log_softmax`` over the full vocabulary, whatever
the model's dtype, so they sum to 1 to within float64 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from anatomy_cli.text.records import token_record

Describe = Callable[[int], tuple[str, "str | None"]]
"""``token_id -> (display, text)``: display has visible whitespace (``·much``); text is the decoded
string, None for a piece that is not whole UTF-8 characters."""


@dataclass(frozen=True)
class TokenProb:
    """One candidate token: its 1-based rank, probability in [0, 1] and natural-log probability."""

    rank: int
    token_id: int
    token: str  # display form: visible whitespace, hex bytes for partial UTF-8 pieces
    text: str | None  # decoded text of the token alone; None for a partial UTF-8 piece
    probability: float
    logprob: float

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, **token_record(self.token_id, self.token, self.text),
                "probability": self.probability, "logprob": self.logprob}


@dataclass(frozen=True)
class NextTokens:
    """The next-token distribution after a prompt: the top k and, optionally, a target token."""

    top: tuple[TokenProb, ...]
    target: TokenProb | None = None

    def to_dict(self) -> dict[str, object]:
        return {"top": [t.to_dict() for t in self.top],
                "target": self.target.to_dict() if self.target else None}


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Natural-log probabilities of ``logits`` ([..., vocab], any float dtype) as float64 [..., vocab]."""
    return torch.log_softmax(logits.detach().to("cpu", torch.float64), dim=-1)


def top_k(logp: torch.Tensor, k: int, describe: Describe) -> tuple[TokenProb, ...]:
    """The ``k`` most probable tokens of one distribution (``logp``: float [vocab] log-probabilities).

    ``k`` larger than the vocabulary is clamped to it. Ties keep ``torch.topk``'s order.
    """
    values, ids = torch.topk(logp, min(k, logp.shape[-1]))
    return tuple(_token_prob(rank, int(i), float(v), describe)
                 for rank, (v, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1))


def rank_of(logp: torch.Tensor, token_id: int) -> int:
    """1-based rank of ``token_id`` in ``logp`` [vocab]: 1 + the number of strictly more probable tokens."""
    return int((logp > logp[token_id]).sum()) + 1


def next_tokens(logits: torch.Tensor, k: int, describe: Describe, *, target_id: int | None = None) -> NextTokens:
    """Top-``k`` next tokens from the logits at one position (``logits``: float [vocab]).

    ``target_id``: also report that token's probability and rank.
    """
    logp = log_probs(logits)
    target = None
    if target_id is not None:
        target = _token_prob(rank_of(logp, target_id), target_id, float(logp[target_id]), describe)
    return NextTokens(top=top_k(logp, k, describe), target=target)


def _token_prob(rank: int, token_id: int, logprob: float, describe: Describe) -> TokenProb:
    display, text = describe(token_id)
    return TokenProb(rank=rank, token_id=token_id, token=display, text=text,
                     probability=math.exp(logprob), logprob=logprob)
