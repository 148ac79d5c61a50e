"""Attention inside an attribution graph (``circuit --heads``): head loadings of the edges and QK attributions of
the strongest heads, on the frozen replacement model (engine/replacement.py: patterns and norm denominators fixed
at the prompt, MLP outputs constant but for the transcoders' skip path), where every target is affine in the
sources.

Head loadings. An edge ``source -> target`` is a sum over the linear paths between them. Each path either crosses
no attention head (the residual and MLP-skip path, at the source's own position: the *bypass*), or crosses a first
head ``(l, h)``; grouping the paths by that first head splits the edge into one part per (layer, head) plus the
bypass, and the parts sum to the edge. Part ``(l, h)`` is ``sum_m G[l][m, h] · dz[l][m, h]``: ``G`` the target's
gradient with respect to the heads' outputs before the output projection (every path after them) and ``dz`` the
source's change of those outputs with every attention output held at the prompt's (paths before them with no
head). circuit-tracer PR #114 splits an edge at one attention layer at a time (that layer's heads plus a bypass
through it, per layer); the first head is the grouping that makes one partition over all layers. Through the first
attention layer after the source the two agree, and a part there equals the edge less the edge with that head's
output removed (tests/test_circuit_heads.py).

QK attributions. The head's pre-softmax score at (query ``q``, key ``k``) is ``scale · query · key`` of the vectors
the family's own attention gets (projected, query/key norms with frozen denominators, RoPE applied). Each is affine
in the graph's sources: ``query = sum_n dq_n + bias + other`` where ``dq_n`` is the query's change when node ``n``
is removed, ``bias`` the query with every source removed and ``other`` the sources not drawn (pruned nodes). The
score is the sum of the terms ``scale · dq_i · dk_j`` over query-side and key-side contributors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from anatomy_cli.analyses.circuit import CircuitGraph
from anatomy_cli.analyses.circuit_check import FrozenPrompt
from anatomy_cli.engine import replacement as rep
from anatomy_cli.engine.attention import attention_module

BIAS, OTHER = "bias", "other"  # the non-node contributors of a query or key
Pick = tuple[int, int, int, int]  # (layer, head, query position, key position)
Captured = dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # Freezer.capture


@dataclass(frozen=True)
class HeadSplit:
    """One edge split by the first head its paths cross: ``parts [L, H]`` (``parts[l, h]``) and the ``bypass``
    (paths with no head), summing to ``weight`` (the adjacency's); ``query [L, H]``: the query position that carries
    most of each part (the head reads the source's position as its key)."""

    target: int
    source: int
    weight: float
    parts: torch.Tensor
    bypass: float
    query: torch.Tensor

    @property
    def total(self) -> float:
        return float(self.parts.double().sum()) + self.bypass

    def top(self, n: int) -> list[tuple[int, int, float]]:
        """The ``n`` largest parts by size: (layer, head, part)."""
        flat = self.parts.flatten()
        order = torch.argsort(flat.abs(), descending=True)[:n]
        n_heads = self.parts.shape[1]
        return [(int(i) // n_heads, int(i) % n_heads, float(flat[i])) for i in order if float(flat[i]) != 0.0]


@dataclass(frozen=True)
class QKScore:
    """Head ``(layer, head)``'s pre-softmax score at (``query_pos``, ``key_pos``) and its terms ``[Q, K]``: rows the
    query-side contributors ``rows`` (node indices, then ``bias`` and ``other``), columns the key-side ``cols``;
    ``terms.sum() == score`` (float64). ``softcap``: the family caps scores after this (Gemma 2): the score is the one
    before the cap."""

    layer: int
    head: int
    query_pos: int
    key_pos: int
    score: float
    rows: tuple[int | str, ...]
    cols: tuple[int | str, ...]
    terms: torch.Tensor
    softcap: float | None = None

    def top(self, n: int) -> list[tuple[int | str, int | str, float]]:
        """The ``n`` largest terms by size: (query contributor, key contributor, term)."""
        flat = self.terms.flatten()
        order = torch.argsort(flat.abs(), descending=True)[:n]
        k = self.terms.shape[1]
        return [(self.rows[int(i) // k], self.cols[int(i) % k], float(flat[i])) for i in order]


def score_scale(module: torch.nn.Module, d_head: int) -> float:
    """The factor the family's eager attention multiplies ``query · key`` by: GPT-2's ``1/sqrt(d_head)`` (if
    ``scale_attn_weights``) over ``layer + 1`` (if ``scale_attn_by_inverse_layer_idx``), else ``module.scaling``."""
    if hasattr(module, "scale_attn_weights"):
        scale = d_head ** -0.5 if module.scale_attn_weights else 1.0
        if getattr(module, "scale_attn_by_inverse_layer_idx", False):
            scale /= int(getattr(module, "layer_idx", 0)) + 1
        return scale
    return float(module.scaling)  # type: ignore[arg-type]


BATCH = 32  # copies of the prompt per replay where the caller names none (circuit passes its --batch-size)


def chunks(items: list[int], size: int) -> list[list[int]]:
    """``items`` in consecutive batches of at most ``size``."""
    return [items[i:i + size] for i in range(0, len(items), max(size, 1))]


class Replay(NamedTuple):
    """One forward of the frozen replacement model: ``copies`` of the prompt, ``backward``: a backward follows."""

    copies: int
    backward: bool = False


def replays(n_targets: int, n_sources: int, n_contributors: int, batch: int = BATCH) -> list[Replay]:
    """The forwards :func:`attention` runs for ``n_targets`` targets and ``n_sources`` sources of the links and
    ``n_contributors`` QK nodes, ``batch`` copies at most per forward: the prompt's recording
    (:class:`FrozenPrompt`), the held and the plain reference replays (:class:`Heads`), a forward and a backward per
    batch of targets (:meth:`Heads.gradients`), a held forward of the batch plus the reference copy per batch of
    sources (:meth:`Heads.held`), a forward per batch of contributors and the bias run (:meth:`Heads.scores`); in
    this order where :meth:`Heads.split` holds the targets (the sources' forwards come before the targets' where
    it holds the sources).
    The cost line and ``circuit --estimate --heads`` count these (tasks/_circuit_estimate.py ``heads_cost``)."""
    def sizes(n: int) -> list[int]:
        return [len(c) for c in chunks(list(range(n)), batch)]

    return ([Replay(1)] * 3 + [Replay(c, True) for c in sizes(n_targets)] + [Replay(c + 1) for c in sizes(n_sources)]
            + [Replay(c) for c in sizes(n_contributors)] + [Replay(1)])


class Span(NamedTuple):
    """One node's per-layer ``[P, ...]`` tensors held as their positions ``start:start + n`` (``rows``), where any
    layer is nonzero: every other entry is exactly zero, so :meth:`whole` gives the tensors back bit for bit (a
    zero's sign aside) at a fraction of their size."""

    start: int
    n_pos: int
    rows: tuple[torch.Tensor, ...]

    @staticmethod
    def of(tensors: list[torch.Tensor]) -> Span:
        live = torch.stack([t.reshape(t.shape[0], -1).ne(0).any(1) for t in tensors]).any(0).nonzero()
        a, b = (int(live[0]), int(live[-1]) + 1) if len(live) else (0, 0)
        return Span(a, int(tensors[0].shape[0]), tuple(t[a:b].clone() for t in tensors))  # a copy: frees the batch

    def whole(self) -> list[torch.Tensor]:
        out = []
        for r in self.rows:
            full = r.new_zeros((self.n_pos, *r.shape[1:]))
            full[self.start:self.start + r.shape[0]] = r
            out.append(full)
        return out


class Heads:
    """The attention side of one prompt's graph: ``fp`` a :class:`FrozenPrompt` with ``capture``. Its replays
    run ``batch`` copies of the prompt at once, one removal (or one target's backward) per copy: the numbers are
    those of one replay per copy (tests/test_circuit_heads.py)."""

    def __init__(self, fp: FrozenPrompt, batch: int = BATCH) -> None:
        self.fp, self.batch = fp, batch
        self.modules = [attention_module(fp.lm, layer) for layer in range(fp.lm.n_layers)]
        self.keys = [id(m) for m in self.modules]
        fp.run([], hold=True)
        captured = fp.freezer.capture or {}
        self.base_out = [captured[k][2][0].float() for k in self.keys]  # [P, H, d_head] per layer
        fp.run([])
        self.base_qk = dict(captured)  # the plain replay's queries and keys

    def gradients(self, targets: list[int]) -> dict[int, list[torch.Tensor]]:
        """Per target node: its gradient with respect to each layer's head outputs ``[P, H, d_head]`` (the
        replay, every path); one backward per batch of targets, target ``i`` read from copy ``i``."""
        fp, fz = self.fp, self.fp.freezer
        out: dict[int, list[torch.Tensor]] = {}
        for chunk in chunks(targets, self.batch):
            fz.replay = True
            try:
                with rep.frozen(fp.lm, fz):
                    fw = rep.forward(fp.lm, fp.ids, fp.tcs, len(chunk), shared_mlp=len(chunk) > 1)
                    zs = [fz.capture[k][2] for k in self.keys]  # type: ignore[index]
                    total = torch.stack([fp.read(fw, t, row) for row, t in enumerate(chunk)]).sum()
                    grads = torch.autograd.grad(total, zs, allow_unused=True)
            finally:
                fz.replay = False
            for row, t in enumerate(chunk):
                out[t] = [torch.zeros_like(b) if g is None else g[row].float() for g, b in zip(grads, self.base_out)]
        return out

    def held(self, sources: list[int]) -> list[tuple[list[torch.Tensor], rep.Forward, int]]:
        """Per source: its change of each layer's head outputs along the paths that cross no head before them,
        the held forward (every attention output the prompt's) and the copy without it: one forward,
        copy 0 with nothing removed (the reference: in the blocks before a source, bit for bit), copy ``i`` without
        source ``i``."""
        fp = self.fp
        fw = fp.run_rows([[]] + [fp.source(s) for s in sources], hold=True)
        outs = [(fp.freezer.capture or {})[k][2].float() for k in self.keys]
        return [([o[0] - o[row] for o in outs], fw, row) for row in range(1, len(sources) + 1)]

    def split(self, links: list[tuple[int, int]], hold: str | None = None) -> list[HeadSplit]:
        """Each edge ``(target, source)`` split by first head (the module docstring). One side is held, each node's
        per-layer tensors kept from its first to its last nonzero position (:class:`Span`): ``hold`` "targets"
        (their gradients) or "sources" (their held changes and bypasses); None: the side with fewer positions by
        the nodes' own (a gradient is zero after its target's position, a held change before its source's). The
        other side runs a batch at a time, its batch dropped once its parts are taken. The replays and the
        numbers are those of holding both sides whole (tests/test_circuit_heads.py)."""
        into: dict[int, list[int]] = {}  # source -> its targets
        outof: dict[int, list[int]] = {}  # target -> its sources
        for t, s in links:
            into.setdefault(s, []).append(t)
            outof.setdefault(t, []).append(s)
        targets, sources = sorted(outof), sorted(into)
        out = []
        if (hold or self._smaller(targets, sources)) == "targets":
            grads = {t: Span.of(g) for c in chunks(targets, self.batch) for t, g in self.gradients(c).items()}
            for c in chunks(sources, self.batch):
                for s, (dz, fw, row) in zip(c, self.held(c)):
                    out += [self._split(t, s, grads[t].whole(), dz, self._bypass(fw, t, row)) for t in into[s]]
        else:
            held = {}
            for c in chunks(sources, self.batch):
                for s, (dz, fw, row) in zip(c, self.held(c)):
                    held[s] = (Span.of(dz), {t: self._bypass(fw, t, row) for t in into[s]})
            for c in chunks(targets, self.batch):
                for t, g in self.gradients(c).items():
                    out += [self._split(t, s, g, held[s][0].whole(), held[s][1][t]) for s in outof[t]]
        order = {e: i for i, e in enumerate(links)}
        return sorted(out, key=lambda h: order[(h.target, h.source)])

    def _smaller(self, targets: list[int], sources: list[int]) -> str:
        """The side whose held tensors span fewer positions: a target's gradient ``0..its position``, a source's
        held change ``its position..P - 1`` (a logit's position: the last)."""
        g = self.fp.graph
        n_sources = g.adjacency_matrix.shape[0] - g.n_logits
        at = [g.n_pos if t >= n_sources else position(g, t) + 1 for t in targets]
        return "targets" if sum(at) <= sum(g.n_pos - position(g, s) for s in sources) else "sources"

    def _bypass(self, fw: rep.Forward, target: int, row: int) -> float:
        """The edge's paths through no head: the target in the held forward's reference copy less in copy ``row``."""
        return self.fp.value(fw, target, 0) - self.fp.value(fw, target, row)

    def _split(self, target: int, source: int, grads: list[torch.Tensor], dz: list[torch.Tensor], bypass: float
               ) -> HeadSplit:
        per = torch.stack([torch.einsum("phd,phd->hp", g, d) for g, d in zip(grads, dz)])  # [L, H, P]
        return HeadSplit(target, source, float(self.fp.graph.adjacency_matrix[target, source]), per.sum(-1), bypass,
                         per.abs().argmax(-1))

    def vectors(self, picks: list[Pick], captured: Captured | None = None, row: int = 0
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The query and key of each pick (layer, head, query position, key position) in copy ``row`` of the
        last forward (``captured``: those of another)."""
        captured = self.fp.freezer.capture if captured is None else captured
        out = []
        for layer, head, q, k in picks:
            query, key, _ = captured[self.keys[layer]]  # type: ignore[index]
            group = query.shape[1] // key.shape[1]  # grouped-query: head h reads kv head h // group
            out.append((query[row, head, q].float(), key[row, head // group, k].float()))
        return out

    def scores(self, picks: list[Pick], nodes: list[int]) -> list[QKScore]:
        """Each pick's score split into query-side × key-side terms of ``nodes`` (source node indices), the bias
        (every source removed) and the other sources."""
        fp = self.fp
        base = self.vectors(picks, self.base_qk)
        deltas = []
        for chunk in chunks(nodes, self.batch):
            fp.run_rows([fp.source(n) for n in chunk])
            for row in range(len(chunk)):
                deltas.append([(bq - q, bk - k) for (bq, bk), (q, k) in zip(base, self.vectors(picks, row=row))])
        n_sources = fp.graph.adjacency_matrix.shape[0] - fp.graph.n_logits
        fp.run([w for i in range(n_sources) for w in fp.source(i)])
        bias = self.vectors(picks)
        labels: tuple[int | str, ...] = (*nodes, BIAS, OTHER)
        cap = getattr(fp.lm.model.config, "attn_logit_softcapping", None)
        out = []
        for i, (layer, head, q, k) in enumerate(picks):
            rows, cols = (_with_rest([d[i][side] for d in deltas], bias[i][side], base[i][side]) for side in (0, 1))
            scale = score_scale(self.modules[layer], int(rows.shape[1]))
            out.append(QKScore(layer, head, q, k, float(scale * base[i][0].double() @ base[i][1].double()),
                               labels, labels, scale * rows @ cols.T, None if cap is None else float(cap)))
        return out


def _with_rest(deltas: list[torch.Tensor], bias: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """One side's contributors ``[N + 2, d_head]`` in float64: the nodes' ``deltas``, ``bias`` and the rest of
    ``base`` (``other``), so that they sum to ``base``. The terms stay float64: single nodes' terms can be thousands
    of times the score they sum to (tiny random models), where float32 would lose the score."""
    rows = torch.stack([*deltas, bias]).double()
    return torch.cat([rows, (base.double() - rows.sum(0))[None]])


def position(graph: CircuitGraph, node: int) -> int:
    """A source node's position (feature, error node or token)."""
    n_sel, n_pos = graph.n_features, graph.n_pos
    if node < n_sel:
        return int(graph.active_features[graph.selected_features[node], 1])
    return (node - n_sel) % n_pos


def picks(splits: list[HeadSplit], n: int, graph: CircuitGraph) -> list[Pick]:
    """The ``n`` strongest head parts over ``splits`` as distinct (layer, head, query position, key position):
    the key is the source's position, the query where the part is carried most."""
    cands = []
    for sp in splits:
        for layer, head, w in sp.top(sp.parts.numel()):
            cands.append((abs(w), (layer, head, int(sp.query[layer, head]), position(graph, sp.source))))
    out: list[Pick] = []
    for _, pick in sorted(cands, key=lambda c: -c[0]):
        if pick not in out:
            out.append(pick)
        if len(out) == n:
            break
    return out


@dataclass(frozen=True)
class Attention:
    """``circuit --heads``: the kept edges split by head (in ``links`` order) and the chosen heads' QK scores."""

    splits: tuple[HeadSplit, ...]
    scores: tuple[QKScore, ...]

    def split_of(self, target: int, source: int) -> HeadSplit | None:
        return next((sp for sp in self.splits if (sp.target, sp.source) == (target, source)), None)


def attention(fp: FrozenPrompt, links: list[tuple[int, int]], n: int, nodes: list[int], batch: int = BATCH
              ) -> Attention:
    """Head loadings of ``links`` ((target, source) node indices) and the QK attributions of the ``n`` strongest
    heads over them, whose terms name ``nodes`` (source node indices; the other sources: ``other``); ``batch``
    copies of the prompt per replay."""
    heads = Heads(fp, batch)
    splits = heads.split(links)
    return Attention(tuple(splits), tuple(heads.scores(picks(splits, n, fp.graph), nodes)))


HEAD_PARTS = 8  # a link's largest head parts written by name; the others summed in "rest"
QK_TERMS = 20  # a score's largest terms written by name; the others summed in "rest"
QK_SIDES = 10  # the largest query-side and key-side totals written


def link_heads(sp: HeadSplit) -> dict[str, object]:
    """A link's ``heads`` field: ``bypass + sum(parts) + rest`` is its weight."""
    top = sp.top(HEAD_PARTS)
    shown = sum(w for _, _, w in top)
    return {"bypass": sp.bypass, "parts": [{"layer": layer, "head": head, "weight": w} for layer, head, w in top],
            "rest": float(sp.parts.double().sum()) - shown}


def qk_json(sc: QKScore, names: dict[int, str]) -> dict[str, object]:
    """One head's QK attribution as the graph JSON's ``qk`` entries hold it (``names``: node index -> node id): the
    largest terms (``query`` x ``key`` contributors) of all ``n_terms`` (query-side × key-side contributors), the
    rest summed, and each side's largest totals (a contributor's terms summed over the other side)."""
    def name(c: int | str) -> str:
        return c if isinstance(c, str) else names[c]

    top = sc.top(QK_TERMS)
    rows, cols = sc.terms.double().sum(1), sc.terms.double().sum(0)

    def side(totals: torch.Tensor, who: tuple[int | str, ...]) -> list[dict[str, object]]:
        order = torch.argsort(totals.abs(), descending=True)[:QK_SIDES]
        return [{"node": name(who[int(i)]), "value": float(totals[i])} for i in order if float(totals[i]) != 0.0]

    out: dict[str, object] = {
        "layer": sc.layer, "head": sc.head, "query_pos": sc.query_pos, "key_pos": sc.key_pos, "score": sc.score,
        "n_terms": int(sc.terms.numel()), "terms": [{"query": name(q), "key": name(k), "value": v} for q, k, v in top],
        "rest": float(sc.terms.double().sum()) - sum(v for _, _, v in top),
        "query_side": side(rows, sc.rows), "key_side": side(cols, sc.cols)}
    if sc.softcap is not None:
        out["softcap"] = sc.softcap
    return out
