"""Edges checked by intervention: on the frozen replacement model (the prompt's patterns, denominators and MLP
outputs replayed, so the model is linear in its sources) removing a source node's vector changes a target's
input by that edge's weight exactly; and the bias run (every source removed) gives each node's bias terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anatomy_cli.analyses.circuit import CircuitGraph
from anatomy_cli.analyses.circuit import Setup
from anatomy_cli.analyses.circuit import logit_vectors
from anatomy_cli.engine import replacement as rep
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.replacement import Transcoders


@dataclass(frozen=True)
class EdgeCheck:
    target: int
    source: int
    weight: float
    measured: float

    @property
    def relative_error(self) -> float:
        return abs(self.measured - self.weight) / max(abs(self.weight), 1e-12)


class FrozenPrompt:
    """The prompt's frozen forward, recorded once; :meth:`run` replays it with sources removed. ``capture``: the
    freezer captures each attention call (engine/replacement.py ``Freezer``)."""

    def __init__(self, lm: LoadedModel, ids: torch.Tensor, transcoders: Transcoders, graph: CircuitGraph,
                 s: Setup, capture: bool = False) -> None:
        self.lm, self.ids, self.tcs, self.graph, self.s = lm, ids, transcoders, graph, s
        fz = rep.Freezer()
        fz.capture = {} if capture else None
        with rep.frozen(lm, fz), torch.no_grad():
            self.base = rep.forward(lm, ids, transcoders, 1)
        self.freezer = fz
        self.logit_vecs = logit_vectors(lm, torch.tensor([t for _, t in graph.logit_targets]))

    def source(self, node: int) -> list[tuple[int, int, torch.Tensor]]:
        """(layer, position, vector) for each place a source node writes (layer -1: the embedding); a
        cross-layer feature writes to every block from its own on."""
        g, s = self.graph, self.s
        n_sel, n_pos, n_layers = g.n_features, g.n_pos, g.n_layers
        if node < n_sel:
            return s.writes(int(g.selected_features[node]))
        node -= n_sel
        if node < n_layers * n_pos:
            return [(node // n_pos, node % n_pos, s.errors[node // n_pos, node % n_pos])]
        pos = node - n_layers * n_pos
        return [(-1, pos, s.tokens[pos])]

    def value(self, fw: rep.Forward, node: int, row: int = 0) -> float:
        """A target's input in copy ``row`` of ``fw``: a logit node's demeaned unembedding · final norm output at
        the last position; a feature's W_enc row · its MLP input."""
        return float(self.read(fw, node, row))

    def read(self, fw: rep.Forward, node: int, row: int = 0) -> torch.Tensor:
        """:meth:`value` as a tensor (a gradient can be taken of it)."""
        g = self.graph
        n = g.adjacency_matrix.shape[0]
        if node >= n - g.n_logits:
            return fw.final[row, -1].float() @ self.logit_vecs[node - (n - g.n_logits)]
        i = int(g.selected_features[node])
        layer, pos, _ = (int(v) for v in self.s.active[i])
        return fw.mlp_in[layer][row, pos].float() @ self.s.encoder[i]

    def run(self, removed: list[tuple[int, int, torch.Tensor]], hold: bool = False) -> rep.Forward:
        """The replay with ``removed`` taken out; ``hold``: every attention output held at the base forward's
        (needs ``capture``), so that the removal reaches only what no head carries."""
        return self.run_rows([removed], hold)

    def run_rows(self, rows: list[list[tuple[int, int, torch.Tensor]]], hold: bool = False) -> rep.Forward:
        """:meth:`run` of several removals at once: copy ``i`` of the prompt (a batch of ``len(rows)``) with
        ``rows[i]`` taken out; each copy's values are those of its own :meth:`run` (the replay fixes every
        pattern, denominator and MLP output, so the copies do not meet). The MLPs run on one copy (their
        outputs are the recorded constants plus the skip path)."""
        def edit(layer: int, value: torch.Tensor) -> torch.Tensor:
            value = value.clone()
            for row, removed in enumerate(rows):
                for lay, pos, vec in removed:
                    if lay == layer:
                        value[row, pos] -= vec.to(value.dtype)
            return value

        self.freezer.replay, self.freezer.hold = True, hold
        try:
            with rep.frozen(self.lm, self.freezer), torch.no_grad():
                return rep.forward(self.lm, self.ids, self.tcs, len(rows), edit=edit, shared_mlp=len(rows) > 1)
        finally:
            self.freezer.replay = self.freezer.hold = False


def check_edges(fp: FrozenPrompt, n: int, seed: int = 0) -> list[EdgeCheck]:
    """``n`` edges of the graph (nonzero weights into feature and logit rows, sampled with ``seed``), each
    re-measured as base value - value with the source removed."""
    a = fp.graph.adjacency_matrix
    targets, sources = torch.nonzero(a, as_tuple=True)
    if len(targets) == 0:
        return []
    pick = torch.randperm(len(targets), generator=torch.Generator().manual_seed(seed))[:n]
    out = []
    for t, src in zip(targets[pick].tolist(), sources[pick].tolist()):
        measured = fp.value(fp.base, t) - fp.value(fp.run(fp.source(src)), t)
        out.append(EdgeCheck(t, src, float(a[t, src]), measured))
    return out


def bias_terms(fp: FrozenPrompt, rows: list[int]) -> list[float]:
    """Each row's value with every source node removed (all features active, errors, tokens): what the graph's
    edges do not carry (biases, position embeddings, the BOS position's MLP outputs)."""
    g = fp.graph
    n_sources = g.adjacency_matrix.shape[0] - g.n_logits
    removed = [w for i in range(n_sources) for w in fp.source(i)]
    fw = fp.run(removed)
    return [fp.value(fw, r) for r in rows]
