"""Generation traces: the token rule (greedy or sampling), each step's record, the lens summary, and the
coefficient sweep's shift and KL.

Pure functions over logits; no model. Probabilities are a float64 softmax over the whole vocabulary
(:func:`anatomy_cli.analyses.next_token.log_probs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from anatomy_cli.analyses.next_token import Describe
from anatomy_cli.analyses.next_token import TokenProb
from anatomy_cli.analyses.next_token import _token_prob
from anatomy_cli.analyses.next_token import log_probs
from anatomy_cli.analyses.next_token import rank_of
from anatomy_cli.analyses.next_token import top_k
from anatomy_cli.errors import UsageError


def check_sampling(temperature: float, top_p: float) -> None:
    """UsageError for temperature <= 0 or top_p outside (0, 1] (needs no model)."""
    if not temperature > 0:
        raise UsageError(f"--temperature must be > 0 (got {temperature}); greedy decoding is the default")
    if not 0 < top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1] (got {top_p})")


def sampler(*, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None
            ) -> Callable[[torch.Tensor], int]:
    """A token rule that samples from ``softmax(logits / temperature)`` restricted to the nucleus: the most
    probable tokens whose probabilities sum to at least ``top_p`` (always the top one). ``seed`` fixes the
    draws (a torch.Generator of its own; None: a random seed; torch's global generator is never touched).
    Raises UsageError for temperature <= 0 or top_p outside (0, 1]."""
    check_sampling(temperature, top_p)
    gen = torch.Generator()
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()

    def choose(logits: torch.Tensor) -> int:
        probs = torch.softmax(logits.to("cpu", torch.float64) / temperature, dim=-1)
        order = torch.argsort(probs, descending=True)
        sorted_p = probs[order]
        keep = int((torch.cumsum(sorted_p, 0) < top_p).sum()) + 1   # the smallest prefix reaching top_p
        kept = sorted_p[:keep]
        return int(order[int(torch.multinomial(kept / kept.sum(), 1, generator=gen))])

    return choose


@dataclass(frozen=True)
class Step:
    """One generated token: ``chosen`` (its rank, probability and log-probability in the distribution it was
    drawn from), the ``top`` k, and with ``--lens`` the chosen token's probability under the logit lens of
    each block's output (``lens``, layer order) and ``first_top1_layer``: the first block whose lens ranks it
    first (None: none does, possible when sampling)."""

    step: int
    chosen: TokenProb
    top: tuple[TokenProb, ...]
    lens: tuple[float | None, ...] | None = None  # None at a block a fitted lens was not fitted at
    first_top1_layer: int | None = None

    def to_dict(self) -> dict[str, object]:
        out = {"step": self.step, **self.chosen.to_dict(), "top": [t.to_dict() for t in self.top]}
        if self.lens is not None:
            out["lens"] = list(self.lens)  # null where a fitted lens has no reading
            out["first_top1_layer"] = self.first_top1_layer
        return out


def steps(logits: torch.Tensor, tokens: Sequence[int], k: int, describe: Describe, *,
          lens_logprob: torch.Tensor | None = None, lens_top: torch.Tensor | None = None) -> list[Step]:
    """The :class:`Step` records of a generation: ``logits [steps, vocab]``, ``tokens`` the chosen ids;
    ``lens_logprob``/``lens_top`` ``[steps, n_layers]`` from the engine's ``lens``."""
    out = []
    for s, token in enumerate(tokens):
        logp = log_probs(logits[s])
        chosen = _token_prob(rank_of(logp, token), token, float(logp[token]), describe)
        lens = first = None
        if lens_logprob is not None and lens_top is not None:
            lens = tuple(None if math.isnan(x) else math.exp(x) for x in lens_logprob[s].tolist())
            hits = [layer for layer, t in enumerate(lens_top[s].tolist()) if t == token]
            first = hits[0] if hits else None
        out.append(Step(s, chosen, top_k(logp, k, describe), lens, first))
    return out


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(P ‖ Q) in nats between the softmaxes of two logit vectors ``[vocab]`` (float64)."""
    lp, lq = log_probs(p_logits), log_probs(q_logits)
    return float((lp.exp() * (lp - lq)).sum())


@dataclass(frozen=True)
class SweepRow:
    """One coefficient of a sweep: the continuation, KL(steered ‖ unsteered) of the first next-token
    distribution (after the prompt) in nats, and the target's log-probability there and its shift from
    coefficient 0 (None without ``--target``)."""

    coef: float
    text: str
    n_tokens: int
    kl: float
    target_logprob: float | None
    target_shift: float | None

    def to_dict(self) -> dict[str, object]:
        return {"coef": self.coef, "continuation": self.text, "n_tokens": self.n_tokens, "kl": self.kl,
                "target_logprob": self.target_logprob, "target_shift": self.target_shift}


def sweep_row(coef: float, text: str, n_tokens: int, first: torch.Tensor, base_first: torch.Tensor,
              target_id: int | None) -> SweepRow:
    """A :class:`SweepRow` from the first-step logits of the steered run (``first``) and the unsteered one."""
    lp = tlp = shift = None
    if target_id is not None:
        lp = log_probs(first)
        tlp = float(lp[target_id])
        shift = tlp - float(log_probs(base_first)[target_id])
    return SweepRow(coef, text, n_tokens, kl(first, base_first), tlp, shift)


@dataclass(frozen=True)
class Continuation:
    """One prompt's generation as ``generate`` reports it: the text, the generated ids, why it stopped
    (``eos``, ``max_new_tokens``, ``context``) and the :class:`Step` records (with ``--lens``, each step's
    ``lens`` is the chosen token's probability per block: the layer x step grid ``--plot`` draws)."""

    text: str
    token_ids: tuple[int, ...]
    stopped: str
    steps: tuple[Step, ...]

    def to_dict(self) -> dict[str, object]:
        return {"continuation": self.text, "generated_ids": list(self.token_ids), "stopped": self.stopped,
                "steps": [st.to_dict() for st in self.steps]}

    def lens_grid(self) -> list[list[float]]:
        """``[blocks][steps]``: the chosen token's lens probability at block l's output, step s (needs ``--lens``)."""
        if not self.steps or self.steps[0].lens is None:
            raise ValueError("this generation ran without the lens (--lens)")
        return [list(col) for col in zip(*(st.lens or () for st in self.steps))]


@dataclass(frozen=True)
class Sweep:
    """A coefficient sweep: one :class:`SweepRow` per coefficient (in the order given) and the display form of
    the ``--target`` token (None without one)."""

    rows: tuple[SweepRow, ...]
    target: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"sweep": [r.to_dict() for r in self.rows]}

    def points(self) -> tuple[list[float], list[float], list[float | None]]:
        """The coefficients in increasing order with their KL and target shift (what ``--plot`` draws)."""
        rows = sorted(self.rows, key=lambda r: r.coef)
        return [r.coef for r in rows], [r.kl for r in rows], [r.target_shift for r in rows]
