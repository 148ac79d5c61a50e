"""`features --plot FILE.html`: the dashboard page, opened in Debian's chromium (playwright), compared with the
command's own JSON of the same run: every feature listed, the search, the sort orders, each panel's shaded tokens
and their activations, the histogram, the logit effects, the co-firing links; a token holding ``<script>`` stays
text. Skipped, saying why, where no chromium or playwright is installed (as tests/test_html_browser.py)."""

from __future__ import annotations

import copy
import json

import pytest
from test_features import TEXT
from test_features import invoke
from test_features import write_sae
from test_html_browser import Opened

EVIL = "<script>alert(1)</script>"


def vis(t: str) -> str:
    return t.replace("\n", "\u21b5").replace("\t", "\u2192")


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("featplot")
    sae = write_sae(root / "sae")
    corpus = root / "corpus.txt"
    corpus.write_text(f"A page said {EVIL} and </div> then. " + TEXT)
    page = root / "features.html"
    result = invoke("features", sae, "--corpus", corpus, "--model", tiny_model_dir("gpt2"), "--device", "cpu",
                    "--ctx", 16, "--top-k", 3, "--window", 2, "--quantiles", 3, "--quantile-size", 2,
                    "--cooccur", 3, "--logit-top", 4, "--format", "json", "--plot", page)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), page, root


def order(opened) -> list[int]:
    return opened.page.evaluate("[...document.querySelectorAll('#fx-list tbody tr')].map(r => +r.dataset.feature)")


def panel_contexts(opened, box: str) -> list[list[tuple[str, float]]]:
    return opened.page.evaluate(
        f"[...document.querySelectorAll('#{box} .ctx')].map(c => [...c.querySelectorAll('span.tok')]"
        ".map(s => [s.textContent, parseFloat(s.dataset.act)]))")


def test_the_list_sorts_and_searches_as_the_json_says(browser, made):
    data, page, _ = made
    opened = Opened(browser, page)
    rows = data["features"]
    by_frequency = [r["feature"] for r in sorted(rows, key=lambda r: (-r["frequency"], r["feature"]))]
    assert order(opened) == by_frequency  # the default sort, every feature listed
    assert sorted(order(opened)) == list(range(24))
    opened.page.select_option("#fx-sort", "max_activation")
    assert order(opened) == [r["feature"] for r in sorted(rows, key=lambda r: (-r["max_activation"], r["feature"]))]
    opened.page.select_option("#fx-sort", "feature")
    assert order(opened) == list(range(24))
    status = opened.page.evaluate("[...document.querySelectorAll('#fx-list tbody tr')].map(r => r.cells[4].textContent)")
    assert status[0] == "dead" and status[1] == "always-on"  # the test SAE's features 0 and 1
    opened.page.fill("#fx-search", "7")
    assert order(opened) == [7]
    word = next(r["token"] for r in data["logit_effects"] if r["feature"] == 5 and r["side"] == "top").strip().lower()
    opened.page.fill("#fx-search", word)
    expected = [r["feature"] for r in rows if any(
        word in e["token"].lower() for e in data["logit_effects"] if e["feature"] == r["feature"]) or any(
        word in "".join(c["tokens"]).lower() for c in data["contexts"] if c["feature"] == r["feature"])]
    assert 5 in order(opened) and order(opened) == expected
    opened.clean()


