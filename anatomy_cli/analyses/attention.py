"""`anatomy attn`: attention patterns in long form, one row per weight, and the top keys per row.

Pure: tensors in (from :func:`anatomy_cli.engine.attention_patterns`), frozen results out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Weight:
    """One attention weight: query ``query_position`` of (``layer``, ``head``) on key ``key_position``."""

    layer: int
    head: int
    query_position: int
    key_position: int
    query_token: str
    key_token: str
    weight: float


@dataclass(frozen=True)
class Attention:
    """Attention patterns of ``heads`` in ``layers`` at ``queries``, in long form.

    ``weights``: one :class:`Weight` per (layer, head, query, visible key), in that order; for a
    causal model the keys after the query are left out (their weight is exactly 0).
    ``grid``: float ``[len(layers), len(heads), len(queries), n_keys]``, the same numbers
    (0 where a key is not visible). Weights are probabilities in [0, 1]; each query row sums to 1.
    """

    layers: tuple[int, ...]
    heads: tuple[int, ...]
    queries: tuple[int, ...]
    tokens: tuple[str, ...]
    causal: bool
    weights: tuple[Weight, ...]
    grid: torch.Tensor

    def to_dict(self) -> dict[str, object]:
        return {"layers": list(self.layers), "heads": list(self.heads), "query_positions": list(self.queries),
                "causal": self.causal, "weights": [asdict(w) for w in self.weights]}

    def top_keys(self, layer_index: int, head_index: int, query_index: int, k: int) -> list[tuple[int, float]]:
        """The ``k`` heaviest keys of one row as ``(key_position, weight)``, heaviest first (ties: earlier key)."""
        row = self.grid[layer_index, head_index, query_index]
        n = self.queries[query_index] + 1 if self.causal else row.shape[0]
        values, index = torch.sort(row[:n], descending=True, stable=True)
        return [(int(i), float(v)) for v, i in zip(values[:k], index[:k])]


def attention(grid: torch.Tensor, *, layers: Sequence[int], heads: Sequence[int], queries: Sequence[int],
              tokens: Sequence[str], causal: bool) -> Attention:
    """Long form of ``grid``: float ``[len(layers), len(heads), len(queries), pos]``.

    ``tokens``: the display piece of each position (``pos`` of them). Raises ValueError when the
    shapes disagree.
    """
    grid = grid.detach().float().cpu()
    shape = (len(layers), len(heads), len(queries), len(tokens))
    if tuple(grid.shape) != shape:
        raise ValueError(f"grid is {tuple(grid.shape)}, expected {shape}")
    values = grid.tolist()
    rows: list[Weight] = []
    for a, layer in enumerate(layers):
        for b, head in enumerate(heads):
            for c, q in enumerate(queries):
                last = q + 1 if causal else len(tokens)
                rows.extend(Weight(layer, head, q, key, tokens[q], tokens[key], values[a][b][c][key])
                            for key in range(last))
    return Attention(layers=tuple(layers), heads=tuple(heads), queries=tuple(queries), tokens=tuple(tokens),
                     causal=causal, weights=tuple(rows), grid=grid)
