"""`route`: which experts each token is routed to in each MoE block, with what weights, and how close to a flip.

From one block's router logits ``[pos, n_experts]`` and the chosen experts and weights the block applies
(:func:`anatomy_cli.engine.moe.route`): per position the chosen experts in weight order, their weights, the
router's entropy (nats, over the softmax of every router logit, float64) and the margin between the k-th and
the (k+1)-th router probability (None when every expert is chosen). A margin below :data:`NEAR_TIE` is a
near-tie: a perturbation that small (a quantized weight, another dtype) can swap the k-th expert for the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEAR_TIE = 0.01
"""A margin (difference of router probabilities) below this is flagged ``near_tie``."""


@dataclass(frozen=True)
class RouteRow:
    block: int
    position: int
    token: str
    experts: tuple[int, ...]      # the chosen experts, heaviest first (the first ``top`` of them)
    weights: tuple[float, ...]    # the weights the block applies to them
    entropy: float                # nats, over the softmax of all router logits
    margin: float | None          # p_(k) - p_(k+1) of the router probabilities; None: all experts chosen
    near_tie: bool

    def to_dict(self) -> dict[str, object]:
        return {"block": self.block, "position": self.position, "token": self.token,
                "experts": list(self.experts), "weights": list(self.weights), "entropy": self.entropy,
                "margin": self.margin, "near_tie": self.near_tie}


def block_rows(block: int, logits: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
               pieces: list[str], top: int | None = None, near_tie: float = NEAR_TIE) -> list[RouteRow]:
    """One row per position of one block. ``logits`` ``[pos, n_experts]``; ``indices``/``weights``
    ``[pos, k]`` as the block applied them (descending); ``top``: keep the first ``top`` experts (None: all k)."""
    k = indices.shape[-1]
    probs = torch.softmax(logits.detach().to("cpu", torch.float64), dim=-1)
    entropy = -(probs * torch.log(probs.clamp_min(torch.finfo(torch.float64).tiny))).sum(-1)
    ranked = probs.sort(dim=-1, descending=True).values
    margins = (ranked[:, k - 1] - ranked[:, k]).tolist() if probs.shape[-1] > k else [None] * len(pieces)
    keep = k if top is None else min(top, k)
    idx, w = indices[:, :keep].tolist(), weights[:, :keep].double().tolist()
    return [RouteRow(block, pos, pieces[pos], tuple(idx[pos]), tuple(w[pos]), float(entropy[pos]), m,
                     m is not None and m < near_tie)
            for pos, m in enumerate(margins)]