def test_each_panel_shows_the_json_s_contexts_histogram_and_effects(browser, made):
    data, page, _ = made
    opened = Opened(browser, page)
    for f in (1, 2, 3, 0):
        opened.page.evaluate(f"location.hash = 'f-{f}'")
        opened.page.wait_for_function(f"document.querySelector('#fx-panel h2').textContent.startsWith('feature {f} ')")
        for kind, box in (("top", "fx-top"), ("quantile", "fx-quantile")):
            want = [[(vis(t), float(f"{a:.3g}")) for t, a in zip(c["tokens"], c["activations"])]  # 3 digits
                    for c in data["contexts"] if c["feature"] == f and c["kind"] == kind]
            assert [[tuple(x) for x in ctx] for ctx in panel_contexts(opened, box)] == want
        row = data["features"][f]
        never = opened.page.evaluate("(document.getElementById('fx-never') || {}).textContent || null")
        if sum(row["histogram"]) == 0:  # dead (feature 0): a line saying so, no empty plot (a new user's trial)
            assert opened.page.evaluate("document.getElementById('fx-hist')") is None
            assert never == f"never fired on {data['tokens']:,} tokens" and data["tokens"] > 0
        else:
            bars = opened.page.evaluate("document.getElementById('fx-hist').data[0].y")
            assert sum(bars) == row["fires"] and sorted(b for b in bars if b) == sorted(
                h for h in row["histogram"] if h)
            assert never is None
        shown = opened.page.evaluate("[...document.querySelectorAll('#fx-panel table[data-side=top] tr')]"
                                     ".map(r => [r.cells[0].textContent, +r.cells[1].textContent])")
        want_fx = [(vis(e["token"]), round(e["effect"], 4)) for e in data["logit_effects"]
                   if e["feature"] == f and e["side"] == "top"]
        assert [t for t, _ in shown] == [t for t, _ in want_fx]
        assert [e for _, e in shown] == pytest.approx([e for _, e in want_fx], abs=1e-4)
    assert any(panel_contexts(opened, "fx-top")) is False  # feature 0 is dead: no contexts
    opened.page.evaluate("location.hash = 'f-2'")
    first = data["features"][2]["cooccurring"][0]["feature"]
    opened.page.click("#fx-panel a")
    opened.page.wait_for_function(f"document.querySelector('#fx-panel h2').textContent.startsWith('feature {first} ')")
    opened.clean()


def test_the_packed_page_data_unpacks_to_the_record_s_contexts(made):
    """page_data stores each shown corpus token once (by window and position) and a context as a slice of its
    window: unpacked as the page's script does, every context's tokens equal the JSON's and its activations equal
    them to 3 significant digits; the windows hold no more tokens than the corpus has."""
    from anatomy_cli.output.html import features

    data, _, _ = made
    packed = features.page_data(data)
    assert sum(len(w) for w in packed["windows"]) <= data["tokens"] < sum(len(c["tokens"]) for c in data["contexts"])
    for c, row in zip(data["contexts"], packed["contexts"], strict=True):
        window, start, acts = packed["windows"][row[8]], row[9], row[10]
        assert [packed["pieces"][i] for i in window[start:start + len(acts)]] == c["tokens"]
        assert acts == [float(f"{a:.3g}") for a in c["activations"]]
        assert (row[0], row[6], row[7]) == (c["feature"], float(f"{c['activation']:.4g}"), c["at"])


def test_a_token_holding_script_stays_text(browser, made):
    from anatomy_cli.output.html import features
    from anatomy_cli.output.plots import Caption

    data, _, root = made
    assert any(EVIL[:2] in "".join(c["tokens"]) for c in data["contexts"])  # the corpus' own markup reached the page
    data = copy.deepcopy(data)
    ctx = next(c for c in data["contexts"] if c["feature"] == 1 and c["kind"] == "top")
    spot = (ctx["window"], ctx["position"] - ctx["at"])  # that corpus token, in every context showing it
    for c in data["contexts"]:
        if c["window"] == spot[0] and 0 <= spot[1] - (c["position"] - c["at"]) < len(c["tokens"]):
            c["tokens"][spot[1] - (c["position"] - c["at"])] = EVIL
    page = root / "evil.html"
    features.figure(data, Caption("features", "tiny</title><script>alert(2)</script>")).write(page)
    assert EVIL not in page.read_text()
    opened = Opened(browser, page)
    opened.page.evaluate("location.hash = 'f-1'")
    opened.page.wait_for_function("document.querySelector('#fx-panel h2').textContent.startsWith('feature 1 ')")
    assert panel_contexts(opened, "fx-top")[0][0] == [EVIL, float(f"{ctx['activations'][0]:.3g}")]
    assert opened.page.evaluate("document.querySelectorAll('body script').length") == 1  # the page's own only
    opened.clean()  # no dialog opened


@pytest.mark.parametrize("args, match", [
    (("features", "{sae}", "--corpus", "{corpus}", "--plot", "f.png"),
     "error: --plot 'f.png': features draws an interactive page: give a .html file (not '.png')"),
    (("features", "{sae}", "--corpus", "{corpus}", "--plot", "f"), "features draws an interactive page: give a .html "
     "file (no suffix)"),
    (("features", "{sae}", "--corpus", "{corpus}", "--plot", "f.html", "--estimate"),
     "--estimate runs no pass: it draws no --plot"),
    (("circuit", "hi", "--transcoders", "{sae}", "--plot", "g.svg"),  # the same check, shared
     "error: --plot 'g.svg': circuit draws an interactive page: give a .html file (not '.svg')")])
