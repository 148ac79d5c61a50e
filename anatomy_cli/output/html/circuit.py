"""`circuit --plot FILE.html`: the pruned attribution graph, drawn from its graph JSON (the Neuronpedia / circuit-tracer
schema that ``--json`` writes: ``metadata.prompt_tokens``, ``nodes``, ``links``).

Rows are the residual stream's readings, bottom to top: the token embeddings (``embed``), blocks 0..L−1 (feature and
error nodes), the logits; columns are the prompt's positions. Several nodes in one cell sit side by side, the most
influential (lowest cumulative influence) in the middle. The logit nodes, all at the last position, spread along their
row, the most probable over the last token, the ``LABELLED`` most probable labelled with their token. Each link is a
line from source to target, its width proportional to |weight| (the strongest ``MAX_LINKS``), blue where the source
raises the target, red where it lowers it. Hovering a node shows its id, kind, position and token, label (``clerp``;
else its top promoted tokens, marked as such, from ``metadata.feature_labels``), activation and influence. Clicking a
feature node whose block has a features dashboard (``metadata.feature_labels.dashboards``, from ``--features-dir``)
opens its panel there (``features.html#f-ID``). A graph JSON with ``--heads``' keys (``links[].heads``, ``qk``) adds
a hover at each link's midpoint and a QK panel (anatomy_cli/output/html/_circuit_heads.py); without them the page is
as before.

Labels and tokens are the user's and the model's text: they go into the page only through :func:`esc` / :func:`token`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import token
from anatomy_cli.output.html._circuit_heads import link_markers
from anatomy_cli.output.html._circuit_heads import qk_panel
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks
from anatomy_cli.output.html.markup import script_json
from anatomy_cli.text.display import visible

if TYPE_CHECKING:
    from anatomy_cli.output.html._circuit_json import Link
    from anatomy_cli.output.html._circuit_json import Node
    from anatomy_cli.output.plots.caption import Caption

MAX_LINKS = 3000  # plotly draws a few thousand segments in well under a second
LABELLED = 5  # the most probable logit nodes carry their token as a label
WIDTHS = (0.5, 1.2, 2.2, 3.5, 5.5)  # line widths of the |weight| quintiles of the strongest link
RAISE, LOWER = "#4c72b0", "#c44e52"
# the legend on one line above the plot, clear of the x-axis title below it
LEGEND = {"orientation": "h", "x": 0.0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"}
KINDS = {  # feature_type -> (legend name, marker symbol, colour)
    "embedding": ("token embedding", "square", "#8c8c8c"),
    "cross layer transcoder": ("transcoder feature", "circle", "#55a868"),
    "mlp reconstruction error": ("error (reconstruction)", "diamond", "#dd8452"),
    "logit": ("logit", "star", "#8172b3"),
}


def row_of(node: Node, n_layers: int) -> int:
    """The node's row: 0 for the embeddings, block + 1 for features and errors, n_layers + 1 for the logits."""
    if node["feature_type"] == "embedding":
        return 0
    if node["feature_type"] == "logit":
        return n_layers + 1
    return int(node["layer"]) + 1


def places(nodes: Sequence[Node], n_layers: int) -> list[tuple[float, int]]:
    """``(x, row)`` of each node, in the order of ``nodes``: nodes sharing a (row, position) cell spread over 0.8 of the
    column, the most influential in the middle; the logit nodes (all at the last position) along their row
    (:func:`logit_xs`)."""
    cells: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        if node["feature_type"] != "logit":
            cells[(row_of(node, n_layers), int(node["ctx_idx"]))].append(i)
    out: list[tuple[float, int]] = [(0.0, 0)] * len(nodes)
    for (row, pos), members in cells.items():
        members.sort(key=lambda i: (nodes[i].get("influence") is None, nodes[i].get("influence") or 0.0, i))
        order = sorted(range(len(members)), key=lambda k: abs(k - (len(members) - 1) / 2))  # centre outwards
        step = 0.8 / len(members)
        slots = [pos - 0.4 + step * (k + 0.5) for k in range(len(members))]
        for i, k in zip(members, order):
            out[i] = (slots[k], row)
    for i, x in logit_xs(nodes).items():
        out[i] = (x, n_layers + 1)
    return out


