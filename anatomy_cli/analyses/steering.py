"""Steering directions from contrastive activations: the mean difference (ActAdd / CAA) and repeng's PCA.

Pure functions over activations ``[prompts, layers, d_model]`` (float64); no model.

* ``mean``: ``mean(positive) - mean(negative)`` per layer (Turner et al. 2023, ActAdd; Rimsky et al. 2024,
  CAA). Its norm is the activations' own scale: coefficient 1 moves the negative mean onto the positive one.
* ``pca``: repeng's ``pca_diff``: the first principal component of the pair differences ``positive_i -
  negative_i`` (centred, as scikit-learn's PCA centres), unit norm, its sign chosen so that more pairs project
  the positive prompt above the negative one (repeng's rule). Needs as many positive as negative prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anatomy_cli.errors import UsageError

METHODS = ("mean", "pca")


@dataclass(frozen=True)
class LayerDirection:
    """One layer's direction and how well it separates the prompts: ``separation`` is the fraction of pairs
    (every positive with every negative for ``mean``, the given pairs for ``pca``) whose positive prompt
    projects above the negative one."""

    layer: int
    vector: torch.Tensor  # [d_model] float64
    norm: float
    separation: float

    def to_dict(self) -> dict[str, object]:
        return {"layer": self.layer, "norm": self.norm, "separation": self.separation}


def directions(pos: torch.Tensor, neg: torch.Tensor, layers: list[int], method: str = "mean"
               ) -> list[LayerDirection]:
    """One :class:`LayerDirection` per layer from ``pos [n_pos, layers, d]`` and ``neg [n_neg, layers, d]``.
    Raises UsageError for an unknown method, or ``pca`` with unequal counts or fewer than two pairs."""
    if method not in METHODS:
        raise UsageError(f"unknown --method {method!r} (one of {', '.join(METHODS)})")
    if method == "pca" and (pos.shape[0] != neg.shape[0] or pos.shape[0] < 2):
        raise UsageError(f"--method pca needs pairs: as many positive as negative prompts, at least 2 "
                         f"(got {pos.shape[0]} and {neg.shape[0]})")
    out = []
    for i, layer in enumerate(layers):
        p, n = pos[:, i].double(), neg[:, i].double()
        v = mean_difference(p, n) if method == "mean" else pca_difference(p, n)
        out.append(LayerDirection(layer, v, float(v.norm()), separation(p, n, v, paired=method == "pca")))
    return out


def mean_difference(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """``pos.mean(0) - neg.mean(0)``: ``[n, d]`` each -> ``[d]``."""
    return pos.mean(0) - neg.mean(0)


def pca_difference(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """repeng's ``pca_diff`` direction of ``n`` pairs (``[n, d]`` each): the unit first principal component of
    the centred differences, signed so that most pairs project the positive prompt higher."""
    diff = pos - neg
    centred = diff - diff.mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    v = vh[0]
    proj_p, proj_n = pos @ v, neg @ v
    if (proj_p < proj_n).double().mean() > (proj_p > proj_n).double().mean():
        v = -v
    return v


def separation(pos: torch.Tensor, neg: torch.Tensor, v: torch.Tensor, *, paired: bool) -> float:
    """Fraction of (positive, negative) pairs whose positive projects above the negative onto ``v``."""
    a, b = pos @ v, neg @ v
    if paired:
        return float((a > b).double().mean())
    return float((a[:, None] > b[None, :]).double().mean())
