"""An attribution graph written as circuit-tracer reads it: ``graph.pt`` (``Graph.to_pt``'s 11 keys; its
``cfg`` and ``logit_targets`` pickle as circuit-tracer's own ``UnifiedConfig`` / ``LogitTarget`` without
importing circuit-tracer here) and the graph JSON Neuronpedia's viewer reads (``create_graph_files``' schema).
"""

from __future__ import annotations

import copyreg
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from anatomy_cli.analyses.circuit import CircuitGraph
from anatomy_cli.analyses.circuit import PruneResult
from anatomy_cli.errors import AnatomyError

_MAPPING = "circuit_tracer.utils.tl_nnsight_mapping"
_TARGETS = "circuit_tracer.attribution.targets"


class _Module:
    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[object, ...]:
        return (importlib.import_module, (self.name,))


class _Attr:
    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = _Module(module), name

    def __reduce__(self) -> tuple[object, ...]:
        return (getattr, (self.module, self.name))


class Foreign:
    """Pickles as circuit-tracer's ``module.name`` rebuilt where circuit-tracer is installed: a dataclass from
    its fields (``fields``), a NamedTuple from its values (``values``), by ``copyreg._reconstructor`` (stdlib)."""

    def __init__(self, module: str, name: str, *, fields: Mapping[str, object] | None = None,
                 values: tuple[object, ...] | None = None) -> None:
        self.ref, self.fields, self.values = _Attr(module, name), fields, values

    def __reduce__(self) -> tuple[object, ...]:
        if self.values is not None:
            return (copyreg._reconstructor, (self.ref, tuple, self.values))  # type: ignore[attr-defined]
        return (copyreg._reconstructor, (self.ref, object, None), self.fields)  # type: ignore[attr-defined]


def config_args(n_layers: int, d_model: int, d_head: int, n_heads: int, d_mlp: int, d_vocab: int,
                tokenizer_name: str, model_name: str, architecture: str, n_kv_heads: int | None) -> dict[str, Any]:
    """``UnifiedConfig``'s fields."""
    return {"n_layers": n_layers, "d_model": d_model, "d_head": d_head, "n_heads": n_heads, "d_mlp": d_mlp,
            "d_vocab": d_vocab, "tokenizer_name": tokenizer_name, "model_name": model_name,
            "original_architecture": architecture, "n_key_value_heads": n_kv_heads, "dtype": None}


def save_pt(graph: CircuitGraph, path: str | Path, cfg_args: Mapping[str, object]) -> None:
    """``torch.save`` of circuit-tracer's ``Graph.to_pt`` dict."""
    torch.save({
        "input_string": graph.input_string,
        "adjacency_matrix": graph.adjacency_matrix.float(),
        "cfg": Foreign(_MAPPING, "UnifiedConfig", fields=cfg_args),
        "active_features": graph.active_features.long(),
        "logit_targets": [Foreign(_TARGETS, "LogitTarget", values=(s, int(i))) for s, i in graph.logit_targets],
        "logit_probabilities": graph.logit_probabilities.float(),
        "vocab_size": graph.vocab_size,
        "input_tokens": graph.input_tokens.long(),
        "selected_features": graph.selected_features.long(),
        "activation_values": graph.activation_values.float(),
        "scan": graph.scan,
    }, str(path))


def _cantor(layer: int, feature: int) -> int:
    return (layer + feature) * (layer + feature + 1) // 2 + feature


def error_ids(layer: int, pos: int, ids: str = "current") -> tuple[str, str]:
    """An error node's ``(node_id, jsNodeId)``: circuit-tracer's since its fix of issue #78 (``{layer}_-1_{pos}``,
    ``{layer}_-1-{pos}``: feature slot -1, never a real feature, so the id parses back as layer, feature, position
    and names no feature), or 0.5.0's (``ids="ct-0.5"``: ``0_{layer}_{pos}``, which equals the id of feature
    ``layer`` of block 0 at the same position, and ``{layer}_{pos}-0``)."""
    if ids == "ct-0.5":
        return f"0_{layer}_{pos}", f"{layer}_{pos}-0"
    return f"{layer}_-1_{pos}", f"{layer}_-1-{pos}"


