"""`circuit --heads N --plot FILE.html`: the attention parts of the graph page (anatomy_cli/output/html/circuit.py),
drawn from the graph JSON's ``links[].heads`` and ``qk`` (anatomy_cli/analyses/circuit_heads.py writes them).

Each drawn link gets an invisible marker at its midpoint whose hover lists the link's weight, its bypass (the paths
through no head), its largest head parts (``block L head H``) and the rest. Under the graph, a panel shows one
head's QK attribution: a selector over the ``qk`` entries, a note saying what a term is (:data:`QK_NOTE`) and a
bar per query × key term (blue raises the score, red lowers it), the largest at the top, with the score and the
rest (and how many terms it sums) in a line above.

Node ids and labels go into the page only through :func:`esc` / :func:`token` or as JSON that the script hands to
plotly already escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import TypedDict

import plotly.graph_objects as go

from anatomy_cli.output.html import esc
from anatomy_cli.output.html import token
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html.markup import Part
from anatomy_cli.output.html.markup import script_json
from anatomy_cli.text.display import visible

if TYPE_CHECKING:
    from anatomy_cli.output.html._circuit_json import Link
    from anatomy_cli.output.html._circuit_json import Node
    from anatomy_cli.output.html._circuit_json import QKEntry

QK_NOTE = ("Each bar is one term scale · q_i · k_j of the head's pre-softmax score: q_i is one contributor's part "
           "of the head's query at the query position, k_j one contributor's part of its key at the key position "
           "(a part: how much the query or key changes when that node is removed from the frozen replacement "
           "model). Contributors are the graph's source nodes (features, error nodes, tokens), bias (the query or "
           "key with every source removed) and other (the sources pruned from the graph). All query × key pairs "
           "sum to the score; the largest are drawn, the line above sums the rest.")


class QKBars(TypedDict):
    """One ``qk`` entry as the panel's script draws it."""

    labels: list[str]
    values: list[float]
    colours: list[str]
    hovers: list[str]
    line: str


SIDES = {"bias": "bias (every source removed)", "other": "other (sources pruned from the graph)"}


def number(value: float) -> str:
    """How the hovers and the panel write a weight, a part or a term."""
    return f"{value:.4g}"


def link_hover(link: Link) -> str:
    """A link's hover: source → target, its weight, the bypass, each head part written, the rest (escaped)."""
    heads = link["heads"]
    lines = [f"{esc(link['source'])} → {esc(link['target'])}", f"weight {number(link['weight'])}",
             f"bypass (no head) {number(heads['bypass'])}"]
    lines += [f"block {int(p['layer'])} head {int(p['head'])}: {number(p['weight'])}" for p in heads["parts"]]
    lines.append(f"other heads {number(heads['rest'])}")
    return "<br>".join(lines)


def link_markers(drawn: Sequence[Link], at: Mapping[str, tuple[float, int]]) -> go.Scatter | None:
    """An invisible marker at the midpoint of each drawn link that has ``heads``, hovering :func:`link_hover`
    (None where none has)."""
    split = [e for e in drawn if "heads" in e]
    if not split:
        return None
    mids = [((at[e["source"]][0] + at[e["target"]][0]) / 2, (at[e["source"]][1] + at[e["target"]][1]) / 2)
            for e in split]
    return go.Scatter(x=[x for x, _ in mids], y=[y for _, y in mids], mode="markers", showlegend=False,
                      name="link", marker={"size": 8, "color": "rgba(0,0,0,0)"},
                      customdata=[f"{e['source']}->{e['target']}" for e in split],
                      hovertext=[link_hover(e) for e in split], hovertemplate="%{hovertext}<extra></extra>")


def describe(node_id: str, nodes: Mapping[str, Node], tokens: Sequence[str]) -> str:
    """One contributor of a query or key, for a bar's hover: its id, position and token, label (escaped)."""
    if node_id in SIDES:
        return esc(SIDES[node_id])
    node = nodes.get(node_id)
    if node is None:
        return esc(node_id)
    pos = int(node["ctx_idx"])
    piece = token(visible(tokens[pos]), 16) if 0 <= pos < len(tokens) else "–"
    label = f" · {esc(node['clerp'])}" if node.get("clerp") else ""
    return f"{esc(node_id)} at {pos} {piece}{label}"


