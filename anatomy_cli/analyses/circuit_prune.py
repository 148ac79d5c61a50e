"""Influence, pruning and scores of an attribution graph, as circuit-tracer 0.5.0's graph.py computes them.

``A [N, N]``: rows targets, columns sources; the last ``n_logits`` nodes are logits, the ``n_tokens`` before them
tokens, the error nodes before those.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PruneResult(NamedTuple):
    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative_scores: torch.Tensor


def normalize_matrix(a: torch.Tensor, clamp: float = 1e-10) -> torch.Tensor:
    a = a.abs()
    return a / a.sum(1, keepdim=True).clamp(min=clamp)


def compute_influence(a: torch.Tensor, weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """``sum_{k>=1} weights @ A^k`` (A is nilpotent: the loop ends when the vector is zero)."""
    current = weights @ a
    influence = current
    for _ in range(max_iter):
        if not current.any():
            return influence
        current = current @ a
        influence = influence + current
    raise RuntimeError("the influence did not converge: the graph has a cycle")


def partial_influences(edges: torch.Tensor, probs: torch.Tensor, row_node: torch.Tensor,
                       max_iter: int = 128) -> torch.Tensor:
    """The influence of every node on the logits through the rows computed so far (``edges [rows, N]``,
    ``row_node``: each row's node)."""
    norm = normalize_matrix(edges, 1e-8)
    prod = torch.zeros(edges.shape[1], dtype=edges.dtype)
    prod[-len(probs):] = probs.to(edges.dtype)
    influence = torch.zeros_like(prod)
    for _ in range(max_iter):
        prod = prod[row_node] @ norm
        if not prod.any():
            break
        influence = influence + prod
    return influence


def find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    ordered = torch.sort(scores, descending=True).values
    cum = torch.cumsum(ordered, 0) / ordered.sum()
    idx = min(int(torch.searchsorted(cum, threshold)), len(cum) - 1)
    return ordered[idx]


def logit_weights(n: int, probs: torch.Tensor) -> torch.Tensor:
    w = torch.zeros(n)
    w[n - len(probs):] = probs.float()
    return w


def prune(a: torch.Tensor, probs: torch.Tensor, n_tokens: int, n_features: int, node_threshold: float = 0.8,
          edge_threshold: float = 0.98) -> PruneResult:
    """circuit-tracer's ``prune_graph``: nodes by cumulative influence, then edges by edge influence, then nodes
    without a kept edge (features need one in and one out; errors one out), to a fixed point."""
    n, n_logits = a.shape[0], len(probs)
    w = logit_weights(n, probs)
    influence = compute_influence(normalize_matrix(a), w)
    node_mask = influence >= find_threshold(influence, node_threshold)
    node_mask[n - n_logits - n_tokens:] = True
    pruned = a.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    norm = normalize_matrix(pruned)
    edge_scores = norm * (compute_influence(norm, w) + w)[:, None]
    edge_mask = edge_scores >= find_threshold(edge_scores.flatten(), edge_threshold)
    sources = n - n_logits - n_tokens
    while True:
        old = node_mask.clone()
        node_mask[:sources] &= edge_mask[:, :sources].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
        if torch.equal(old, node_mask):
            break
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
    ordered = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[ordered.indices] = torch.cumsum(ordered.values, 0) / ordered.values.sum()
    return PruneResult(node_mask, edge_mask, cumulative)


def scores(a: torch.Tensor, probs: torch.Tensor, n_tokens: int, n_errors: int) -> tuple[float, float]:
    """(replacement, completeness) as circuit-tracer's ``compute_graph_scores``."""
    n, n_logits = a.shape[0], len(probs)
    err_start = n - n_logits - n_tokens - n_errors
    w = logit_weights(n, probs)
    norm = normalize_matrix(a)
    infl = compute_influence(norm, w)
    tok = infl[n - n_logits - n_tokens:n - n_logits].sum()
    err = infl[err_start:err_start + n_errors].sum()
    replacement = tok / (tok + err)
    non_error = 1 - norm[:, err_start:err_start + n_errors].sum(1)
    both = infl + w
    completeness = (non_error * both).sum() / both.sum()
    return float(replacement), float(completeness)