def _nodes(graph: CircuitGraph, prune: PruneResult, labels: dict[tuple[int, int], str], ids: str
           ) -> list[dict[str, Any]]:
    n_sel, n_pos, n_layers = graph.n_features, graph.n_pos, graph.n_layers
    n_err = n_layers * n_pos
    infl = prune.cumulative_scores
    nodes: list[dict[str, Any]] = []

    def node(i: int, node_id: str, feature: int, layer: str, ctx: int, kind: str, js: str, **extra: object) -> None:
        nodes.append({"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": ctx, "feature_type": kind,
                      "token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0,
                      "jsNodeId": js, "clerp": "", "influence": float(infl[i]), "activation": None, **extra,
                      "_index": i})

    for i in range(n_sel):
        layer, pos, feat = (int(v) for v in graph.active_features[graph.selected_features[i]])
        node(i, f"{layer}_{feat}_{pos}", _cantor(layer, feat), str(layer), pos, "cross layer transcoder",
             f"{layer}_{feat}-0", clerp=labels.get((layer, feat), ""),
             activation=float(graph.activation_values[graph.selected_features[i]]))
    for e in range(n_err):
        layer, pos = divmod(e, n_pos)
        node_id, js = error_ids(layer, pos, ids)
        node(n_sel + e, node_id, -1, str(layer), pos, "mlp reconstruction error", js)
    for pos in range(n_pos):
        tok = int(graph.input_tokens[pos])
        node(n_sel + n_err + pos, f"E_{tok}_{pos}", pos, "E", pos, "embedding", f"E_{tok}-{pos}")
    for j, ((text, vid), p) in enumerate(zip(graph.logit_targets, graph.logit_probabilities.tolist())):
        node(n_sel + n_err + n_pos + j, f"{n_layers + 1}_{vid}_{n_pos - 1}", vid, str(n_layers + 1), n_pos - 1,
             "logit", f"L_{vid}-{n_pos - 1}", token_prob=float(p), is_target_logit=j == 0,
             clerp=f'Output "{text}" (p={p:.3f})', influence=None)
    return nodes


def written_nodes(graph: CircuitGraph, prune: PruneResult, labels: dict[tuple[int, int], str] | None = None,
                  ids: str = "current") -> dict[int, dict[str, Any]]:
    """The nodes the graph JSON holds, by their index in the adjacency matrix (in circuit-tracer's order): kept
    nodes with a kept link between kept nodes, plus every token and logit. Refuses (AnatomyError naming it) an id
    that two of them would share: only 0.5.0's error ids (``ids="ct-0.5"``) can."""
    every = _nodes(graph, prune, labels or {}, ids)
    kept = {n.pop("_index"): n for n in every if bool(prune.node_mask[n["_index"]])}
    used: set[int] = set()
    for dst, src in prune.edge_mask.nonzero().tolist():
        if dst in kept and src in kept:
            used.update((dst, src))
    out = {i: n for i, n in kept.items() if i in used or n["feature_type"] in ("embedding", "logit")}
    seen: dict[str, dict[str, Any]] = {}
    for n in out.values():
        other = seen.setdefault(n["node_id"], n)
        if other is not n:
            raise AnatomyError(
                f"--ids {ids}: node id {n['node_id']} would name two nodes of this graph ({other['feature_type']} "
                f"of layer {other['layer']} and {n['feature_type']} of layer {n['layer']}, position {n['ctx_idx']}):"
                f" no file written; the default --ids current gives every node its own id")
    return out


def kept_links(prune: PruneResult, kept: dict[int, dict[str, Any]]) -> list[tuple[int, int]]:
    """The graph JSON's links as (target, source) node indices, in its order: kept edges between ``kept`` nodes."""
    return [(dst, src) for dst, src in prune.edge_mask.nonzero().tolist() if dst in kept and src in kept]


def graph_json(graph: CircuitGraph, prune: PruneResult, kept: dict[int, dict[str, Any]], *, slug: str,
               node_threshold: float) -> dict[str, Any]:
    """The Neuronpedia graph dict (``metadata``, ``qParams``, ``nodes``, ``links``) of circuit-tracer's
    ``create_graph_files``: the nodes ``kept`` (:func:`written_nodes`: with a kept link, plus every token and
    logit), the kept edges between them."""
    a = graph.adjacency_matrix
    links = [{"source": kept[src]["node_id"], "target": kept[dst]["node_id"], "weight": float(a[dst, src])}
             for dst, src in kept_links(prune, kept)]
    scan = graph.scan
    metadata = {"slug": slug, "scan": scan if not isinstance(scan, list) else "custom", "transcoder_list":
                scan if isinstance(scan, list) else [], "prompt_tokens": list(graph.pieces),
                "prompt": graph.input_string, "node_threshold": node_threshold, "schema_version": 1}
    return {"metadata": metadata, "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both",
                                              "clickedId": "", "sg_pos": ""}, "nodes": list(kept.values()),
            "links": links}