def qk_entry(entry: QKEntry, nodes: Mapping[str, Node], tokens: Sequence[str],
             colours: tuple[str, str]) -> QKBars:
    """One ``qk`` entry as the panel's script draws it: bar labels, values, colours (``colours``: raising,
    lowering), hovers (escaped) and the line above the bars."""
    terms = entry["terms"]
    shown = sum(float(t["value"]) for t in terms)
    cap = f"; the model caps it after this (softcap {entry['softcap']:g})" if entry.get("softcap") else ""
    of = f", {int(entry['n_terms']) - len(terms):,} terms" if "n_terms" in entry else ""
    return {
        "labels": [f"{esc(t['query'])} × {esc(t['key'])}" for t in terms],
        "values": [float(t["value"]) for t in terms],
        "colours": [colours[0] if float(t["value"]) >= 0 else colours[1] for t in terms],
        "hovers": [f"term {number(t['value'])}<br>query: {describe(t['query'], nodes, tokens)}"
                   f"<br>key: {describe(t['key'], nodes, tokens)}" for t in terms],
        # the line is set with textContent: plain text, not escaped
        "line": (f"score {number(entry['score'])} = the {len(terms)} terms drawn ({number(shown)}) + the rest "
                 f"({number(entry['rest'])}{of}){cap}")}


def qk_title(entry: QKEntry, tokens: Sequence[str]) -> str:
    """A ``qk`` entry in the selector (escaped)."""
    def at(pos: int) -> str:
        return f"{pos} {token(visible(tokens[pos]), 16)}" if 0 <= pos < len(tokens) else str(pos)

    return (f"block {int(entry['layer'])} head {int(entry['head'])}: query {at(int(entry['query_pos']))} → key "
            f"{at(int(entry['key_pos']))}, score {number(entry['score'])}")


def qk_panel(graph: Mapping[str, Any], tokens: Sequence[str], colours: tuple[str, str]) -> Part:
    """The QK panel: a selector over ``graph["qk"]`` and the picked entry's terms as bars (the first entry drawn
    first), coloured as the graph's links (``colours``: raising, lowering)."""
    nodes: dict[str, Node] = {}
    for n in graph["nodes"]:
        nodes.setdefault(str(n["node_id"]), n)
    entries = [qk_entry(e, nodes, tokens, colours) for e in graph["qk"]]
    n_bars = max((len(e["values"]) for e in entries), default=1)
    fig = go.Figure(go.Bar(x=[], y=[], orientation="h", hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(**layout(width=760, height=max(260, 22 * n_bars + 110)))
    fig.update_layout(margin={"l": 190, "t": 30})
    fig.update_xaxes(title_text="query × key term of the pre-softmax score", zeroline=True, zerolinecolor="#888")
    fig.update_yaxes(autorange="reversed", showgrid=False)
    options = "".join(f'<option value="{i}">{qk_title(e, tokens)}</option>' for i, e in enumerate(graph["qk"]))
    head = ('<h2>QK attribution of the strongest heads</h2><div class="controls"><label>head '
            f'<select id="circuit-qk-pick">{options}</select></label></div>'
            f'<p class="note" id="circuit-qk-note">{esc(QK_NOTE)}</p><div class="readout" id="circuit-qk-line"></div>')
    prepare = f"var Q={script_json(entries)};" + _PREPARE
    return Part(head + plot(fig, div_id="circuit-qk", prepare=prepare, script=_SCRIPT).html)


# Draw entry i of Q into the figure F (before its first draw) or into the drawn div gd (on a change). The labels and
# hovers are escaped already; the line goes in with textContent.
_PREPARE = """
var S = document.getElementById('circuit-qk-pick'), LINE = document.getElementById('circuit-qk-line');
function bars(i) {
  var e = Q[i], ys = e.values.map(function (_, k) { return k; });
  return [{x: e.values, y: ys, hovertext: e.hovers, marker: {color: e.colours}}, {tickvals: ys, ticktext: e.labels}];
}
var B = bars(0);
Object.assign(F.data[0], B[0]);
F.layout.yaxis.tickmode = 'array'; F.layout.yaxis.tickvals = B[1].tickvals; F.layout.yaxis.ticktext = B[1].ticktext;
LINE.textContent = Q[0].line;
"""
_SCRIPT = """
S.addEventListener('change', function () {
  var B = bars(+S.value);
  Plotly.update(gd, {x: [B[0].x], y: [B[0].y], hovertext: [B[0].hovertext], 'marker.color': [B[0].marker.color]},
                {'yaxis.tickvals': B[1].tickvals, 'yaxis.ticktext': B[1].ticktext})
    .then(function () { LINE.textContent = Q[+S.value].line; });
});
"""
