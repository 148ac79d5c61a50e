"""Integrated gradients that must add up: Captum's ``IntegratedGradients`` on the input embeddings and
``LayerIntegratedGradients`` at a hook point, with the completeness rule enforced by doubling the steps.

Completeness: the attributions add up to ``f(x) - f(baseline)`` when the path integral is exact; the
relative error ``|sum - (f(x) - f(baseline))| / |f(x) - f(baseline)|`` is measured at every try. :func:`converge`
runs ``steps``, then ``2 * steps``, ... up to ``max_steps`` and stops at the first try within
``max_rel_error``; the result keeps every try's ``(steps, relative error)``.

At a layer (``blocks.{layer}.hook_{site}``) Captum's ``LayerIntegratedGradients`` is given an ``nn.Identity``
that the engine's hook calls on the activation, so Captum's own layer hooks capture and replace it. The path
runs from the site's activation on the baseline embeddings to its activation on the prompt, the rest of the
model computed from the prompt; its two ends are ``f(x)`` and ``f(x with the site's activation taken from the
baseline run)`` (for ``resid_pre`` that is f(baseline) itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from anatomy_cli.engine.gradients import grad_mode
from anatomy_cli.engine.hooks import attach
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import check_block
from anatomy_cli.models.sites import hook_name

SITES = (Site.resid_pre, Site.attn_out, Site.mlp_out)
"""The sites integrated gradients runs at with a layer (of :class:`anatomy_cli.models.sites.Site`)."""

Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Integral:
    """One try: ``scores`` float64 ``[pos]`` (attributions summed over the width), ``baseline_metric`` the
    path's start value of f, ``delta = scores.sum() - (metric - baseline_metric)``."""

    steps: int
    scores: torch.Tensor
    baseline_metric: float
    delta: float

    def relative_error(self, metric: float) -> float:
        difference = metric - self.baseline_metric
        return abs(self.delta) / abs(difference) if difference else float("inf")


@dataclass(frozen=True)
class Converged:
    """The last try and every try's ``(steps, relative error)``; ``converged``: the last is within the bound."""

    last: Integral
    tries: tuple[tuple[int, float], ...]
    converged: bool


def converge(run: Callable[[int], Integral], metric: float, *, steps: int, max_steps: int,
             max_rel_error: float) -> Converged:
    """``run(steps)``, doubling ``steps`` while the relative error exceeds ``max_rel_error`` and the doubled
    count stays within ``max_steps`` (a first ``steps`` above ``max_steps`` runs once)."""
    tries: list[tuple[int, float]] = []
    n = steps
    while True:
        got = run(n)
        err = got.relative_error(metric)
        tries.append((n, err))
        if err <= max_rel_error or 2 * n > max_steps:
            return Converged(got, tuple(tries), err <= max_rel_error)
        n *= 2


def embedding_integral(forward: Forward, embeds: torch.Tensor, fill: torch.Tensor, steps: int,
                       batch_size: int) -> Integral:
    """Captum ``IntegratedGradients`` on ``embeds [1, pos, d]`` from ``fill`` (Gauss-Legendre, ``steps``)."""
    import captum.attr as ca

    attributions = ca.IntegratedGradients(forward).attribute(
        embeds.clone().requires_grad_(), baselines=fill, n_steps=steps, internal_batch_size=batch_size)
    with torch.no_grad():
        start = float(forward(fill)[0])
        end = float(forward(embeds)[0])
    scores = attributions.detach().sum(-1)[0].double().cpu()
    return Integral(steps, scores, start, float(scores.sum()) - (end - start))


def layer_integral(lm: LoadedModel, forward: Forward, embeds: torch.Tensor, fill: torch.Tensor, layer: int,
                   site: str, steps: int, batch_size: int) -> Integral:
    """Captum ``LayerIntegratedGradients`` at ``blocks.{layer}.hook_{site}``; ``scores [pos]`` per position
    of the activation, summed over its width."""
    import captum.attr as ca

    name = hook_point(lm, layer, site)
    tap = torch.nn.Identity()
    n = embeds.shape[1]
    with attach(lm, {name: tap}):
        attributions = ca.LayerIntegratedGradients(forward, tap).attribute(
            embeds.clone().requires_grad_(), baselines=fill, n_steps=steps, internal_batch_size=batch_size)
    with torch.no_grad():
        saved: dict[str, torch.Tensor] = {}
        with attach(lm, {name: lambda t: saved.setdefault("b", t.detach().clone())}):
            forward(fill)
        with attach(lm, {name: lambda t: saved["b"]}):
            start = float(forward(embeds)[0])
        end = float(forward(embeds)[0])
    scores = attributions.detach().reshape(n, -1).sum(-1).double().cpu()
    return Integral(steps, scores, start, float(scores.sum()) - (end - start))


def hook_point(lm: LoadedModel, layer: int, site: str) -> str:
    """``blocks.{layer}.hook_{site}``; UsageError for a site not in :data:`SITES` or a layer out of range."""
    if site not in [s.value for s in SITES]:
        raise UsageError(f"unknown site '{site}'; use one of {', '.join(s.value for s in SITES)}")
    return hook_name(check_block(layer, lm.n_layers, "--layer", negative=False), site)


def integrate(lm: LoadedModel, forward: Forward, embeds: torch.Tensor, fill: torch.Tensor, metric: float, *,
              steps: int, max_steps: int, max_rel_error: float, batch_size: int, layer: int | None = None,
              site: str = "resid_pre", progress: Callable[[int, int], None] | None = None) -> Converged:
    """Integrated gradients from ``fill`` to ``embeds`` (at the embeddings, or with ``layer`` at a hook point),
    steps doubled until completeness holds (:func:`converge`). Gradients only inside ``grad_mode``.
    ``progress(steps done, steps planned so far)`` as the batches of steps run (each doubling plans more)."""
    counts = [0, 0]  # steps done, steps planned
    if progress is not None:
        forward = _counted(forward, counts, progress)

    def run(n: int) -> Integral:
        counts[1] += n
        if progress is not None:
            progress(counts[0], counts[1])
        with grad_mode(lm):
            if layer is None:
                return embedding_integral(forward, embeds, fill, n, batch_size)
            return layer_integral(lm, forward, embeds, fill, layer, site, n, batch_size)

    if layer is not None:
        hook_point(lm, layer, site)
    return converge(run, metric, steps=steps, max_steps=max_steps, max_rel_error=max_rel_error)


def _counted(forward: Forward, counts: list[int], progress: Callable[[int, int], None]) -> Forward:
    """``forward`` that adds the rows it runs to ``counts[0]`` (at most ``counts[1]``) and reports them."""
    def run(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        out = forward(x, *args, **kwargs)
        counts[0] = min(counts[0] + int(x.shape[0]), counts[1])
        progress(counts[0], counts[1])
        return out

    return run
