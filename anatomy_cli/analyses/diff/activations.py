"""`diff` on a prompt: the residual streams and logit lenses of two models, layer by layer.

Model A runs first and :func:`keep` holds only what the comparison needs (the residual stream at every
position, ``[L+1, pos, d_model]``, and the lens log-probabilities at the followed position,
``[L+1, vocab]``); the caller frees A before B loads and runs, so the two models are never in memory
together. :func:`compare` then reads the two :class:`Kept` records. The rows are named ``embed`` (the
embedding), then N for block N's output (before the final norm; docs/engine.md#layers); the lens is
``unembed(final_norm(h))`` with each model's own norm and head, and at the last row (block L−1) it is the
model's next-token distribution.

Per layer: ``cos`` (h_A, h_B at the position), ``cos_mean`` (the mean over positions),
``rel_delta`` = ‖h_A − h_B‖ / ‖h_A‖ at the position, ``lens_kl_nats`` = KL(lens_A ‖ lens_B) in nats,
``lens_agree`` (the same top-1 token). Probabilities are float64.

LM heads of different sizes (one padded to a multiple of 64, say: 50,257 and 50,304 rows) are compared
over the rows they share (the first ``min`` of the two): KL, agreement and ranks are those of each
distribution conditioned on the shared rows, the top tokens and targets carry each model's own
probabilities, and ``extra_mass_a``/``extra_mass_b`` say how much probability each model puts on the
rows the other lacks (the next-token distributions at the followed position).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import torch

from anatomy_cli import engine
from anatomy_cli.analyses.next_token import Describe
from anatomy_cli.analyses.next_token import TokenProb
from anatomy_cli.analyses.next_token import _token_prob
from anatomy_cli.analyses.next_token import log_probs
from anatomy_cli.analyses.next_token import rank_of
from anatomy_cli.analyses.next_token import top_k
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sites import residual_label

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel


@dataclass(frozen=True)
class Kept:
    """What one model leaves for the comparison of one prompt: ``resid`` float32 ``[L+1, pos, d_model]``
    on the CPU, ``lens`` float64 log-probabilities ``[L+1, vocab]`` at ``position`` (0-based)."""

    ids: tuple[int, ...]
    position: int
    resid: torch.Tensor
    lens: torch.Tensor


def keep(lm: LoadedModel, encoded: list[Encoded], position: int = -1, *, batch_size: int = 8) -> list[Kept]:
    """Run ``lm`` (an engine LoadedModel with an LM head) on ``encoded`` and keep, per prompt, the
    residual stream and the lens at ``position`` (negative counts from the end). One :class:`Kept` per prompt."""
    caches = engine.run(lm, encoded, engine.residual_names(lm), batch_size=batch_size)
    out = []
    for enc, cache in zip(encoded, caches):
        resid = cache.residual_stream().detach().to("cpu", torch.float32)  # [L+1, pos, d]
        pos = position + len(enc) if position < 0 else position
        lens = log_probs(engine.unembed(lm, resid[:, pos].to(lm.device)))  # [L+1, vocab] float64
        out.append(Kept(tuple(enc.ids), pos, resid, lens))
    del caches
    return out


@dataclass(frozen=True)
class LayerDiff:
    """One residual reading (``layer``: ``"embed"`` or block N's output, docs/engine.md#layers): cosines, relative
    difference, lens KL (nats) and top-1 tokens of A and B."""

    layer: int | str
    cos: float
    cos_mean: float
    rel_delta: float
    lens_kl_nats: float
    lens_agree: bool
    lens_a: str
    lens_b: str

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


@dataclass(frozen=True)
class ActivationDiff:
    """The comparison of two models on one prompt at ``position``: ``layers`` (L + 1 rows: ``embed``, then the
    blocks 0..L−1), the final next-token distributions (``top_a``, ``top_b``: top-k of each), ``kl_nats`` =
    KL(final_A ‖ final_B), ``a_top1_rank_in_b`` (1 = B agrees), and with a target its probability and rank in both."""

    position: int
    layers: tuple[LayerDiff, ...]
    top_a: tuple[TokenProb, ...]
    top_b: tuple[TokenProb, ...]
    kl_nats: float
    a_top1_rank_in_b: int
    target_a: TokenProb | None = None
    target_b: TokenProb | None = None
    shared_rows: int | None = None  # None: both heads have the same rows
    extra_mass_a: float = 0.0
    extra_mass_b: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "layers": [r.to_dict() for r in self.layers],
                "shared_rows": self.shared_rows, "extra_mass_a": self.extra_mass_a, "extra_mass_b": self.extra_mass_b,
                "top_a": [t.to_dict() for t in self.top_a], "top_b": [t.to_dict() for t in self.top_b],
                "kl_nats": self.kl_nats, "a_top1_rank_in_b": self.a_top1_rank_in_b,
                "target_a": self.target_a.to_dict() if self.target_a else None,
                "target_b": self.target_b.to_dict() if self.target_b else None}


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) in nats over the last axis of two float64 log-probability tensors ``[..., vocab]``
    (terms where p is 0 count 0). Returns ``[...]``, clamped at 0 against rounding."""
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)