def test_plot_takes_a_page_of_a_pass(made, args, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, _, root = made
    result = invoke(*(a.format(sae=root / "sae", corpus=root / "corpus.txt") for a in args), "--model", "gpt2")
    assert result.exit_code == 2 and match in result.output
    assert not list(tmp_path.iterdir())


def test_a_panel_s_anchor_is_the_link_circuit_writes(browser, made):
    """circuit --plot links a feature node to ``features.html#f-ID`` (models/feature_labels.py ``link``): opened
    at that address, the page shows that feature's panel, whose heading carries the id ``f-ID``."""
    from anatomy_cli.models.feature_labels import FeatureLabels

    _, page, _ = made
    link = FeatureLabels(dashboard=page.resolve().as_uri()).link(5)
    opened = Opened(browser, page)
    opened.page.goto(link)
    opened.page.wait_for_function("document.querySelector('#fx-panel h2').textContent.startsWith('feature 5 ')")
    assert opened.page.evaluate("document.getElementById('f-5').textContent").startswith("feature 5 ")
    opened.clean()


def features_args(sae, corpus, model, feats):
    return ("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16, "--shard-windows",
            3, "--top-k", 8, "--quantiles", 4, "--quantile-size", 2, "--out", feats, "--delphi", feats / "latents",
            "--format", "json")


@pytest.fixture(scope="module")
def explained(tmp_path_factory, tiny_model_dir):
    """``(features JSON, FEATURES_DIR, explain's JSON, the page features --plot wrote)``: a features run with
    ``--out DIR --delphi DIR/latents --plot DIR/features.html``, then ``explain DIR`` (the stand-in chat model of
    tests/test_explain.py), which writes the page again with its explanations."""
    from test_explain import chat_model
    from test_explain import stand_in

    root = tmp_path_factory.mktemp("featexplain")
    sae = write_sae(root / "sae")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT * 2)
    feats = root / "feats"
    feats.mkdir()
    result = invoke(*features_args(sae, corpus, tiny_model_dir("gpt2"), feats), "--plot", feats / "features.html")
    assert result.exit_code == 0, result.output
    before = (feats / "features.html").read_text()
    chat = chat_model(root, tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        stand_in(mp)
        ran = invoke("explain", feats, "--explainer", chat, "--device", "cpu", "--max-features", 6, "-f", "json")
    assert ran.exit_code == 0, ran.output
    assert "features.html" in ran.stderr  # the page written again, named
    return json.loads(result.stdout), feats, json.loads(ran.stdout), before


def _score(x) -> str:
    return "\u2013" if x is None else f"{x:.2f}"


def test_explain_shows_its_explanations_and_scores_on_the_dashboard(browser, explained):
    data, feats, _, _ = explained
    export = json.loads((feats / "explanations.json").read_text())
    by_id = {int(r["index"]): r for r in export}
    assert len(by_id) >= 4 and any(r["scores"]["detection"] for r in export)
    opened = Opened(browser, feats / "features.html")
    rows = data["features"]
    assert order(opened) == [r["feature"] for r in sorted(rows, key=lambda r: (-r["frequency"], r["feature"]))]
    cells = opened.page.evaluate("Object.fromEntries([...document.querySelectorAll('#fx-list tbody tr')]"
                                 ".map(r => [r.dataset.feature, [...r.cells].map(c => c.textContent)]))")
    for r in rows:
        got = cells[str(r["feature"])]
        rec = by_id.get(r["feature"])
        assert len(got) == 9 and got[7] == (rec["description"] if rec else "")
        assert got[5:7] == ([_score((rec["scores"][k] or {}).get("balanced_accuracy")) for k in ("detection", "fuzz")]
                            if rec else ["\u2013", "\u2013"])
    for f, rec in by_id.items():
        opened.page.evaluate(f"location.hash = 'f-{f}'")
        opened.page.wait_for_function(f"document.querySelector('#fx-panel h2').textContent.startsWith('feature {f} ')")
        assert opened.page.evaluate("document.querySelector('#fx-explanation .explanation').textContent") == \
            rec["description"]
        table = opened.page.evaluate("[...document.querySelectorAll('#fx-scores tr[data-scores]')]"
                                     ".map(r => [...r.cells].map(c => c.textContent))")
        control = rec["control"]
        assert table[0] == ["its explanation"] + [_score((rec["scores"][k] or {}).get(m)) for k in ("detection", "fuzz")
                                                  for m in ("balanced_accuracy", "f1")]
        assert table[1] == [f"control (#{control['explanation_of']}'s explanation)"] + [
            _score((control[k] or {}).get(m)) for k in ("detection", "fuzz") for m in ("balanced_accuracy", "f1")]
        want = [[(vis(t), float(f"{a:.3g}")) for t, a in zip(c["tokens"], c["activations"])]
                for c in data["contexts"] if c["feature"] == f and c["kind"] == "top"]
        assert [[tuple(x) for x in ctx] for ctx in panel_contexts(opened, "fx-top")] == want  # the run's own
    opened.page.evaluate("location.hash = 'f-0'")  # dead: no explanation, no panel box
    opened.page.wait_for_function("document.querySelector('#fx-panel h2').textContent.startsWith('feature 0 ')")
    assert opened.page.evaluate("document.getElementById('fx-explanation')") is None
    for key, kind in (("detection_balanced_accuracy", "detection"), ("fuzz_balanced_accuracy", "fuzz")):
        opened.page.select_option("#fx-sort", key)

        def value(r, kind=kind):
            got = (by_id[r["feature"]]["scores"][kind] or {}).get("balanced_accuracy") if r["feature"] in by_id \
                else None
            return float("-inf") if got is None else got

        assert order(opened) == [r["feature"] for r in sorted(rows, key=lambda r: (-value(r), r["feature"]))]
    word = export[0]["description"].lower()
    opened.page.fill("#fx-search", word)
    assert int(export[0]["index"]) in order(opened)
    assert set(order(opened)) == {r["feature"] for r in rows if word in (by_id[r["feature"]]["description"].lower()
                                                                         if r["feature"] in by_id else "")
                                  or any(word in e["token"].lower() for e in data["logit_effects"]
                                         if e["feature"] == r["feature"])
                                  or any(word in "".join(c["tokens"]).lower() for c in data["contexts"]
                                         if c["feature"] == r["feature"])}
    opened.clean()


@pytest.mark.parametrize("width", [1400, 1280])
def test_opened_at_a_panel_the_title_stays_in_view_and_nothing_is_cut(browser, explained, width):
    """Issue 60 follow-up: opened at ``#f-ID`` the page keeps its title in view (the browser scrolled the heading to
    the window's top), the page is no wider than the window (the histogram took 640 px beside a wide list), and the
    histogram's last bin label (computed here from the JSON's edges) lies inside the plot."""
    data, feats, _, _ = explained
    edges = data["histogram_edges"]
    row = max(data["features"], key=lambda r: (sum(1 for n in r["histogram"] if n), -r["feature"]))
    hi = max(j for j, n in enumerate(row["histogram"]) if n)
    # the documented bins (docs/commands/features.md): bin j >= 1 is [2^((j-41)/2), 2^((j-40)/2)), the last to infinity
    assert edges[hi] == 2 ** ((hi - 41) / 2) and len(edges) == len(row["histogram"]) + 1
    upper = "\u221e" if hi == len(row["histogram"]) - 1 else format(2 ** ((hi - 40) / 2), "#.3g")  # toPrecision(3)
    last = f"[{2 ** ((hi - 41) / 2):#.3g}, {upper})"
    opened = Opened(browser, feats / "features.html", viewport=(width, 900))
    opened.page.goto("about:blank")  # then a fresh load at the address (not a jump within the page)
    opened.page.goto((feats / "features.html").resolve().as_uri() + f"#f-{row['feature']}")
    opened.page.wait_for_function(f"document.querySelector('#fx-panel h2').id === 'f-{row['feature']}' && "
                                  "document.getElementById('fx-hist')._fullLayout && document.readyState === 'complete'")
    opened.page.wait_for_timeout(100)  # the browser's own scroll to the anchor comes after the load
    got = opened.page.evaluate("""() => { const svg = document.querySelector('#fx-hist .main-svg').getBoundingClientRect(),
        ticks = [...document.querySelectorAll('#fx-hist .xtick text')], t = ticks[ticks.length - 1].getBoundingClientRect();
        return {y: window.scrollY, title: document.querySelector('h1').getBoundingClientRect().top,
                page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
                label: ticks[ticks.length - 1].textContent, right: t.right, bottom: t.bottom, left: t.left,
                svgRight: svg.right, svgBottom: svg.bottom, svgLeft: svg.left}; }""")
    assert got["y"] == 0 and got["title"] >= 0
    assert got["page"] <= got["window"] <= width  # no horizontal scroll bar
    assert got["label"] == last
    assert got["svgLeft"] <= got["left"] and got["right"] <= got["svgRight"] and got["bottom"] <= got["svgBottom"]
    opened.clean()


def test_without_explanations_the_page_is_the_features_page(browser, explained, tmp_path, tiny_model_dir):
    """The page features --plot wrote has no explanation column, sort or panel; the tables read back from
    FEATURES_DIR give the page the run's own data; explain --out elsewhere leaves FEATURES_DIR's page alone and
    --plot FILE.html writes the dashboard there."""
    from test_explain import chat_model
    from test_explain import stand_in

    from anatomy_cli.output.html import features
    from anatomy_cli.tasks._features_files import read_record

    data, feats, _, before = explained
    assert features.page_data(read_record(feats)) == features.page_data(data)
    page = tmp_path / "before.html"
    page.write_text(before)
    opened = Opened(browser, page)
    assert opened.page.evaluate("[...document.querySelectorAll('#fx-list thead th')].length") == 6
    assert opened.page.evaluate("[...document.querySelectorAll('#fx-sort option')].map(o => o.value)") == \
        ["frequency", "max_activation", "feature"]
    assert opened.page.evaluate("document.getElementById('fx-explanation')") is None
    assert "\"explanations\":" not in before  # the data carries no explanations key
    opened.clean()
    now = (feats / "features.html").read_text()
    chat = chat_model(tmp_path, tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        stand_in(mp)
        ran = invoke("explain", feats, "--explainer", chat, "--device", "cpu", "--max-features", 2,
                     "--out", tmp_path / "other", "--plot", tmp_path / "other.html")
    assert ran.exit_code == 0, ran.output
    assert (feats / "features.html").read_text() == now
    other = json.loads((tmp_path / "other" / "explanations.json").read_text())
    opened = Opened(browser, tmp_path / "other.html")
    f = int(other[0]["index"])
    opened.page.evaluate(f"location.hash = 'f-{f}'")
    opened.page.wait_for_function(f"document.querySelector('#fx-panel h2').textContent.startsWith('feature {f} ')")
    assert opened.page.evaluate("document.querySelector('#fx-explanation .explanation').textContent") == \
        other[0]["description"]
    opened.clean()


def test_features_plot_shows_the_explanations_its_out_holds(browser, explained, tiny_model_dir):
    """features --plot with --out DIR where explain wrote DIR/explanations.json: the page carries them (explain's
    rows of that file); a stale export (another hook) is left out with a warning."""
    from anatomy_cli.output.html.markup import script_json
    from anatomy_cli.output.views.explain import flat

    _, feats, _, _ = explained
    root = feats.parent
    export = json.loads((feats / "explanations.json").read_text())
    page = root / "again.html"
    result = invoke(*features_args(root / "sae", root / "corpus.txt", tiny_model_dir("gpt2"), feats), "--plot", page)
    assert result.exit_code == 0, result.output
    opened = Opened(browser, page)
    assert opened.page.evaluate("[...document.querySelectorAll('#fx-sort option')].map(o => o.value)")[2:4] \
        == ["detection_balanced_accuracy", "fuzz_balanced_accuracy"]
    f = int(export[-1]["index"])
    opened.page.evaluate(f"location.hash = 'f-{f}'")
    opened.page.wait_for_function(f"document.querySelector('#fx-panel h2').textContent.startsWith('feature {f} ')")
    assert opened.page.evaluate("document.querySelector('#fx-explanation .explanation').textContent") == \
        export[-1]["description"]
    assert f'"explanations":{script_json(flat(export))}' in page.read_text()  # explain's rows of the file, as they are
    opened.clean()
    stale = [{**r, "hook": "blocks.5.hook_resid_post"} for r in export]
    (feats / "explanations.json").write_text(json.dumps(stale))
    try:
        result = invoke(*features_args(root / "sae", root / "corpus.txt", tiny_model_dir("gpt2"), feats), "--plot",
                        page)
    finally:
        (feats / "explanations.json").write_text(json.dumps(export, indent=1, ensure_ascii=False))
    assert result.exit_code == 0 and "does not explain these features" in result.stderr, result.output
    assert '"explanations":' not in page.read_text()
