"""`circuit`: the attribution graph of a prompt's next-token prediction over a replacement model built from
transcoders (circuit-tracer 0.5.0's ``attribute``), in phase order over four files:

1. open the model and the dictionaries: :func:`check` here (refused before any weight loads: a missing transcoder
   folder, a set whose layer count or width does not fit the model, hooks other than MLP in → MLP out, an
   encoder, bad thresholds or counts), then :func:`run` opens the transcoders (engine/replacement.py
   ``open_transcoders``: --offload, the cross-layer decoders read row by row; the files: models/transcoders.py);
2. the forward of the replacement model: engine/replacement.py (attention patterns, norm denominators and MLP
   outputs frozen at the prompt's; ``frozen``, ``forward``);
3. attribution: analyses/circuit.py ``setup`` and ``attribute`` (the adjacency by batched backward passes);
4. pruning and the graph: analyses/circuit.py ``prune`` and ``scores``; analyses/circuit_files.py writes graph.pt
   and the Neuronpedia JSON;
5. the result: :func:`one` and :func:`paths` here.

Beside the path: ``--estimate`` (tasks/_circuit_estimate.py), ``--check`` (analyses/circuit_check.py), ``--heads``
(analyses/circuit_heads.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare import shared
from anatomy_cli.errors import UsageError
from anatomy_cli.models import transcoders as tc_files
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.models.feature_labels import BlockLabels
from anatomy_cli.models.feature_labels import block_labels
from anatomy_cli.models.sae.names import mlp_norm
from anatomy_cli.models.sites import block_spans
from anatomy_cli.tasks import _circuit_estimate as _estimate
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._circuit_estimate import CircuitEstimate
from anatomy_cli.tasks._circuit_estimate import heads_cost
from anatomy_cli.tasks._circuit_options import CircuitOptions
from anatomy_cli.tasks.session import busy_threads
from anatomy_cli.text import targets
from anatomy_cli.text.display import visible
from anatomy_cli.units import counted

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.circuit import CircuitGraph
    from anatomy_cli.analyses.circuit import PruneResult
    from anatomy_cli.analyses.circuit_check import EdgeCheck
    from anatomy_cli.analyses.circuit_check import FrozenPrompt
    from anatomy_cli.analyses.circuit_heads import Attention
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.replacement import Transcoders
    from anatomy_cli.models.feature_labels import BlockLabels
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "circuit"
__all__ = ["COMMAND", "CircuitEstimate", "CircuitOptions", "CircuitPlan", "CircuitResult", "PathRow", "check",
           "estimate", "run"]


@dataclass(frozen=True)
class CircuitPlan:
    """The transcoders' description; ``labels``: ``{(block, feature): description}``, their sources, top tokens and
    dashboards (models/feature_labels.py ``block_labels``);
    ``target_ids``: ``--target``'s and ``--target-id``'s token ids, in order (none: the salient logits)."""

    transcoders: tc_files.TranscoderSet
    labels: BlockLabels = field(default_factory=lambda: _no_labels())
    target_ids: tuple[int, ...] = ()


def before_open(opts: CircuitOptions) -> None:
    """The transcoders' folder read (config and headers) before the model opens: one that holds none is refused
    at once, not after the open's seconds (:func:`check` reads it again, with the model, and refuses a block missing:
    only the model's config says which blocks 0..L-1 a folder per block must hold)."""
    tc_files.describe(opts.transcoders)


