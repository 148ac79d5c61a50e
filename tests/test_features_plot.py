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
            want = [[(vis(t), float(f"{a:.4g}")) for t, a in zip(c["tokens"], c["activations"])]  # 4 digits
                    for c in data["contexts"] if c["feature"] == f and c["kind"] == kind]
            assert [[tuple(x) for x in ctx] for ctx in panel_contexts(opened, box)] == want
        row = data["features"][f]
        bars = opened.page.evaluate("document.getElementById('fx-hist').data[0].y")
        assert sum(bars) == row["fires"] and sorted(b for b in bars if b) == sorted(h for h in row["histogram"] if h)
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


def test_a_token_holding_script_stays_text(browser, made):
    from anatomy_cli.output.html import features
    from anatomy_cli.output.plots import Caption

    data, _, root = made
    assert any(EVIL[:2] in "".join(c["tokens"]) for c in data["contexts"])  # the corpus' own markup reached the page
    data = copy.deepcopy(data)
    ctx = next(c for c in data["contexts"] if c["feature"] == 1 and c["kind"] == "top")
    ctx["tokens"][0] = EVIL
    page = root / "evil.html"
    features.figure(data, Caption("features", "tiny</title><script>alert(2)</script>")).write(page)
    assert EVIL not in page.read_text()
    opened = Opened(browser, page)
    opened.page.evaluate("location.hash = 'f-1'")
    opened.page.wait_for_function("document.querySelector('#fx-panel h2').textContent.startsWith('feature 1 ')")
    assert panel_contexts(opened, "fx-top")[0][0] == [EVIL, float(f"{ctx['activations'][0]:.4g}")]
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
    """circuit --plot links a feature node to ``features.html#f-ID`` (models/sae/feature_labels.py ``link``): opened
    at that address, the page shows that feature's panel, whose heading carries the id ``f-ID``."""
    from anatomy_cli.models.sae.feature_labels import FeatureLabels

    _, page, _ = made
    link = FeatureLabels(dashboard=page.resolve().as_uri()).link(5)
    opened = Opened(browser, page)
    opened.page.goto(link)
    opened.page.wait_for_function("document.querySelector('#fx-panel h2').textContent.startsWith('feature 5 ')")
    assert opened.page.evaluate("document.getElementById('f-5').textContent").startswith("feature 5 ")
    opened.clean()
