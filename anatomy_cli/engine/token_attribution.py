"""Token attribution with Captum: how much each input token moved a metric of the last position's logits.

The model is run from its input embeddings (``inputs_embeds``: the input embedding module's output,
so Gemma's embedding scale is included; learned positions are added by the model as usual), and the
metric ``f`` of the last position's logits is what Captum explains. Methods (Captum's classes, not
re-derived here), each giving one number per token:

* ``saliency``: ``Saliency`` (``|df/de|``), then the gradient's L2 norm over the embedding width;
* ``input-x-gradient``: ``InputXGradient`` (``e * df/de``), summed over the width;
* ``integrated-gradients``: ``IntegratedGradients`` on the embeddings (what ``LayerIntegratedGradients``
  on the embedding layer computes, with the baseline given in embedding space so that ``zero`` is a
  baseline), summed over the width; its convergence delta is ``sum(attributions) - (f(x) - f(baseline))``;
* ``occlusion``: ``FeatureAblation`` over a per-token keep mask, no gradients, ``batch_size`` occluded
  prompts per forward: ``f(x) - f(x with token i dropped / replaced)``.

Gradients only inside ``engine.gradients.grad_mode`` (weights' requires_grad off, restored after).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from anatomy_cli.engine.forward import forward as model_forward
from anatomy_cli.engine.forward import head_logits
from anatomy_cli.engine.gradients import Metric, grad_mode
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError, UsageError

METHODS = ("saliency", "input-x-gradient", "integrated-gradients", "occlusion")
BASELINES = ("zero", "pad", "unk", "drop")


@dataclass(frozen=True)
class TokenScores:
    """One prompt: ``scores`` float64 ``[pos]``, one per input token; ``metric`` = f(x).

    Integrated gradients: ``baseline_metric`` = f(baseline) and ``delta`` = Captum's convergence delta
    (``scores.sum() - (metric - baseline_metric)``); None for the other methods.
    """

    method: str
    baseline: str | None
    steps: int | None
    scores: torch.Tensor
    metric: float
    baseline_metric: float | None = None
    delta: float | None = None


def embed_forward(lm: LoadedModel, metric: Metric) -> Callable[[torch.Tensor], torch.Tensor]:
    """``embeds [b, pos, d_model] -> metric [b]`` of the logits at the last position (no padding)."""
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read logits from")

    def forward(embeds: torch.Tensor) -> torch.Tensor:
        b, n = embeds.shape[:2]
        mask = torch.ones(b, n, dtype=torch.long, device=embeds.device)
        positions = (torch.arange(n, device=embeds.device) + lm.position_offset)[None].expand(b, -1)
        hidden = model_forward(lm, inputs_embeds=embeds, attention_mask=mask, position_ids=positions)
        return metric(head_logits(lm, hidden[:, -1]))

    return forward


def baseline_id(lm: LoadedModel, baseline: str) -> int:
    """The token that stands in for every token: ``pad`` (the pad token, else EOS) or ``unk``."""
    if baseline == "pad":
        return lm.tokenizer.pad_id
    unk = getattr(lm.tokenizer.hf, "unk_token_id", None)
    if unk is None:
        raise UsageError(f"{lm.name}'s tokenizer has no unknown token: use --baseline zero or pad")
    return int(unk)


def attribute_tokens(lm: LoadedModel, ids: Sequence[int], metric: Metric, method: str, *, steps: int = 32,
                     baseline: str | None = None, batch_size: int = 32) -> TokenScores:
    """Attribute ``metric`` (logits ``[n, vocab] -> [n]``) at the last position to each token of ``ids``.

    ``baseline``: integrated gradients ``zero`` (default), ``pad`` or ``unk`` (that token's embedding at every
    position); occlusion ``drop`` (default: the token is removed), ``zero``, ``pad`` or ``unk`` (its embedding
    replaced). ``steps``: integrated gradients' steps (Gauss-Legendre, Captum's default), ``batch_size`` of
    them per forward. Raises UsageError for an unknown method or a baseline the method does not take.
    """
    if method not in METHODS:
        raise UsageError(f"unknown method '{method}'; use one of {', '.join(METHODS)}")
    if len(ids) == 0:
        raise UsageError("empty prompt")
    if method in ("saliency", "input-x-gradient") and baseline is not None:
        raise UsageError(f"{method} takes no baseline; --baseline is for integrated-gradients and occlusion")
    if method == "integrated-gradients":
        baseline = baseline or "zero"
        if baseline == "drop":
            raise UsageError("integrated gradients needs a baseline of the same length: use zero, pad or unk")
    if method == "occlusion":
        baseline = baseline or "drop"
        if baseline == "drop" and len(ids) < 2:
            raise UsageError("occlusion by dropping needs at least 2 tokens: a prompt without its only token is "
                             "empty")
    if baseline is not None and baseline not in BASELINES:
        raise UsageError(f"unknown baseline '{baseline}'; use one of {', '.join(BASELINES)}")
    import captum.attr as ca

    lm.model.eval()
    embed = lm.model.get_input_embeddings()
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    forward = embed_forward(lm, metric)
    with torch.inference_mode(False), torch.no_grad():
        embeds = embed(input_ids).detach().clone()                        # [1, pos, d_model]
        if embeds.device != lm.device:
            embeds = embeds.to(lm.device)
        fill = None
        if baseline in ("pad", "unk"):
            fill = embed(torch.full_like(input_ids, baseline_id(lm, baseline))).detach().clone()
        elif baseline == "zero":
            fill = torch.zeros_like(embeds)
        value = float(forward(embeds)[0])
    if method == "occlusion":
        return _occlusion(ca, forward, embeds, fill, baseline, value, batch_size)
    with grad_mode(lm):
        if method == "saliency":
            scores = ca.Saliency(forward).attribute(embeds.clone().requires_grad_(), abs=True).norm(dim=-1)
            return TokenScores(method, None, None, scores[0].detach().double().cpu(), value)
        if method == "input-x-gradient":
            scores = ca.InputXGradient(forward).attribute(embeds.clone().requires_grad_()).sum(-1)
            return TokenScores(method, None, None, scores[0].detach().double().cpu(), value)
        attributions, delta = ca.IntegratedGradients(forward).attribute(
            embeds.clone().requires_grad_(), baselines=fill, n_steps=steps, internal_batch_size=batch_size,
            return_convergence_delta=True)
        assert fill is not None  # integrated gradients: baseline zero, pad or unk
        with torch.no_grad():
            at_baseline = float(forward(fill)[0])
    return TokenScores(method, baseline, steps, attributions.sum(-1)[0].detach().double().cpu(), value,
                       baseline_metric=at_baseline, delta=float(delta[0]))


def _occlusion(ca: ModuleType, forward: Callable[[torch.Tensor], torch.Tensor], embeds: torch.Tensor,
               fill: torch.Tensor | None, baseline: str | None, value: float, batch_size: int) -> TokenScores:
    """FeatureAblation over a keep mask ``[b, pos]`` (1 keep, 0 occlude): each row builds its prompt."""
    n = embeds.shape[1]

    def masked(keep: torch.Tensor) -> torch.Tensor:
        keep = keep > 0.5                                                    # [b, pos]
        if fill is not None:
            rows = torch.where(keep[:, :, None], embeds, fill)               # replaced in place
            return forward(rows)
        # Dropped: rows of equal length go in one forward (FeatureAblation drops one token per row).
        out = torch.empty(keep.shape[0], dtype=torch.float64, device=embeds.device)
        lengths = keep.sum(1)
        for length in torch.unique(lengths).tolist():
            which = (lengths == length).nonzero().flatten()
            out[which] = forward(torch.stack([embeds[0][keep[i]] for i in which.tolist()])).to(torch.float64)
        return out

    with torch.inference_mode(False), torch.no_grad():
        scores = ca.FeatureAblation(masked).attribute(
            torch.ones(1, n, device=embeds.device), baselines=0.0,
            feature_mask=torch.arange(n, device=embeds.device)[None], perturbations_per_eval=max(1, batch_size))
    return TokenScores("occlusion", baseline, None, scores[0].detach().double().cpu(), value)
