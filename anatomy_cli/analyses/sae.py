"""An SAE on one prompt: its health (does it fit?), the top features per token, and followed features.

Pure functions over :class:`~anatomy_cli.engine.sae.SpliceRun`'s tensors (float32) → frozen results with
``to_dict()``. Units: activations in the SAE's own units, MSE in the activation's squared units, cross-entropy
and KL in nats (natural log). Definitions:

* L0 of a token: how many features are > 0; ``l0_mean`` over every position of the prompt.
* FVE (fraction of variance explained): ``1 - Σ‖x - x̂‖² / Σ‖x - x̄‖²`` over the prompt's positions, ``x̄``
  their mean (None for a one-token prompt); MSE: ``mean((x - x̂)²)`` over positions and dimensions;
  ``error_ratio``: the mean over positions of ``‖x - x̂‖ / ‖x‖``.
* next-token CE: the mean over positions 0..n-2 of ``-log p(token[i+1])``; KL: ``KL(p_clean ‖ p_spliced)``
  averaged over every position.
* a feature's share at a token: ``f_i ‖W_dec[i]‖ / Σ_j f_j ‖W_dec[j]‖``, its part of the reconstruction's
  feature sum, by norm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import torch

from anatomy_cli.declare.shared import MIN_ROWS
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.next_token import Describe
    from anatomy_cli.engine.sae import SpliceRun


@dataclass(frozen=True)
class Health:
    l0: tuple[int, ...]
    l0_mean: float
    stated_l0: float | None
    fve: float | None
    mse: float
    error_ratio: float
    norm_ratio: float
    ce_clean_nats: float | None
    ce_spliced_nats: float | None
    ce_with_error_nats: float | None
    kl_spliced_nats: float
    kl_with_error_nats: float
    max_logit_diff_with_error: float
    skipped_positions: int = 0  # the prompt's first positions left out of every figure (the fit left them out)

    def to_dict(self) -> dict[str, Any]:
        """The figures; ``skipped_positions`` only where some were left out."""
        out = {**asdict(self), "l0": list(self.l0)}
        if not self.skipped_positions:
            del out["skipped_positions"]
        return out


def next_token_ce(logits: torch.Tensor, ids: Sequence[int]) -> float | None:
    """The mean over positions 0..n-2 of ``-log p(ids[i+1])`` in nats (None for one token)."""
    if len(ids) < 2:
        return None
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    nxt = torch.tensor(list(ids[1:]), dtype=torch.long, device=logits.device)
    return float(-logp.gather(1, nxt[:, None]).mean())


def next_token_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """``KL(p ‖ q)`` of the next-token distributions, averaged over every position, in nats."""
    logp = torch.log_softmax(p_logits.double(), dim=-1)
    logq = torch.log_softmax(q_logits.double(), dim=-1)
    return float((logp.exp() * (logp - logq)).sum(-1).mean().clamp_min(0.0))


def health(run: SpliceRun, ids: Sequence[int], stated_l0: float | None, *, skipped: int = 0) -> Health:
    """The health figures of ``run`` (a SpliceRun) on the prompt ``ids`` (see the module docstring): ``ids`` the
    run's positions' tokens, ``skipped`` the prompt's first positions the run left out (recorded)."""
    target, recon = run.target.double(), run.recon.double()
    err = target - recon
    l0 = (run.features > 0).sum(-1)
    var = (target - target.mean(0, keepdim=True)).pow(2).sum()
    fve = None if target.shape[0] < 2 or float(var) == 0.0 else float(1 - err.pow(2).sum() / var)
    norms = target.norm(dim=-1).clamp_min(1e-30)
    return Health(
        l0=tuple(int(v) for v in l0), l0_mean=float(l0.double().mean()), stated_l0=stated_l0, fve=fve,
        mse=float(err.pow(2).mean()), error_ratio=float((err.norm(dim=-1) / norms).mean()),
        norm_ratio=float((recon.norm(dim=-1) / norms).mean()),
        ce_clean_nats=next_token_ce(run.logits, ids), ce_spliced_nats=next_token_ce(run.logits_spliced, ids),
        ce_with_error_nats=next_token_ce(run.logits_with_error, ids),
        kl_spliced_nats=next_token_kl(run.logits, run.logits_spliced),
        kl_with_error_nats=next_token_kl(run.logits, run.logits_with_error),
        max_logit_diff_with_error=float((run.logits - run.logits_with_error).abs().max()), skipped_positions=skipped)


FVE_LOW = 0.5  # below: warned (under 0: the SAE is worse than the mean activation)
KL_HIGH_NATS = 1.0  # spliced KL(p_clean || p_spliced) above this: warned
# fewer measured positions than MIN_ROWS (8): the FVE is not judged (a mean over 2-7 points is no baseline), the
# bound fit-sae's training batches keep too (declare/shared.py)