def _cos(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x, y = x.to(torch.float64), y.to(torch.float64)
    den = x.norm(dim=-1) * y.norm(dim=-1)
    return torch.where(den > 0, (x * y).sum(-1) / den.clamp_min(1e-300), torch.ones_like(den)).clamp(-1.0, 1.0)


def compare(a: Kept, b: Kept, describe: Describe, *, k: int = 5, target_id: int | None = None) -> ActivationDiff:
    """Compare what A and B kept for one prompt (the same token ids; ``describe`` names tokens)."""
    if a.ids != b.ids:
        raise UsageError("the two models saw different tokens")
    if a.resid.shape != b.resid.shape:
        raise UsageError(f"the residual streams differ in shape: [layers+1, positions, d_model] = "
                         f"{list(a.resid.shape)} in A, {list(b.resid.shape)} in B")
    p = a.position
    ha, hb = a.resid.to(torch.float64), b.resid.to(torch.float64)
    cos_at = _cos(ha[:, p], hb[:, p])
    cos_mean = _cos(ha, hb).mean(-1)
    na = ha[:, p].norm(dim=-1)
    nd = (ha[:, p] - hb[:, p]).norm(dim=-1)
    rel = torch.where(na > 0, nd / na.clamp_min(1e-300), torch.where(nd > 0, math.inf, 0.0))
    rows = min(a.lens.shape[-1], b.lens.shape[-1])
    la, lb = a.lens[:, :rows], b.lens[:, :rows]            # each model's own log-probabilities, shared rows
    extra_a, extra_b = _extra_mass(a.lens[-1], rows), _extra_mass(b.lens[-1], rows)  # the final distributions
    # one row at a time: a whole [L+1, vocab] float64 temporary is 12 MB for SmolLM2, and KL makes several
    kls = torch.stack([kl(x - x.logsumexp(-1), y - y.logsumexp(-1)) for x, y in zip(la, lb)])
    top1_a, top1_b = la.argmax(-1), lb.argmax(-1)
    layers = tuple(LayerDiff(residual_label(layer), float(cos_at[layer]), float(cos_mean[layer]), float(rel[layer]),
                             float(kls[layer]), bool(top1_a[layer] == top1_b[layer]),
                             describe(int(top1_a[layer]))[0], describe(int(top1_b[layer]))[0])
                   for layer in range(ha.shape[0]))
    final_a, final_b = la[-1], lb[-1]
    target_a = target_b = None
    if target_id is not None and target_id >= rows:
        raise UsageError(f"target id {target_id} is beyond the {rows} LM-head rows the two models share")
    if target_id is not None:
        target_a = _token_prob(rank_of(final_a, target_id), target_id, float(final_a[target_id]), describe)
        target_b = _token_prob(rank_of(final_b, target_id), target_id, float(final_b[target_id]), describe)
    padded = a.lens.shape[-1] != b.lens.shape[-1]
    return ActivationDiff(p, layers, top_k(final_a, k, describe), top_k(final_b, k, describe), float(kls[-1]),
                          rank_of(final_b, int(top1_a[-1])), target_a, target_b, rows if padded else None,
                          float(extra_a), float(extra_b))


def _extra_mass(logp: torch.Tensor, rows: int) -> torch.Tensor:
    """Probability on the rows at and after ``rows`` of float64 log-probabilities ``[..., vocab]``: ``[...]``."""
    if logp.shape[-1] <= rows:
        return torch.zeros(logp.shape[:-1], dtype=torch.float64)
    return logp[..., rows:].logsumexp(-1).exp()
