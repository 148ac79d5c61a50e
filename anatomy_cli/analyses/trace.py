"""The residual stream at one position, layer by layer, and the logit lens.

Rows (docs/engine.md#layers): the first, named ``embed``, is the embedding
(token + position embedding, the input of block 0); the row named N is the
output of block N, raw, before the final norm, and its attention and FFN
contributions are ``blocks.N.hook_attn_out`` and ``blocks.N.hook_mlp_out``.

All arithmetic is float64 on the CPU, whatever the model's dtype, so that
``cos_to_embedding`` on the ``embed`` row is exactly 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from anatomy_cli.analyses.next_token import Describe
from anatomy_cli.analyses.next_token import TokenProb
from anatomy_cli.analyses.next_token import log_probs
from anatomy_cli.analyses.next_token import rank_of
from anatomy_cli.analyses.next_token import top_k
from anatomy_cli.models.sites import residual_label


@dataclass(frozen=True)
class LayerRow:
    """One row of the trace at the chosen position: ``layer`` is ``embed`` or the block whose output it is.

    ``cos_*`` are cosines in [-1, 1]; ``*_norm`` are Euclidean (L2) norms in the
    model's activation units. ``cos_to_previous``, ``attn_norm`` and ``mlp_norm``
    are None on the ``embed`` row. ``lens_*`` (the logit lens: the most probable token of
    unembed(final_norm(h_l)) and its probability) are None when the model has
    no LM head. ``target_rank`` (1-based) and ``target_probability``: a target
    token in the same lens distribution, None without a target.
    """

    layer: int | str
    cos_to_embedding: float
    cos_to_previous: float | None
    resid_norm: float
    attn_norm: float | None
    mlp_norm: float | None
    lens_token_id: int | None
    lens_token: str | None
    lens_text: str | None  # None also for a partial UTF-8 piece
    lens_probability: float | None
    target_rank: int | None = None
    target_probability: float | None = None

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))  # flat fields: no need for asdict's deep copy


@dataclass(frozen=True)
class Trace:
    """Rows ``embed``, 0..L−1 and the model's own top-k next tokens (empty without an LM head)."""

    layers: tuple[LayerRow, ...]
    top: tuple[TokenProb, ...]
    lens: str = "logit"  # the lens of the lens_* columns: logit, jacobian, tuned (docs/commands/lens.md)
    lens_source: str | None = None  # a fitted lens's file or directory

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layers": [r.to_dict() for r in self.layers], "top": [t.to_dict() for t in self.top]}
        if self.lens != "logit":
            out["lens"] = {"kind": self.lens, "source": self.lens_source}
        return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity along the last dimension (float64, clamped to [-1, 1]; 0 for a zero vector).

    ``a`` and ``b``: float [..., d]. Returns float64 [...]. Written as
    ``a·b / sqrt(|a|² |b|²)`` so that ``cosine(x, x)`` is exactly 1.
    """
    a = a.to(torch.float64)
    b = b.to(torch.float64)
    dot = (a * b).sum(-1)
    denom = ((a * a).sum(-1) * (b * b).sum(-1)).sqrt()
    return torch.where(denom > 0, dot / denom.clamp_min(torch.finfo(torch.float64).tiny), 0.0).clamp(-1.0, 1.0)


def trace(
    resid: torch.Tensor,
    *,
    attn_out: torch.Tensor | None = None,
    mlp_out: torch.Tensor | None = None,
    lens_logits: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    k: int = 5,
    describe: Describe | None = None,
    target_id: int | None = None,
    lens_rows: Sequence[int] | None = None,
) -> Trace:
    """Trace one position through the layers.

    Args:
        resid: float [n_layers + 1, d_model], the residual stream (row 0 = embedding).
        attn_out, mlp_out: float [n_layers, d_model], what block l's attention / FFN
            added (they fill block l's row), or None when not captured.
        lens_logits: float [n_layers + 1, vocab], unembed(final_norm(resid[l])) per
            layer, or None (no LM head); with ``lens_rows``, one row per entry of it.
        lens_rows: the residual rows ``lens_logits`` reads (a fitted lens's, e.g. a Jacobian lens without
            ``embed``); the other rows' ``lens_*`` and ``target_*`` are None. Default: every row.
        logits: float [vocab], the model's own logits at this position, for the top-k
            table; None when the model has no LM head.
        k: how many top tokens to list.
        describe: ``token_id -> (display, text)``; required with ``lens_logits`` or ``logits``.
        target_id: a token whose rank and probability in each layer's lens distribution the
            rows report (needs ``lens_logits``).

    Raises ValueError when the shapes do not agree (a programming error, not user input).
    """
    if resid.ndim != 2:
        raise ValueError(f"resid must be [n_layers + 1, d_model], got {tuple(resid.shape)}")
    n_rows, d_model = resid.shape
    for name, t in (("attn_out", attn_out), ("mlp_out", mlp_out)):
        if t is not None and tuple(t.shape) != (n_rows - 1, d_model):
            raise ValueError(f"{name} must be [{n_rows - 1}, {d_model}], got {tuple(t.shape)}")
    read = list(range(n_rows)) if lens_rows is None else list(lens_rows)
    if lens_logits is not None and (lens_logits.ndim != 2 or lens_logits.shape[0] != len(read)):
        raise ValueError(f"lens_logits must be [{len(read)}, vocab], got {tuple(lens_logits.shape)}")
    if (lens_logits is not None or logits is not None) and describe is None:
        raise ValueError("describe is required to name tokens")

    h = resid.detach().to("cpu", torch.float64)
    to_embedding = cosine(h, h[0:1]).tolist()
    to_previous = [None, *cosine(h[1:], h[:-1]).tolist()]
    resid_norm = h.norm(dim=-1).tolist()
    attn_norm = _norms(attn_out, n_rows)
    mlp_norm = _norms(mlp_out, n_rows)
    lens: list[TokenProb | None] = [None] * n_rows
    target: list[tuple[int, float] | tuple[None, None]] = [(None, None)] * n_rows
    if lens_logits is not None:
        assert describe is not None  # checked above
        logp = log_probs(lens_logits)
        for r, row in zip(read, logp):
            lens[r] = top_k(row, 1, describe)[0]
            if target_id is not None:
                target[r] = (rank_of(row, target_id), math.exp(float(row[target_id])))

    rows = tuple(
        LayerRow(layer=residual_label(l), cos_to_embedding=to_embedding[l], cos_to_previous=to_previous[l],
                 resid_norm=resid_norm[l], attn_norm=attn_norm[l], mlp_norm=mlp_norm[l],
                 lens_token_id=p.token_id if p else None,
                 lens_token=p.token if p else None,
                 lens_text=p.text if p else None,
                 lens_probability=p.probability if p else None,
                 target_rank=target[l][0], target_probability=target[l][1])
        for l, p in enumerate(lens))
    top = top_k(log_probs(logits), k, describe) if logits is not None and describe is not None else ()
    return Trace(layers=rows, top=top)


def _norms(contrib: torch.Tensor | None, n_rows: int) -> list[float | None]:
    """L2 norms of per-block contributions, shifted so block l's lands on its row (after ``embed``)."""
    if contrib is None:
        return [None] * n_rows
    return [None, *contrib.detach().to("cpu", torch.float64).norm(dim=-1).tolist()]