def too_weak(fve: float | None, positions: int) -> bool:
    """A dictionary too weak to read: its reconstruction explains under :data:`FVE_LOW` of the activation's
    variance over ``positions`` positions, at least :data:`MIN_ROWS` of them (None: not measured, e.g. a
    one-token text, and an FVE over fewer positions, which says little, are not judged). What `sae`'s warnings,
    `fit-sae` (on its held-out window), `features` (its fit report's) and `circuit` (on its prompt, per
    transcoder) say."""
    return fve is not None and positions >= MIN_ROWS and fve < FVE_LOW


def fve_warnings(fve: float | None, positions: int, text: str = "prompt") -> list[str]:
    """What an FVE measured over ``positions`` positions of ``text`` says (:func:`warnings`' rule, also a
    cross-layer transcoder's block rows' in fit-sae): under :data:`FVE_LOW` (:func:`too_weak`; under 0: worse than
    the mean), or, over fewer than :data:`MIN_ROWS` positions, only that it says little; none else."""
    if fve is not None and too_weak(fve, positions):
        return [f"FVE {fve:.3f} < 0: the reconstruction is worse than the {text}'s mean activation; the SAE does "
                f"not fit this model or site" if fve < 0 else f"FVE {fve:.3f} < {FVE_LOW}: the reconstruction "
                f"explains less than half of the activation's variance on this {text}; the SAE fits this model "
                f"or site poorly"]
    if fve is not None and fve < FVE_LOW:  # not judged: too few positions
        return [f"FVE {fve:.3f} over {counted(positions, 'position')} says little about the fit (its variance "
                f"is around a {positions}-position mean): judge it on {MIN_ROWS} positions or more"]
    return []


def warnings(h: Health, *, n_tokens: int, context_size: int | None, sae_bos: bool | None, prompt_bos: bool | None,
             centred: bool, centred_now: float, text: str = "prompt") -> list[str]:
    """What the figures say about the fit, measured on ``text`` (`sae`: the prompt; `fit-sae`: its held-out
    window): a prompt past ``context_size``, another BOS rule, a reconstruction
    far from the activation's scale, an L0 far from the stated one, an FVE under :data:`FVE_LOW` (under 0: worse
    than the mean; over fewer than :data:`MIN_ROWS` positions, only that it says little), a spliced KL
    over :data:`KL_HIGH_NATS`, and residuals that the SAE expects centred
    (``centred_now``: the mean over positions of ``|mean_d x| / rms(x)``)."""
    out = []
    if context_size is not None and n_tokens > context_size:
        out.append(f"the prompt is {n_tokens} tokens; the SAE was trained on contexts of {context_size}")
    if sae_bos is not None and prompt_bos is not None and sae_bos != prompt_bos:
        out.append(f"the SAE was trained {'with' if sae_bos else 'without'} a BOS token (prepend_bos "
                   f"{str(sae_bos).lower()}); this prompt has {'one' if prompt_bos else 'none'} (--bos/--no-bos)")
    if not 0.5 <= h.norm_ratio <= 2.0:
        out.append(f"the reconstruction's norm is {h.norm_ratio:.2f}x the activation's: the activation's scale "
                   f"is far from the SAE's training scale")
    if h.stated_l0 and not h.stated_l0 / 4 <= h.l0_mean <= h.stated_l0 * 4:
        out.append(f"mean L0 {h.l0_mean:.1f} is far from the {h.stated_l0:g} the SAE states")
    out += fve_warnings(h.fve, len(h.l0), text)
    if h.kl_spliced_nats > KL_HIGH_NATS:
        out.append(f"KL {h.kl_spliced_nats:.2f} nats > {KL_HIGH_NATS:g} with the reconstruction spliced in: the "
                   f"model's next-token predictions change a lot; the SAE does not fit this model or site")
    if centred and centred_now > 0.05:
        out.append("the SAE was trained on TransformerLens' centred residuals (center_writing_weights); "
                   "anatomy reads the raw residual stream")
    return out


def feature_shares(features: torch.Tensor, dec_norms: torch.Tensor) -> torch.Tensor:
    """``[pos, d_sae]``: each feature's share of its token's reconstruction (see the module docstring)."""
    weighted = features * dec_norms
    total = weighted.sum(-1, keepdim=True)
    return torch.where(total > 0, weighted / total.clamp_min(1e-30), torch.zeros_like(weighted))