def check(opened: Opened, opts: CircuitOptions) -> CircuitPlan:
    """Every refusal that needs no weights: the model is a decoder with an LM head, the transcoders fit it (those
    of ``ln2.hook_normalized``: its MLP reads a norm), each ``--target`` is one token of ``opened``'s tokenizer
    and each ``--target-id`` in its LM head (text/targets.py ``resolve``, as ``next`` and ``attribute`` check
    theirs; ``--estimate`` too) and the ``--labels`` export reads (a malformed one is a one-line error here,
    before the weights load)."""
    info = opened.info
    require(info, Need.decoder, Need.lm_head, command=COMMAND)
    ts = tc_files.describe(opts.transcoders)
    tc_files.check_fits(ts, info.n_layers, info.d_model, info.display_name)
    if ts.before_gain:  # ln2.hook_normalized: the MLP must read a norm whose gain the run divides out

        mlp_norm(info.adapter, opened.name)
    ids = tuple(targets.resolve(opened.tokenizer, c, model=opened.name, vocab_size=info.lm_head_rows)
                for c in opts.wanted)
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:  # two logit nodes of one token would share a node id in the JSON (Neuronpedia refuses the file)
        raise UsageError(f"--target / --target-id name token id {', '.join(map(str, twice))} more than once: "
                         f"each logit node once")
    if opts.estimate:
        return CircuitPlan(ts, target_ids=ids)

    own = ts.paths if ts.sae_format else ()
    return CircuitPlan(ts, block_labels(Path(ts.root), own, info.n_layers, opts.labels,
                                        shared.features_dirs(opts.features_dir)), ids)


def _no_labels() -> BlockLabels:
    return BlockLabels()


def estimate(info: ModelInfo, encoded: list[Encoded], opts: CircuitOptions, plan: CircuitPlan, device: str,
             warned: Sequence[str] = ()) -> list[CircuitEstimate]:
    """``--estimate``: per prompt the graph's size, memory and time from the model's shape (``info``: config or
    header), the transcoders' headers and the token count; no weight is read. ``device``: ``--device``
    (``auto`` resolved as loading resolves it); ``warned``: each estimate's ``warnings`` (:func:`run`'s)."""
    from anatomy_cli.engine.loading import resolve_device

    kind = resolve_device(device).type
    return [replace(_estimate.estimate(info, plan.transcoders, len(enc), opts, kind), warnings=tuple(warned))
            for enc in encoded]


def run(lm: LoadedModel, encoded: list[Encoded], opts: CircuitOptions, plan: CircuitPlan, *,
        batch: bool | None = None, warned: Sequence[str] = ()) -> list[CircuitResult] | list[CircuitEstimate]:
    """The graphs (``opts.estimate``: the estimates, on the loaded model's device). ``batch``: the prompts are a
    batch (the CLI: read from stdin; default: more than one), so ``--out`` and ``--json`` write one file per prompt,
    ``FILE-1.json``, ``FILE-2.json``, ... as ``--plot`` does. Each result's ``warnings``: ``warned`` (what opening
    the model and encoding the prompts warned of, as the CLI and the API driver record them) then those said while
    its graph was computed (stderr has them too). On one thread on a busy machine
    (:func:`~anatomy_cli.tasks.session.busy_threads`)."""
    if opts.estimate:
        return estimate(lm.info, encoded, opts, plan, str(lm.device), warned)
    from anatomy_cli.engine.replacement import open_transcoders

    out = []
    if opts.offload == "cpu" and lm.device.type == "cpu":
        notes.info("--offload cpu: the model runs on the CPU, so the transcoders are on it already (nothing moved)")
    transcoders = open_transcoders(plan.transcoders, lm.device, opts.offload)
    numbered = len(encoded) > 1 if batch is None else batch
    with busy_threads(COMMAND):
        for i, enc in enumerate(encoded, start=1):
            with notes.status(f"attributing {counted(len(enc), 'token')}"), notes.recorded() as said:
                res = one(lm, enc, transcoders, opts, plan, i if numbered else None)
            out.append(replace(res, warnings=(*warned, *said)))
    return out


@dataclass(frozen=True)
class PathRow:
    """One of the strongest direct sources of the target logit in the pruned graph, with its strongest source."""

    node: str
    kind: str
    layer: str
    position: int
    token: str
    weight: float
    influence: float
    via: str
    via_weight: float | None  # None (empty in tsv, null in JSON): no kept source (``via`` "")
    label: str | None = None  # a feature's label, or "top tokens: …"; None (no key): the run has neither
    head: str | None = None  # --heads: the (block.head) with the largest part of ``weight``; not written without
    head_part: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None or k not in ("label", "head", "head_part")}


