"""The merged :class:`Partial` as figures: means with standard errors over windows, per layer and per head.

For a figure with values x over positions, summed over windows w with n_w values each:
``mean = Σ x / Σ n_w`` (every position weighs the same) and ``se`` is the standard error of the mean of
the window means, ``sqrt(var(m_w) / W)`` with the sample variance over the W windows (None for W < 2).
Windows, not positions, are the independent units: neighbouring positions are correlated.

Per lens (:data:`LENS_COLUMNS`), KL(final || lens), cross-entropy and entropy in nats per token and in bits per
byte, tuned-lens' conversion: ``bits/byte = (nats/token) / ln 2 · tokens / bytes``, with ``tokens`` every token
of the measured windows and ``bytes`` the UTF-8 bytes of the text they cover (special tokens: none). With ``--experts``
the MoE blocks' rows (:func:`anatomy_cli.corpus.expert_sums.summarize`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from anatomy_cli.corpus.expert_sums import summarize as expert_rows
from anatomy_cli.corpus.partial import HEAD_METRICS
from anatomy_cli.corpus.partial import LAYER_METRICS
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.partial import lens_metric
from anatomy_cli.models.sites import residual_label

LAYER_COLUMNS = ("layer", "kl_nats", "kl_nats_se", "top1_agree", "top1_agree_se", "ce_bits", "ce_bits_se",
                 "resid_norm", "resid_norm_se", "cos_to_embedding", "cos_to_embedding_se", "attn_out_norm",
                 "attn_out_norm_se", "mlp_out_norm", "mlp_out_norm_se", "max_abs", "max_abs_dim",
                 "max_abs_dim_share", "lens_positions", "ce_positions")
LENS_COLUMNS = ("layer", "kl_nats", "kl_nats_se", "kl_bits_per_byte", "ce_nats", "ce_nats_se", "ce_bits_per_byte",
                "entropy_nats", "entropy_nats_se", "entropy_bits_per_byte", "top1_agree", "top1_agree_se",
                "lens_positions", "ce_positions")
LN2 = math.log(2.0)
HEAD_COLUMNS = ("layer", "head", "entropy_nats", "entropy_nats_se", "first_token", "first_token_se",
                "prev_token", "prev_token_se")


def _mean_se(sums: dict[str, np.ndarray]) -> tuple[list[float | None], list[float | None]]:
    means: list[float | None] = []
    ses: list[float | None] = []
    for n, s, w, sw, sw2 in zip(*(sums[k].tolist() for k in ("n", "sum", "n_windows", "sum_w", "sumsq_w"))):
        means.append(s / n if n else None)
        if w >= 2:
            var = max(0.0, (sw2 - sw * sw / w) / (w - 1))
            ses.append(math.sqrt(var / w))
        else:
            ses.append(None)
    return means, ses


@dataclass(frozen=True)
class CorpusStats:
    """Residual-stream rows (``LAYER_COLUMNS``; ``layer`` ``"embed"`` for the embedding, then N for block N's
    output, the last row block L−1's: docs/engine.md#layers) and, when
    measured, per-head rows (``HEAD_COLUMNS``). ``loss_bits`` is the last layer's ``ce_bits`` (the model's
    own cross-entropy on the windows) and ``perplexity`` ``2 ** loss_bits``; None without the lens. With
    ``--experts``: ``expert_blocks``, ``experts`` and ``expert_pairs`` (the rows of
    :mod:`anatomy_cli.corpus.expert_sums`; empty otherwise)."""

    layers: tuple[dict[str, Any], ...]
    heads: tuple[dict[str, Any], ...]
    windows: int
    tokens: int
    loss_bits: float | None
    perplexity: float | None
    bytes: int = 0
    lenses: tuple[dict[str, Any], ...] = ()  # per lens {lens, source, unfitted, layers: LENS_COLUMNS rows}
    expert_blocks: tuple[dict[str, Any], ...] = ()
    experts: tuple[dict[str, Any], ...] = ()
    expert_pairs: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"windows": self.windows, "tokens": self.tokens, "bytes": self.bytes, "loss_bits": self.loss_bits,
                "perplexity": self.perplexity, "layers": [dict(r) for r in self.layers],
                "heads": [dict(r) for r in self.heads], "expert_blocks": [dict(r) for r in self.expert_blocks],
                "experts": [dict(r) for r in self.experts], "expert_pairs": [dict(r) for r in self.expert_pairs],
                "lenses": [{**lens, "layers": [dict(r) for r in lens["layers"]]} for lens in self.lenses]}


def lens_rows(part: Partial, kind: str) -> list[dict[str, Any]]:
    """One lens' :data:`LENS_COLUMNS` rows (``embed``, then the blocks); a row the lens does not read: nulls."""
    fig = {m: _mean_se(part.sums[lens_metric(kind, m)]) for m in ("kl_nats", "ce_bits", "entropy_nats", "top1_agree")}
    per_byte = part.tokens / part.bytes / LN2 if part.bytes else None
    out = []
    for l in range(part.n_layers + 1):
        kl, kl_se = fig["kl_nats"][0][l], fig["kl_nats"][1][l]
        ce_bits, ce_bits_se = fig["ce_bits"][0][l], fig["ce_bits"][1][l]
        ent, ent_se = fig["entropy_nats"][0][l], fig["entropy_nats"][1][l]
        ce = None if ce_bits is None else ce_bits * LN2
        out.append({
            "layer": residual_label(l), "kl_nats": kl, "kl_nats_se": kl_se, "kl_bits_per_byte": _times(kl, per_byte),
            "ce_nats": ce, "ce_nats_se": None if ce_bits_se is None else ce_bits_se * LN2,
            "ce_bits_per_byte": _times(ce, per_byte), "entropy_nats": ent, "entropy_nats_se": ent_se,
            "entropy_bits_per_byte": _times(ent, per_byte), "top1_agree": fig["top1_agree"][0][l],
            "top1_agree_se": fig["top1_agree"][1][l],
            "lens_positions": int(part.sums[lens_metric(kind, "kl_nats")]["n"][l]),
            "ce_positions": int(part.sums[lens_metric(kind, "ce_bits")]["n"][l])})
    return out


