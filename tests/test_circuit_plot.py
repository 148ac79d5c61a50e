"""``circuit --plot FILE.html``: the graph page, drawn from a graph JSON that circuit-tracer 0.5.0 itself wrote
(tests/data/circuit/ct-smollm2-random.json: ``create_graph_files`` on SmolLM2 with seeded random transcoders, made by
tests/reference/circuit_tracer_ref.py; weights rounded to 6 digits), with a script put into a token and a label.

Checked against the JSON, not against the page's own code: every node is one marker at row (embed | block + 1 | logits)
and its position's column; every link is one segment; the strongest link is the widest line; hovering a feature shows
its id, label (as text) and activation; in the browser the page loads with no console error, no request and no dialog.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from anatomy_cli.output.html import circuit
from anatomy_cli.output.plots import Caption

DATA = Path(__file__).parent / "data" / "circuit" / "ct-smollm2-random.json"
EVIL = "<script>alert(1)</script>"
LABEL = 'capital <img src=x onerror="alert(2)"> & city'


@pytest.fixture(scope="module")
def graph() -> dict:
    g = copy.deepcopy(json.loads(DATA.read_text()))
    g["metadata"]["prompt_tokens"][3] = f" {EVIL}"
    feature = next(n for n in g["nodes"] if n["feature_type"] == "cross layer transcoder")
    feature["clerp"] = LABEL
    return g


def test_nodes_sit_in_their_row_and_column(graph):
    nodes = graph["nodes"]
    n_layers = max(int(n["layer"]) for n in nodes if n["feature_type"] == "logit") - 1
    assert n_layers == 30  # SmolLM2's 30 blocks; logits on layer "31" in circuit-tracer's JSON
    at = circuit.places(nodes, n_layers)
    assert len(at) == len(nodes)
    for n, (x, row) in zip(nodes, at):
        want = 0 if n["layer"] == "E" else int(n["layer"]) + (0 if n["feature_type"] == "logit" else 1)
        assert row == want, n["node_id"]
        if n["feature_type"] != "logit":
            assert abs(x - n["ctx_idx"]) < 0.4, n["node_id"]  # inside its position's column
    assert len(set(at)) == len(at)  # no two nodes on the same spot
    # the logit nodes (all at the last position) spread over the row, most probable rightmost, a slot apart
    logits = sorted((n for n in nodes if n["feature_type"] == "logit"), key=lambda n: -n["token_prob"])
    xs = [at[nodes.index(n)][0] for n in logits]
    last = len(graph["metadata"]["prompt_tokens"]) - 1
    assert len(logits) == 10 and xs == sorted(xs, reverse=True)
    assert -0.4 <= xs[-1] and xs[0] <= last + 0.4
    gaps = [a - b for a, b in zip(xs, xs[1:])]
    assert min(gaps) == pytest.approx(max(gaps)) and min(gaps) == pytest.approx((last + 0.8) / 10)
    # circuit-tracer's own ids collide (error 0_{layer}_{pos} = block-0 feature 0_{feature}_{pos}): this file has one
    ids = [n["node_id"] for n in nodes]
    twice = {i for i in ids if ids.count(i) > 1}
    assert {n["feature_type"] for n in nodes if n["node_id"] in twice} == {"cross layer transcoder",
                                                                           "mlp reconstruction error"}


def test_every_link_is_one_segment_and_the_strongest_is_widest(graph):
    nodes = graph["nodes"]
    at = circuit.by_id(nodes, circuit.places(nodes, 30))
    traces = circuit.link_traces(graph["links"], at)
    segments = sum(sum(1 for x in t.x if x is None) for t in traces)
    assert len(graph["links"]) > circuit.MAX_LINKS == segments  # the cap, at the strongest links
    ranked = sorted(graph["links"], key=lambda e: -abs(e["weight"]))
    strongest, weakest = ranked[0], ranked[circuit.MAX_LINKS - 1]

    def width_of(link):
        (x0, y0), (x1, y1) = at[link["source"]], at[link["target"]]
        for t in traces:
            pts = list(zip(t.x, t.y))
            for i in range(0, len(pts), 3):
                if pts[i] == (x0, y0) and pts[i + 1] == (x1, y1):
                    return t.line.width, t.line.color
        raise AssertionError(link)

    width, colour = width_of(strongest)
    assert width == max(circuit.WIDTHS)
    assert colour == (circuit.RAISE if strongest["weight"] >= 0 else circuit.LOWER)
    assert width_of(weakest)[0] == min(circuit.WIDTHS)
    with pytest.raises(AssertionError):
        width_of(ranked[circuit.MAX_LINKS])  # the first one past the cap is not drawn


def test_page_escapes_tokens_and_labels(graph, tmp_path):
    page = circuit.figure(graph, Caption("circuit", "SmolLM2-135M-Instruct", f"The capital {EVIL} France is"))
    html = page.render()
    assert EVIL not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html or "\\u003cscript\\u003e" in html


# ---- in the browser (Debian's chromium through playwright; skipped where either is missing) ----

from test_html_browser import Opened  # noqa: E402


def test_graph_page_in_the_browser(browser, graph, tmp_path):
    path = tmp_path / "graph.html"
    circuit.figure(graph, Caption("circuit", "SmolLM2-135M-Instruct", f"The capital {EVIL} France is")).write(path)
    opened = Opened(browser, path)
    try:
        opened.clean()
        assert f"The capital {EVIL} France is" in opened.page.inner_text("body")  # the prompt shown as text
        data = opened.page.evaluate(
            "document.getElementById('circuit-graph').data.map(t => ({mode: t.mode, n: (t.x || []).length, "
            "ids: t.customdata || null, width: t.line ? t.line.width : null}))")
        markers = [t for t in data if t["mode"].startswith("markers")]
        assert sorted(i for t in markers for i in t["ids"]) == sorted(n["node_id"] for n in graph["nodes"])
        feature = next(n for n in graph["nodes"] if n.get("clerp") == LABEL)
        x, y = circuit.places(graph["nodes"], 30)[graph["nodes"].index(feature)]
        opened.hover_cell("circuit-graph", x, y)
        lines = opened.hover_lines()
        text = " | ".join(lines)
        assert feature["node_id"] in lines[0] and "transcoder feature" in lines[0]
        assert LABEL in text  # the label shown as text, not markup
        assert f"activation {feature['activation']:.4f}" in text
        assert f"position {feature['ctx_idx']}:" in text
        boxes = opened.page.evaluate(
            "['.legend', '.xtitle', '.cartesianlayer .xaxislayer-above'].map(s => { const r = "
            "document.querySelector('#circuit-graph ' + s).getBoundingClientRect(); "
            "return [r.left, r.top, r.right, r.bottom]; })")
        legend, title, ticks = boxes
        for other in (title, ticks):  # the legend clear of the x-axis title and tick labels (it sits above)
            assert legend[3] <= other[1] or other[3] <= legend[1] or legend[2] <= other[0] or other[2] <= legend[0]
        assert legend[3] <= ticks[1]
        logits_apart(opened, graph)
        opened.clean()
        opened.screenshot_is_not_blank(tmp_path / "graph.png")
    finally:
        opened.page.close()


def logits_apart(opened, graph) -> None:
    """In the page: the logit markers' drawn centres at least a marker apart (not one clump over the last token),
    the most probable rightmost, the LABELLED most probable labelled with their tokens as text, the rest not."""
    drawn = opened.page.evaluate(
        """() => { const gd = document.getElementById('circuit-graph'), r = gd.getBoundingClientRect();
            const i = gd.data.findIndex(t => t.name === 'logit');
            const pts = [...gd.querySelectorAll('.scatterlayer .trace')[i].querySelectorAll('.point')];
            const txt = [...gd.querySelectorAll('.scatterlayer .trace')[i].querySelectorAll('.textpoint text')];
            return {size: gd._fullData[i].marker.size, ids: gd.data[i].customdata,
                    centres: pts.map(p => { const b = p.getBoundingClientRect();
                                            return [b.left + b.width / 2, b.top + b.height / 2]; }),
                    labels: txt.map(t => t.textContent).filter(t => t)}; }""")
    by_id = {n["node_id"]: n for n in graph["nodes"]}
    probs = [by_id[i]["token_prob"] for i in drawn["ids"]]
    centres = drawn["centres"]
    assert len(centres) == len(probs) == 10
    assert len({round(y) for _, y in centres}) == 1  # one row
    apart = min(abs(a[0] - b[0]) for k, a in enumerate(centres) for b in centres[k + 1:])
    assert apart >= 2 * drawn["size"], (apart, drawn["size"])
    order = sorted(range(10), key=lambda k: -probs[k])
    assert [centres[k][0] for k in order] == sorted((c[0] for c in centres), reverse=True)
    tokens = [by_id[drawn["ids"][k]]["clerp"].split('"')[1].replace(" ", "·") for k in order]
    assert sorted(drawn["labels"]) == sorted(t[:11] + "…" if len(t) > 12 else t for t in tokens[:circuit.LABELLED])


def test_cli_plot_writes_the_page_of_its_json(tiny_model_dir, tiny_lm, tmp_path):
    """``anatomy circuit --plot graph.html`` on a tiny Llama: the page draws exactly the nodes of ``--json``;
    a non-HTML ``--plot`` is refused before anything opens."""
    from test_circuit import invoke
    from test_circuit import random_transcoders
    from test_circuit import write_transcoder_set

    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    page, js = tmp_path / "graph.html", tmp_path / "graph.json"
    args = ["circuit", f"The capital {EVIL} France is", "--model", str(tiny_model_dir("llama")), "--device", "cpu",
            "--transcoders", str(tdir), "--bos", "--max-feature-nodes", "20", "--batch-size", "8"]
    result = invoke(*args, "--json", str(js), "--plot", str(page))
    assert result.exit_code == 0, result.stderr
    graph = json.loads(js.read_text())
    html = page.read_text()
    assert EVIL not in html
    for node in graph["nodes"]:
        assert json.dumps(node["node_id"]) in html
    assert "circuit-qk" not in html and "--heads" not in html  # no QK panel, no link hover note without --heads
    refused = invoke(*args, "--plot", str(tmp_path / "graph.png"))
    assert refused.exit_code == 2 and "give a .html file" in refused.stderr


def test_heads_page_in_the_browser(browser, tiny_model_dir, tiny_lm, tmp_path):
    """``circuit --heads 2 --plot``, one run on a tiny Llama: in the browser, each link has an invisible marker at
    its drawn midpoint (between its two nodes' markers as the page places them) whose hover gives the JSON's weight,
    bypass, head parts and rest; the QK panel's bars are the JSON's ``qk`` terms, for the first entry and, once
    picked in the selector, the second; no console error, request or dialog."""
    from test_circuit import invoke
    from test_circuit import random_transcoders
    from test_circuit import write_transcoder_set

    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    page, js = tmp_path / "graph.html", tmp_path / "graph.json"
    result = invoke("circuit", f"The capital {EVIL} France is", "--model", str(tiny_model_dir("llama")), "--device",
                    "cpu", "--transcoders", str(tdir), "--bos", "--max-feature-nodes", "20", "--batch-size", "8",
                    "--heads", "2", "--json", str(js), "--plot", str(page))
    assert result.exit_code == 0, result.stderr
    assert EVIL not in page.read_text()
    from anatomy_cli.output.html import esc
    from anatomy_cli.output.html._circuit_heads import QK_NOTE

    assert f'id="circuit-qk-note">{esc(QK_NOTE)}</p>' in page.read_text()  # what a term is, in the QK panel
    graph = json.loads(js.read_text())
    assert len(graph["qk"]) == 2 and all("heads" in link for link in graph["links"])
    opened = Opened(browser, page, viewport=(1500, 1000))  # the whole graph in view: it is up to 1350 px wide
    try:
        opened.clean()
        drawn = opened.page.evaluate(
            "document.getElementById('circuit-graph').data.map(t => ({name: t.name || null, x: t.x, y: t.y, "
            "ids: t.customdata || null}))")
        nodes_at = {i: (x, y) for t in drawn if t["name"] not in (None, "link")
                    for i, x, y in zip(t["ids"], t["x"], t["y"])}
        links = next(t for t in drawn if t["name"] == "link")
        by_pair = {f"{e['source']}->{e['target']}": e for e in graph["links"]}
        assert sorted(links["ids"]) == sorted(by_pair)  # every link (fewer than MAX_LINKS) has its marker
        for pair, x, y in zip(links["ids"], links["x"], links["y"]):
            (x0, y0), (x1, y1) = nodes_at[by_pair[pair]["source"]], nodes_at[by_pair[pair]["target"]]
            assert (x, y) == pytest.approx(((x0 + x1) / 2, (y0 + y1) / 2))
        # hover the strongest link whose midpoint has no other marker within 12 px
        px = opened.page.evaluate(  # each marker trace's points in pixels, by trace name
            "(() => { const gd = document.getElementById('circuit-graph'), L = gd._fullLayout; return "
            "Object.fromEntries(gd.data.filter(t => t.name).map(t => "
            "[t.name, t.x.map((x, i) => [L.xaxis.d2p(x), L.yaxis.d2p(t.y[i])])])); })()")
        every = [p for points in px.values() for p in points]
        lone = [k for k, (a, b) in enumerate(px["link"])
                if sum(1 for c, d in every if (a - c) ** 2 + (b - d) ** 2 < 144) == 1]
        k = max(lone, key=lambda k: abs(by_pair[links["ids"][k]]["weight"]))
        link = by_pair[links["ids"][k]]
        opened.hover_cell("circuit-graph", links["x"][k], links["y"][k])
        lines = opened.hover_lines()
        assert lines[0] == f"{link['source']} → {link['target']}"
        shown = dict(line.rsplit(" ", 1) if ":" not in line else line.split(": ") for line in lines[1:])
        heads = link["heads"]
        want = {"weight": link["weight"], "bypass (no head)": heads["bypass"], "other heads": heads["rest"],
                **{f"block {p['layer']} head {p['head']}": p["weight"] for p in heads["parts"]}}
        assert set(shown) == set(want)
        for name, value in want.items():
            assert float(shown[name]) == pytest.approx(value, rel=1e-3, abs=1e-9), name
        for i, entry in enumerate(graph["qk"]):  # the QK panel: first entry drawn, the second once picked
            if i:
                opened.page.select_option("#circuit-qk-pick", str(i))
                opened.page.wait_for_function(f"document.getElementById('circuit-qk').data[0].x[0] === "
                                              f"{json.dumps(entry['terms'][0]['value'])}")
            bars = opened.page.evaluate("(() => { const gd = document.getElementById('circuit-qk'); return "
                                        "{x: gd.data[0].x, y: gd.data[0].y, labels: gd._fullLayout.yaxis.ticktext, "
                                        "line: document.getElementById('circuit-qk-line').textContent}; })()")
            assert bars["x"] == [t["value"] for t in entry["terms"]]
            assert bars["labels"] == [f"{t['query']} × {t['key']}" for t in entry["terms"]]
            assert bars["y"] == list(range(len(entry["terms"])))
            score = float(bars["line"].split(" = ")[0].removeprefix("score "))
            assert score == pytest.approx(entry["score"], rel=1e-3, abs=1e-9)
            option = opened.page.evaluate(f"document.querySelectorAll('#circuit-qk-pick option')[{i}].textContent")
            assert option.startswith(f"block {entry['layer']} head {entry['head']}: query {entry['query_pos']} ")
        opened.clean()
        opened.screenshot_is_not_blank(tmp_path / "heads.png")
    finally:
        opened.page.close()