@dataclass(frozen=True)
class CircuitResult:
    graph: CircuitGraph
    prune: PruneResult
    json: dict[str, Any]
    paths: tuple[PathRow, ...]
    replacement_score: float
    completeness_score: float
    checks: tuple[EdgeCheck, ...] = ()
    attention: Attention | None = None  # --heads
    warnings: tuple[str, ...] = ()  # what the run warned of on stderr (:func:`run`): the JSON's ``warnings``

    def to_dict(self) -> dict[str, Any]:
        g = self.graph
        out: dict[str, Any] = {
            "n_active_features": int(g.active_features.shape[0]), "n_selected_features": g.n_features,
            "n_nodes": int(g.adjacency_matrix.shape[0]), "n_kept_nodes": int(self.prune.node_mask.sum()),
            "n_kept_edges": int(self.prune.edge_mask.sum()),
            "targets": [{"token": t, "id": i, "prob": float(p)} for (t, i), p in
                        zip(g.logit_targets, g.logit_probabilities.tolist())],
            "replacement_score": self.replacement_score, "completeness_score": self.completeness_score,
            "paths": [p.to_dict() for p in self.paths], "warnings": list(self.warnings)}
        if "feature_labels" in self.json["metadata"]:  # the labels' sources, top tokens, dashboards (label_metadata)
            out["feature_labels"] = self.json["metadata"]["feature_labels"]
        if self.checks:
            out["check"] = {"n_edges": len(self.checks),
                            "max_relative_error": max(c.relative_error for c in self.checks),
                            "max_abs_error": max(abs(c.measured - c.weight) for c in self.checks)}
        if self.attention is not None:
            out["qk"] = self.json.get("qk", [])
        return out