def _times(value: float | None, factor: float | None) -> float | None:
    return None if value is None or factor is None else value * factor


def summarize(part: Partial, lenses: tuple[str, ...] = ("logit",)) -> CorpusStats:
    """The figures of ``part`` (usually every shard merged in order); ``lenses``: the lenses it measured
    (``logit``, ``kind:PATH``), in order."""
    figures = {m: _mean_se(part.sums[m]) for m in (*LAYER_METRICS, *HEAD_METRICS)}
    total = part.argmax.sum(-1)
    layers = []
    for l in range(part.n_layers + 1):
        row: dict[str, Any] = {"layer": residual_label(l)}
        for m in LAYER_METRICS:
            row[m], row[f"{m}_se"] = figures[m][0][l], figures[m][1][l]
        dim = int(part.max_dim[l])
        row["max_abs"] = float(part.max_abs[l]) if dim >= 0 else None
        row["max_abs_dim"] = dim if dim >= 0 else None
        row["max_abs_dim_share"] = float(part.argmax[l, dim] / total[l]) if dim >= 0 and total[l] else None
        row["lens_positions"] = int(part.sums["kl_nats"]["n"][l])
        row["ce_positions"] = int(part.sums["ce_bits"]["n"][l])
        layers.append({k: row[k] for k in LAYER_COLUMNS})
    heads = []
    if part.sums["head_entropy_nats"]["n"].any():
        names = {"head_entropy_nats": "entropy_nats", "head_first_token": "first_token",
                 "head_prev_token": "prev_token"}
        for i in range(part.n_layers * part.n_heads):
            row = {"layer": i // part.n_heads, "head": i % part.n_heads}
            for m, key in names.items():
                row[key], row[f"{key}_se"] = figures[m][0][i], figures[m][1][i]
            heads.append(row)
    by_lens: list[dict[str, Any]] = []
    for text in lenses:
        kind, _, source = text.partition(":")
        rows = lens_rows(part, kind)
        measured = rows[-1]["lens_positions"] > 0
        by_lens.append({"lens": kind, "source": source or None, "layers": rows,
                        "unfitted": [r["layer"] for r in rows if measured and r["lens_positions"] == 0]})
    # the model's loss: its last block's reading, the same through every lens (each reads that row as it is)
    last = [_mean_se(part.sums[lens_metric(lens["lens"], "ce_bits")])[0][-1] for lens in by_lens]
    loss = next((bits for bits in last if bits is not None), None)
    blocks, experts, pairs = expert_rows(part.experts) if part.experts is not None else ([], [], [])
    return CorpusStats(layers=tuple(layers), heads=tuple(heads), windows=part.windows, tokens=part.tokens,
                       loss_bits=loss, perplexity=2.0 ** loss if loss is not None else None, bytes=part.bytes,
                       lenses=tuple(by_lens), expert_blocks=tuple(blocks), experts=tuple(experts),
                       expert_pairs=tuple(pairs))