def logit_xs(nodes: Sequence[Node]) -> dict[int, float]:
    """The logit nodes' x, by their index in ``nodes``, most probable first: one column apart from the last position
    leftwards, or where they would not fit, spread evenly over the plot's width (ten logits over six positions:
    0.58 of a column apart, rather than ten markers in one column's 0.8)."""
    logits = sorted((i for i, n in enumerate(nodes) if n["feature_type"] == "logit"),
                    key=lambda i: (-float(nodes[i].get("token_prob") or 0.0), i))
    if not logits:
        return {}
    last = max(int(n["ctx_idx"]) for n in nodes)
    slot = (last + 0.8) / len(logits)  # [-0.4, last + 0.4] in equal slots (the x range is [-0.6, last + 0.6])
    if slot >= 1.0:  # few: one column apart, from the last position leftwards
        return {i: float(last - rank) for rank, i in enumerate(logits)}
    return {i: last + 0.4 - (rank + 0.5) * slot for rank, i in enumerate(logits)}


def logit_label(node: Node) -> str:
    """A logit node's token as its label (from circuit-tracer's clerp ``Output "TOKEN" (p=0.749)``), escaped."""
    clerp = str(node.get("clerp") or "")
    text = clerp[len('Output "'):clerp.rindex('" (p=')] if clerp.startswith('Output "') and '" (p=' in clerp else ""
    return token(visible(text), 12) if text else esc(node["node_id"])


def by_id(nodes: Sequence[Node], at: Sequence[tuple[float, int]]) -> dict[str, tuple[float, int]]:
    """Where each ``node_id`` is drawn, for the links. circuit-tracer's error ids ``0_{layer}_{pos}`` can equal a
    block-0 feature's ``{0}_{feature}_{pos}``; such an id means its first node (the feature: features come first)."""
    out: dict[str, tuple[float, int]] = {}
    for node, place in zip(nodes, at):
        out.setdefault(str(node["node_id"]), place)
    return out


def hover(node: Node, tokens: Sequence[str], extra: Mapping[str, Any] | None = None) -> str:
    """The node's hover text; ``extra``: the graph's ``metadata.feature_labels`` (top tokens, dashboards)."""
    pos = int(node["ctx_idx"])
    piece = token(visible(tokens[pos]), 24) if 0 <= pos < len(tokens) else "–"
    kind = KINDS.get(node["feature_type"], (node["feature_type"],))[0]
    lines = [f"{esc(node['node_id'])} · {esc(kind)}", f"position {pos}: {piece}"]
    if node["feature_type"] == "cross layer transcoder":
        lines.append(f"block {esc(node['layer'])} · feature {esc(node_feature(node))}")
    if node.get("clerp"):
        lines.append(esc(node["clerp"]))
    elif node["feature_type"] == "cross layer transcoder" and extra:
        tops = extra.get("top_tokens", {}).get(f"{node['layer']}_{node_feature(node)}")
        if tops:
            lines.append(f"top tokens (no label): {esc(tops)}")
    if node["feature_type"] == "cross layer transcoder" and extra and str(node["layer"]) in extra.get("dashboards", {}):
        lines.append("click: its panel in the features dashboard")
    if node.get("activation") is not None:
        lines.append(f"activation {node['activation']:.4f}")
    if node["feature_type"] == "logit":
        lines.append(f"probability {node.get('token_prob', 0.0):.4f}")
    if node.get("influence") is not None:
        lines.append(f"cumulative influence {node['influence']:.4f}")
    return "<br>".join(lines)


def dashboard_links(nodes: Sequence[Node], extra: Mapping[str, Any]) -> dict[str, str]:
    """``node_id`` -> the feature's panel in its block's dashboard page (``…/features.html#f-ID``)."""
    pages = extra.get("dashboards", {})
    return {str(n["node_id"]): f"{pages[str(n['layer'])]}#f-{node_feature(n)}" for n in nodes
            if n["feature_type"] == "cross layer transcoder" and str(n["layer"]) in pages}


def click_script(links: Mapping[str, str]) -> str:
    """Clicking a node with a link opens it in a new tab (nothing without links)."""
    if not links:
        return ""
    return (f"var LINKS={script_json(dict(links))};gd.on('plotly_click',function(e){{var p=e.points&&e.points[0];"
            "var u=p&&LINKS[p.customdata];if(u){window.open(u,'_blank');}});")


def node_feature(node: Node) -> str:
    """The feature index in its transcoder: ``node_id`` is ``{layer}_{feature}_{pos}``."""
    return str(node["node_id"]).split("_")[1]


def drawn_links(links: Sequence[Link], at: Mapping[str, tuple[float, int]]) -> list[Link]:
    """The links drawn: the ``MAX_LINKS`` strongest between drawn nodes, strongest first."""
    drawn = sorted((e for e in links if e["source"] in at and e["target"] in at), key=lambda e: -abs(e["weight"]))
    return drawn[:MAX_LINKS]