def _targets(opts: CircuitOptions, plan: CircuitPlan, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logit nodes: ``--target`` / ``--target-id``'s ids (tasks/circuit.py ``check``), else the salient
    logits."""
    import torch

    from anatomy_cli.analyses.circuit import salient_logits

    if not plan.target_ids:
        return salient_logits(logits, opts.max_n_logits, opts.desired_logit_prob)
    idx = torch.tensor(plan.target_ids)
    return idx, torch.softmax(logits.float(), -1)[idx]


def one(lm: LoadedModel, enc: Encoded, transcoders: Transcoders, opts: CircuitOptions,
        plan: CircuitPlan, index: int | None = None) -> CircuitResult:
    """The graph of one prompt; ``index``: its number in a batch (``--out`` / ``--json`` then name one file per
    prompt, ``FILE-1.pt``, ... as ``--plot`` does)."""
    import torch

    from anatomy_cli.analyses import circuit as algo
    from anatomy_cli.analyses import circuit_files as files
    ids = torch.tensor(enc.ids)
    if len(ids) < 2:
        raise UsageError("circuit needs a prompt of at least 2 tokens (position 0 carries no features)")
    s = algo.setup(lm, ids, transcoders)
    weak = weak_line(s.fve, len(ids) - 1)  # FVE at positions 1..
    if weak is not None:
        notes.warn(weak)
    targets, probs = _targets(opts, plan, s.logits)
    adjacency, selected, s = algo.attribute(lm, ids, transcoders, targets, probs, batch_size=opts.batch_size,
                                            max_feature_nodes=opts.max_feature_nodes,
                                            update_interval=opts.update_interval, s=s)
    graph = algo.CircuitGraph(_decode(lm, enc.ids), ids, adjacency, s.active, selected, s.values,
                              [(_decode(lm, [int(t)]), int(t)) for t in targets], probs.float(),
                              len(lm.tokenizer), lm.n_layers, [_decode(lm, [int(t)]) for t in enc.ids],
                              plan.transcoders.scan)  # decoded, as circuit-tracer's prompt_tokens
    pr = algo.prune(adjacency, graph.logit_probabilities, graph.n_pos, graph.n_features, opts.node_threshold,
                     opts.edge_threshold)
    replacement, completeness = algo.scores(adjacency, graph.logit_probabilities, graph.n_pos,
                                             lm.n_layers * graph.n_pos)
    out, json_path = (None if f is None else numbered(f, index) for f in (opts.out, opts.json))
    slug = Path(json_path).stem if json_path else "circuit"
    nodes = files.written_nodes(graph, pr, plan.labels.text, opts.ids)  # refuses an id two nodes share: nothing written
    data = files.graph_json(graph, pr, nodes, slug=slug, node_threshold=opts.node_threshold)
    data["metadata"].update(label_metadata(plan.labels, nodes.values()))
    fp = None
    if opts.check or opts.heads:
        from anatomy_cli.analyses import circuit_check

        fp = circuit_check.FrozenPrompt(lm, ids, transcoders, graph, s, capture=bool(opts.heads))
    att = _attention(fp, graph, pr, nodes, data, opts.heads, opts.batch_size) if fp is not None and opts.heads else None
    if out:
        files.save_pt(graph, out, _cfg(lm))
        notes.info(f"wrote {out}")
    if json_path:
        Path(json_path).write_text(json.dumps(data, indent=2))
        notes.info(f"wrote {json_path}")
    checks: tuple[EdgeCheck, ...] = ()
    if opts.check and fp is not None:
        from anatomy_cli.analyses import circuit_check

        checks = tuple(circuit_check.check_edges(fp, opts.check))
    rows = tuple(paths(graph, pr, nodes, opts.top, plan.labels, att))
    return CircuitResult(graph, pr, data, rows, replacement, completeness, checks, att)


def _attention(fp: FrozenPrompt, graph: CircuitGraph, pr: PruneResult, nodes: dict[int, dict[str, Any]],
               data: dict[str, Any], n: int, batch: int) -> Attention:
    """``--heads``: every written link split by head (its ``heads`` field in ``data``) and the ``n`` strongest
    heads' QK attributions over the written source nodes (``data["qk"]``); ``batch`` (--batch-size) copies of the
    prompt per replay."""
    from anatomy_cli.analyses import circuit_files as files
    from anatomy_cli.analyses import circuit_heads as ch

    links = files.kept_links(pr, nodes)
    sources = sorted(i for i in nodes if i < graph.adjacency_matrix.shape[0] - graph.n_logits)
    notes.info(heads_cost(fp.lm.info, graph.n_pos, len(links), len({t for t, _ in links}),
                          len({s for _, s in links}), len(sources), batch, fp.lm.device.type).line())
    with notes.status(f"splitting {counted(len(links), 'edge')} by head"):
        att = ch.attention(fp, links, n, sources, batch)
    for link, sp in zip(data["links"], att.splits):
        link["heads"] = ch.link_heads(sp)
    names = {i: str(nd["node_id"]) for i, nd in nodes.items()}
    data["qk"] = [ch.qk_json(sc, names) for sc in att.scores]
    return att


def numbered(path: str, index: int | None) -> str:
    """``path`` for one prompt; for prompt ``index`` of a batch, ``-index`` before its suffix (output/plots
    ``numbered``, the rule ``--plot`` follows)."""
    if index is None:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{index}{p.suffix}"))


def weak_line(fve: tuple[float | None, ...], positions: int) -> str | None:
    """The warning when transcoders are too weak to read on this prompt (:func:`anatomy_cli.analyses.sae.too_weak`:
    the rule fit-sae applies on its held-out window; ``positions``: those the FVE was measured on, a prompt of
    fewer than 8 is not judged): their features explain little, the graph is mostly error nodes. None: none is."""
    from anatomy_cli.analyses.sae import FVE_LOW
    from anatomy_cli.analyses.sae import too_weak

    weak = [layer for layer, f in enumerate(fve) if too_weak(f, positions)]
    if not weak:
        return None
    return (f"the transcoders are too weak to read at {len(weak)} of {len(fve)} blocks on this prompt (FVE under "
            f"{FVE_LOW} of the MLP output: {block_spans(weak)}): the graph is mostly error nodes; fit them on more "
            "text (docs/commands/sae.md#what-a-useful-fit-takes)")


def _cfg(lm: LoadedModel) -> dict[str, Any]:
    from anatomy_cli.analyses.circuit_files import config_args

    cfg = lm.model.config
    arch = (getattr(cfg, "architectures", None) or [type(lm.model).__name__])[0]
    return config_args(lm.n_layers, lm.d_model, lm.d_head, lm.n_heads, int(getattr(cfg, "intermediate_size", 0) or
                       getattr(cfg, "n_inner", 0) or 4 * lm.d_model), lm.vocab_size, lm.name, lm.name, arch,
                       getattr(cfg, "num_key_value_heads", None))


def label_metadata(labels: BlockLabels, nodes: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The graph JSON's ``metadata.feature_labels`` (none without labels, top tokens or dashboards): ``sources``
    (where the ``clerp`` labels came from), ``top_tokens`` (``"{block}_{feature}"`` -> the feature's most promoted
    tokens, for the kept features without a label: no label) and ``dashboards`` (block -> the features dashboard
    page; a feature's panel is ``#f-{feature}``)."""
    if not (labels.sources or labels.top_tokens or labels.dashboards):
        return {}
    feats = {_block_feature(n) for n in nodes if n["feature_type"] == "cross layer transcoder"}
    top = {f"{b}_{f}": t for (b, f), t in sorted(labels.top_tokens.items()) if (b, f) in feats
           and (b, f) not in labels.text}
    return {"feature_labels": {"sources": list(labels.sources), "top_tokens": top,
                               "dashboards": {str(b): u for b, u in sorted(labels.dashboards.items())}}}


def paths(graph: CircuitGraph, pr: PruneResult, nodes: dict[int, dict[str, Any]], top: int,
          labels: BlockLabels | None = None, att: Attention | None = None) -> list[PathRow]:
    """The ``top`` strongest kept edges into the first target logit, each source with its own strongest kept source
    of any kind (feature, error node, token), read from the adjacency matrix by node index (``nodes``: the written
    nodes by index, circuit_files ``written_nodes``; ids only name them). Error nodes and tokens are the graph's
    inputs: circuit-tracer computes no edge into them, so their ``via`` is "" and ``via_weight`` None. ``att``
    (``--heads``): each row's ``head``, the (block.head) with the largest part of its weight, "" where no head
    carries any (the bypass all of it)."""
    a, mask = graph.adjacency_matrix, pr.edge_mask

    def into(dst: int) -> list[tuple[float, int]]:
        return [(float(a[dst, src]), src) for src in mask[dst].nonzero().flatten().tolist() if src in nodes]

    pieces = [visible(p) for p in graph.pieces]  # decoded strings, shown as the tables show
    rows = []
    for w, src in sorted(into(a.shape[0] - graph.n_logits), key=lambda e: -abs(e[0]))[:top]:
        n = nodes[src]
        best = max(into(src), key=lambda e: abs(e[0]), default=None)
        sp = None if att is None else att.split_of(a.shape[0] - graph.n_logits, src)
        top_head = [] if sp is None else sp.top(1)
        part = top_head[0][2] if top_head else (0.0 if sp is None else sp.bypass)  # no head: the bypass carries it
        rows.append(PathRow(n["node_id"], n["feature_type"], n["layer"], n["ctx_idx"], pieces[n["ctx_idx"]], w,
                            float(n["influence"] or 0.0), "" if best is None else nodes[best[1]]["node_id"],
                            None if best is None else best[0], _label(n, labels),
                            None if att is None else (f"{top_head[0][0]}.{top_head[0][1]}" if top_head else ""),
                            None if att is None else part))
    return rows


def _block_feature(node: Mapping[str, object]) -> tuple[int, int]:
    """A feature node's (block, feature index): its ``node_id`` is ``{block}_{feature}_{position}``."""
    block, feature, _ = str(node["node_id"]).split("_")
    return int(block), int(feature)


def _label(node: dict[str, Any], labels: BlockLabels | None) -> str | None:
    """A path row's label: the node's ``clerp`` (a feature's label), else the feature's top tokens, marked; None
    when the run has no labels and no top tokens."""
    if labels is None or not (labels.sources or labels.top_tokens):
        return None
    if node["feature_type"] != "cross layer transcoder":
        return ""
    tops = labels.top_tokens.get(_block_feature(node))
    return node.get("clerp") or (f"top tokens: {tops}" if tops else "")


def _decode(lm: LoadedModel, ids: list[int]) -> str:
    return str(lm.tokenizer.hf.decode(ids))  # type: ignore[attr-defined]