def top_features(features: torch.Tensor, dec_norms: torch.Tensor, pieces: Sequence[str], k: int,
                 ) -> list[dict[str, Any]]:
    """Rows ``{position, token, rank, feature, activation, share}``: the ``k`` most active features (> 0)
    at each position, by activation."""
    shares = feature_shares(features, dec_norms)
    rows = []
    top = features.topk(min(k, features.shape[-1]), dim=-1)
    for pos in range(features.shape[0]):
        rank = 0
        for value, idx in zip(top.values[pos].tolist(), top.indices[pos].tolist()):
            if value <= 0:
                break
            rank += 1
            rows.append({"position": pos, "token": pieces[pos], "rank": rank, "feature": idx,
                         "activation": value, "share": float(shares[pos, idx])})
    return rows


def follow(features: torch.Tensor, dec_norms: torch.Tensor, pieces: Sequence[str], ids: Sequence[int]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Followed features (``ids``) across the prompt: rows ``{position, token, feature, activation, share}``
    per position and feature, and one summary per feature ``{feature, max_activation, max_position,
    max_token, active_tokens, mean_activation}``."""
    shares = feature_shares(features, dec_norms)
    rows, summary = [], []
    for fid in ids:
        col = features[:, fid]
        rows += [{"position": p, "token": pieces[p], "feature": fid, "activation": float(col[p]),
                  "share": float(shares[p, fid])} for p in range(features.shape[0])]
        best = int(col.argmax())
        summary.append({"feature": fid, "max_activation": float(col[best]),
                        "max_position": best if float(col[best]) > 0 else None,
                        "max_token": pieces[best] if float(col[best]) > 0 else None,
                        "active_tokens": int((col > 0).sum()), "mean_activation": float(col.double().mean())})
    return rows, summary


def logit_lens(lens: torch.Tensor, ids: Sequence[int], describe: Describe, k: int) -> list[dict[str, Any]]:
    """Rows ``{feature, side, rank, token, token_id, logit}``: the ``k`` top and bottom tokens of each feature's
    decoder direction (``lens [len(ids), vocab]``)."""
    rows = []
    for row, fid in enumerate(ids):
        for side, largest in (("top", True), ("bottom", False)):
            vals = lens[row].topk(min(k, lens.shape[-1]), largest=largest)
            for rank, (v, t) in enumerate(zip(vals.values.tolist(), vals.indices.tolist()), start=1):
                rows.append({"feature": fid, "side": side, "rank": rank, "token": describe(t)[0], "token_id": t,
                             "logit": v if math.isfinite(v) else None})
    return rows


PLOT_FEATURES = 32  # columns of the tokens x features heatmap at most


@dataclass(frozen=True)
class Reading:
    """One prompt read through an SAE: what `anatomy sae` renders and ``--plot`` draws. ``pieces``: the
    prompt's tokens as the tables show them; ``activations [pos, d_sae]`` float32 on the CPU; rows as in
    :func:`top_features`, :func:`follow` and :func:`logit_lens` (``summary``: one per followed feature);
    ``followed``: the ``--feature`` ids; ``labels``: feature id -> label (or ``top tokens: …`` where it has none)
    when there are labels or top tokens (models/feature_labels.py), else None; ``top``: the features listed per
    token (``--top``); ``label_source``: where the labels came from (None: no labels)."""

    pieces: tuple[str, ...]
    activations: torch.Tensor
    health: Health
    warnings: tuple[str, ...]
    top_rows: tuple[dict[str, Any], ...]
    follow_rows: tuple[dict[str, Any], ...]
    summary: tuple[dict[str, Any], ...]
    lens_rows: tuple[dict[str, Any], ...]
    followed: tuple[int, ...]
    labels: dict[int, str] | None
    top: int = 5
    label_source: str | None = None

    def plotted(self, limit: int = PLOT_FEATURES) -> list[int]:
        """The heatmap's features: the followed ones, then those of the top-features table ordered by their
        largest activation over the prompt (ties: the lower id), ``limit`` at most."""
        best = self.activations.max(0).values.tolist() if self.activations.shape[0] else []
        listed = sorted({r["feature"] for r in self.top_rows} - set(self.followed), key=lambda f: (-best[f], f))
        return [*self.followed, *listed][:limit]

    def matrix(self, limit: int = PLOT_FEATURES) -> tuple[list[int], list[list[float]]]:
        """``(features, values [pos][len(features)])``: the heatmap, the activations of :meth:`plotted`."""
        ids = self.plotted(limit)
        return ids, self.activations[:, ids].tolist() if ids else [[] for _ in self.pieces]


def centring(x: torch.Tensor) -> float:
    """The mean over positions of ``|mean_d x| / rms(x)``: about 0 for TransformerLens' centred residuals."""
    x = x.double()
    rms = x.pow(2).mean(-1).sqrt().clamp_min(1e-30)
    return float((x.mean(-1).abs() / rms).mean())