def link_traces(links: Sequence[Link], at: Mapping[str, tuple[float, int]]) -> list[go.Scatter]:
    """The strongest links as line traces: one per (sign, width bucket), segments separated by None."""
    drawn = drawn_links(links, at)
    top = max((abs(e["weight"]) for e in drawn), default=0.0) or 1.0
    groups: dict[tuple[bool, int], tuple[list[float | None], list[float | None]]] = {}
    for e in drawn:
        bucket = min(int(abs(e["weight"]) / top * len(WIDTHS)), len(WIDTHS) - 1)
        xs, ys = groups.setdefault((e["weight"] >= 0, bucket), ([], []))
        (x0, y0), (x1, y1) = at[e["source"]], at[e["target"]]
        xs.extend((x0, x1, None))
        ys.extend((y0, y1, None))
    traces = []
    for (raises, bucket), (xs, ys) in sorted(groups.items(), key=lambda kv: kv[0][1]):
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line={"width": WIDTHS[bucket], "color": RAISE if raises else LOWER},
                                 opacity=0.35 + 0.12 * bucket))
    return traces


def figure(graph: Mapping[str, Any], cap: Caption) -> Page:
    """The page for one graph JSON (``--json``'s dict) under ``cap`` (a :class:`anatomy_cli.output.plots.Caption`)."""
    tokens = [str(t) for t in graph["metadata"]["prompt_tokens"]]
    nodes: list[Node] = list(graph["nodes"])
    n_layers = max((int(n["layer"]) for n in nodes if n["feature_type"] == "logit"), default=1) - 1
    at = places(nodes, n_layers)
    extra = graph["metadata"].get("feature_labels") or {}
    fig = go.Figure(link_traces(graph["links"], by_id(nodes, at)))
    markers = link_markers(drawn_links(graph["links"], by_id(nodes, at)), by_id(nodes, at))  # --heads
    if markers is not None:
        fig.add_trace(markers)
    labelled = list(logit_xs(nodes))[:LABELLED]  # the most probable logits
    for kind, (name, symbol, colour) in KINDS.items():
        members = [i for i, n in enumerate(nodes) if n["feature_type"] == kind]
        if members:
            text = [logit_label(nodes[i]) if i in labelled else "" for i in members] if kind == "logit" else None
            fig.add_trace(go.Scatter(
                x=[at[i][0] for i in members], y=[at[i][1] for i in members],
                mode="markers+text" if text else "markers", text=text, textposition="top center",
                textfont={"size": 10, "color": "#444"}, cliponaxis=False,
                name=esc(name), marker={"symbol": symbol, "size": 11 if kind == "logit" else 9, "color": colour,
                                        "line": {"width": 0.5, "color": "#333"}},
                customdata=[nodes[i]["node_id"] for i in members],
                hovertext=[hover(nodes[i], tokens, extra) for i in members],
                hovertemplate="%{hovertext}<extra></extra>"))
    rows = ["embed", *(str(b) for b in range(n_layers)), "logits"]
    height = min(1400, max(420, 22 * len(rows) + 160))
    fig.update_layout(**layout(width=min(1350, max(600, 110 * len(tokens) + 220)), height=height))
    fig.update_layout(legend=LEGEND, margin={"t": 70})
    fig.update_xaxes(title_text="input token at each position", **ticks([token(visible(t), 14) for t in tokens]),
                     range=[-0.6, len(tokens) - 0.4], showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="block", **ticks(rows, 40), range=[-0.7, n_layers + 2.2], showgrid=True,
                     gridcolor="#eee", zeroline=False)
    page = caption_page(cap)
    page.add(plot(fig, div_id="circuit-graph", script=click_script(dashboard_links(nodes, extra))))
    n_links = len(graph["links"])
    shown = min(n_links, MAX_LINKS)
    shared = len(nodes) - len({str(n["node_id"]) for n in nodes})
    page.add(notes([f"{len(nodes)} nodes and {n_links} links after pruning"
                    + (f"; the {shown} strongest links drawn" if shown < n_links else ""),
                    *([f"{shared} node id(s) name two nodes each (circuit-tracer's error id 0_{{block}}_{{position}} "
                       "equals a block-0 feature's id): links are drawn to the feature"] if shared else []),
                    "the logit nodes (all at the last position) lie along their row, the most probable over the last "
                    f"token; the {LABELLED} most probable carry their token",
                    "line width: |weight| relative to the strongest link; blue raises its target, red lowers it",
                    "hover a node for its label, activation and cumulative influence (lower = more influential)",
                    *(["hover the middle of a link for its parts by first attention head crossed (--heads) and "
                       "its bypass (paths through no head)"] if markers is not None else [])]))
    if graph.get("qk"):
        page.add(qk_panel(graph, tokens, (RAISE, LOWER)))
    return page
