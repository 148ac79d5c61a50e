"""Token attribution with Captum: how much each input token moved a metric of the last position's logits.

The model is run from its input embeddings (``inputs_embeds``: the input embedding module's output,
so Gemma's embedding scale is included; learned positions are added by the model as usual), and the
metric ``f`` of the last position's logits is what Captum explains. Methods (Captum's classes, not
re-derived here), each giving one number per token:

* ``saliency``: ``Saliency`` (``|df/de|``), then the gradient's L2 norm over the embedding width;
* ``input-x-gradient``: ``InputXGradient`` (``e * df/de``), summed over the width;
* ``integrated-gradients``: ``IntegratedGradients`` on the embeddings (what ``LayerIntegratedGradients``
  on the embedding layer computes, with the baseline given in embedding space so that ``zero`` is a
  baseline), summed over the width; its convergence delta is ``sum(attributions) - (f(x) - f(baseline))``,
  and the steps are doubled until it is small (:mod:`anatomy_cli.engine.integrated`, also for a layer);
* ``occlusion``: ``FeatureAblation`` over a per-token keep mask, no gradients, ``batch_size`` occluded
  prompts per forward: ``f(x) - f(x with token i dropped / replaced)``.

Baselines: ``pad`` (default), ``unk``, ``mean`` (the mean of the embedding matrix's rows) or ``zero`` at every
position but the first, which keeps its own embedding (``keep_first``, default): in a causal model the first
position is the attention sink, and moving its embedding along the path switches the sink off and on, so that f
jumps and no step count integrates it (measured on SmolLM2: notes in docs/commands/attribute.md). Its
attribution is then 0 by construction.

Gradients only inside ``engine.gradients.grad_mode`` (weights' requires_grad off, restored after).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from anatomy_cli.engine.forwarding import forward as model_forward
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.gradients import Metric
from anatomy_cli.engine.gradients import grad_mode
from anatomy_cli.engine.integrated import integrate
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

METHODS = ("saliency", "input-x-gradient", "integrated-gradients", "occlusion")
BASELINES = ("pad", "unk", "mean", "zero", "drop")
STEPS, MAX_STEPS, MAX_REL_ERROR = 32, 256, 0.05


@dataclass(frozen=True)
class TokenScores:
    """One prompt: ``scores`` float64 ``[pos]``, one per input token; ``metric`` = f(x).

    Integrated gradients: ``baseline_metric`` = f(baseline) (at a layer: f with the site's activation from
    the baseline run) and ``delta`` = ``scores.sum() - (metric - baseline_metric)`` at the last try; ``tries``
    every try's ``(steps, relative error)``, ``converged`` whether the last is within the bound, ``kept_first``
    whether the first position kept its own embedding; None / False for the other methods.
    """

    method: str
    baseline: str | None
    steps: int | None
    scores: torch.Tensor
    metric: float
    baseline_metric: float | None = None
    delta: float | None = None
    tries: tuple[tuple[int, float], ...] = ()
    converged: bool | None = None
    kept_first: bool = False
    layer: int | None = None
    site: str | None = None


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


def attribute_tokens(lm: LoadedModel, ids: Sequence[int], metric: Metric, method: str, *, steps: int = STEPS,
                     baseline: str | None = None, batch_size: int = 32, max_steps: int = MAX_STEPS,
                     max_rel_error: float = MAX_REL_ERROR, keep_first: bool = True, layer: int | None = None,
                     site: str = "resid_pre", progress: Callable[[int, int], None] | None = None) -> TokenScores:
    """Attribute ``metric`` (logits ``[n, vocab] -> [n]``) at the last position to each token of ``ids``.

    ``baseline``: integrated gradients ``pad`` (default), ``unk``, ``mean`` or ``zero`` (that embedding at every
    position; with ``keep_first`` not at the first, which keeps its own); occlusion ``drop`` (default: the token
    is removed), ``zero``, ``pad``, ``unk`` or ``mean`` (its embedding replaced). Integrated gradients: ``steps``
    (Gauss-Legendre, Captum's default), doubled up to ``max_steps`` until the completeness relative error is
    within ``max_rel_error`` (``converged`` says whether it was), ``batch_size`` steps per forward; with
    ``layer`` at ``blocks.{layer}.hook_{site}`` (Captum's LayerIntegratedGradients). Raises UsageError for an
    unknown method or a baseline the method does not take.
    ``progress(steps done, steps planned)``: integrated gradients' steps.
    """
    baseline = _check(lm, ids, method, baseline, layer)
    import captum.attr as ca

    lm.model.eval()
    embed = lm.model.get_input_embeddings()
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    forward = embed_forward(lm, metric)
    with torch.inference_mode(False), torch.no_grad():
        embeds = embed(input_ids).detach().clone().to(lm.device)              # [1, pos, d_model]
        fill = None if baseline in (None, "drop") else baseline_embeds(lm, embed, input_ids, baseline)
        value = float(forward(embeds)[0])
    if method == "occlusion":
        return _occlusion(ca, forward, embeds, fill, str(baseline), value, batch_size)
    if method == "integrated-gradients":
        assert fill is not None
        kept = keep_first and len(ids) > 1
        if kept:
            fill[:, 0] = embeds[:, 0]
        with torch.inference_mode(False):
            got = integrate(lm, forward, embeds, fill, value, steps=steps, max_steps=max_steps,
                            max_rel_error=max_rel_error, batch_size=batch_size, layer=layer, site=site,
                            progress=progress)
        last = got.last
        return TokenScores(method, baseline, last.steps, last.scores, value, baseline_metric=last.baseline_metric,
                           delta=last.delta, tries=got.tries, converged=got.converged, kept_first=kept,
                           layer=layer, site=site if layer is not None else None)
    with grad_mode(lm):
        if method == "saliency":
            scores = ca.Saliency(forward).attribute(embeds.clone().requires_grad_(), abs=True).norm(dim=-1)
        else:
            scores = ca.InputXGradient(forward).attribute(embeds.clone().requires_grad_()).sum(-1)
    return TokenScores(method, None, None, scores[0].detach().double().cpu(), value)


def baseline_embeds(lm: LoadedModel, embed: torch.nn.Module, input_ids: torch.Tensor, baseline: str) -> torch.Tensor:
    """``[1, pos, d_model]``: the baseline's embedding at every position (``zero``, ``pad``, ``unk`` or ``mean``,
    the mean of the embedding module's output over the tokenizer's vocabulary)."""
    if baseline == "zero":
        return torch.zeros_like(embed(input_ids))
    if baseline == "mean":
        count = min(lm.info.tokenizer_vocab, getattr(embed, "num_embeddings", lm.info.tokenizer_vocab))
        rows = torch.arange(count, device=input_ids.device)
        mean = torch.cat([embed(chunk[None])[0] for chunk in torch.split(rows, 8192)]).mean(0)
        return mean.expand(1, input_ids.shape[1], -1).clone()
    out: torch.Tensor = embed(torch.full_like(input_ids, baseline_id(lm, baseline))).detach().clone()
    return out


def _check(lm: LoadedModel, ids: Sequence[int], method: str, baseline: str | None, layer: int | None) -> str | None:
    """The baseline the method runs with (its default filled in); UsageError for what it does not take."""
    if method not in METHODS:
        raise UsageError(f"unknown method '{method}'; use one of {', '.join(METHODS)}")
    if len(ids) == 0:
        raise UsageError("empty prompt")
    if layer is not None and method != "integrated-gradients":
        raise UsageError(f"--layer is for integrated-gradients; {method} attributes to the input tokens only")
    if method in ("saliency", "input-x-gradient") and baseline is not None:
        raise UsageError(f"{method} takes no baseline; --baseline is for integrated-gradients and occlusion")
    if method == "integrated-gradients":
        baseline = baseline or "pad"
        if baseline == "drop":
            raise UsageError("integrated gradients needs a baseline of the same length: use pad, unk, mean or zero")
    if method == "occlusion":
        baseline = baseline or "drop"
        if baseline == "drop" and len(ids) < 2:
            raise UsageError("occlusion by dropping needs at least 2 tokens: a prompt without its only token is "
                             "empty")
    if baseline is not None and baseline not in BASELINES:
        raise UsageError(f"unknown baseline '{baseline}'; use one of {', '.join(BASELINES)}")
    return baseline


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
