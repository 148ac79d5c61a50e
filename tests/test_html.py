"""Interactive pictures (`--plot FILE.html`, `anatomy report`) without a browser: paths, dispatch, escaping,
the numbers inside the page, the attention blocks for long prompts. The browser tests are in
test_html_browser.py.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError
from anatomy_cli.output import plots

runner = CliRunner()
EVIL = "The <script>alert(1)</script> cat </div> sat"


def figure_data(path) -> list[dict]:
    """The plotly traces of every figure in a page, read back from the file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', text, re.S):
        out.append(json.loads(match.group(1)))
    return out


def outside_plotlyjs(path) -> str:
    """The page without the embedded plotly.js (whose own source mentions <script> and friends)."""
    text = path.read_text(encoding="utf-8")
    start = text.index('<script type="text/javascript">')
    end = text.index("</script>", start)
    return text[:start] + text[end:]


# ---------------------------------------------------------------- paths and dispatch, no model

def test_html_is_a_plot_suffix(tmp_path):
    assert plots.check_path(tmp_path / "x.HTML") == tmp_path / "x.HTML"
    assert plots.is_html(tmp_path / "x.html") and not plots.is_html(tmp_path / "x.png")
    with pytest.raises(UsageError, match=r"\.pdf or \.html"):
        plots.check_path(tmp_path / "x.htm")


def test_draw_picks_the_module_by_suffix(tmp_path):
    assert plots.module("lens", tmp_path / "a.html").__name__ == "anatomy_cli.output.html.lens"
    assert plots.module("lens", tmp_path / "a.png").__name__ == "anatomy_cli.output.plots.lens"


def test_html_draws_without_matplotlib(tmp_path):
    # A whole --plot .html run of the lens on synthetic data, in a fresh interpreter.
    code = f"""
import sys, torch
from anatomy_cli.analyses.lens import lens_grid
from anatomy_cli.output import plots
g = torch.Generator().manual_seed(0)
grid = lens_grid(torch.randn(3, 4, 8, generator=g), lambda h: h @ torch.randn(8, 20, generator=g),
                 describe=lambda i: (f"·t{{i}}", f" t{{i}}"), k=5)
plots.draw("lens", plots.check_path({str(tmp_path / 'l.html')!r}), None, grid, "prob", ["a", "b", "c", "d"],
           plots.Caption("lens", "m", "p"))
print("matplotlib" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    page = (tmp_path / "l.html").read_text(encoding="utf-8")
    assert "plotly.js (cartesian - minified) v4.1.1" in page and len(page) > 1_400_000  # plotly.js is inside


def test_the_shipped_plotly_bundle_is_the_npm_file_and_is_used_for_its_major_version(monkeypatch):
    # The file of plotly.js-cartesian-dist-min 4.1.1, unchanged (sha256 of the published file), and the trace
    # types the pages draw are in it. A plotly.py that writes another plotly.js major version's JSON gets
    # its own full bundle instead.
    import hashlib

    import plotly.offline

    from anatomy_cli.data import PLOTLY_CARTESIAN
    from anatomy_cli.output.html import _page

    data = PLOTLY_CARTESIAN.read_bytes()
    assert hashlib.sha256(data).hexdigest() == "79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a"
    assert b"</script" not in data.lower()
    html_dir = Path(_page.__file__).parent
    used = {t.lower() for f in html_dir.glob("*.py") for t in re.findall(r"\bgo\.([A-Z][A-Za-z]+)\(", f.read_text())}
    assert used - {"figure"} == {"heatmap", "bar", "scatter"}
    for trace in used - {"figure"}:
        assert f'moduleType:"trace",name:"{trace}"'.encode() in data
    _page.plotly_js.cache_clear()
    try:
        monkeypatch.setattr(_page, "get_plotlyjs_version", lambda: "4.9.0")
        assert _page.plotly_js() == data.decode("utf-8")
        _page.plotly_js.cache_clear()
        monkeypatch.setattr(_page, "get_plotlyjs_version", lambda: "5.0.0")
        assert _page.plotly_js() == plotly.offline.get_plotlyjs()
    finally:
        _page.plotly_js.cache_clear()


def test_a_matplotlib_figure_becomes_a_page_with_its_png(tmp_path):
    # A command that has no HTML module yet (one of this turn's new commands) still writes a page.
    from anatomy_cli.output.plots._base import new_figure

    fig = new_figure(3, 2)
    fig.suptitle("corpus · m")
    plots.save(fig, tmp_path / "c.html")
    text = (tmp_path / "c.html").read_text()
    assert 'src="data:image/png;base64,' in text and "no interactive HTML module yet" in text


# ---------------------------------------------------------------- attention blocks for long prompts

def test_attention_blocks_keep_rows_summing_to_one():
    from anatomy_cli.output.html.attn import pool

    torch.manual_seed(0)
    p = torch.softmax(torch.randn(3, 10, 10), -1)
    pooled = pool(p, 3)                                  # blocks 0-2, 3-5, 6-8, 9
    assert pooled.shape == (3, 4, 4)
    assert torch.allclose(pooled.sum(-1), torch.ones(3, 4), atol=1e-6)
    assert torch.isclose(pooled[1, 0, 1], p[1, 0:3, 3:6].sum(-1).mean())
    assert torch.isclose(pooled[1, 3, 3], p[1, 9, 9])    # the last block holds one position


def test_block_factor_limits():
    from anatomy_cli.output.html.attn import MAX_CELLS
    from anatomy_cli.output.html.attn import block_factor

    assert block_factor(15, 8, causal=True) == 1
    assert block_factor(512, 8, causal=True) == 1
    assert block_factor(1024, 8, causal=True) == 2       # at most 512 positions per axis
    f = block_factor(512, 270, causal=True)              # SmolLM2: 30 layers x 9 heads
    m = -(-512 // f)
    assert m * m * 270 <= MAX_CELLS < (-(-512 // (f - 1))) ** 2 * 270


def test_every_head_is_in_the_page_to_four_decimals(tmp_path):
    from anatomy_cli.output.html import attn

    torch.manual_seed(0)
    n = 200  # long enough that the base64 holds every pair of letters (a placeholder must not clash)
    patterns = torch.softmax(torch.randn(2, 3, n, n) + torch.triu(torch.full((n, n), -1e9), 1), -1)
    tokens = ["a", "<b>"] + [f"t{i}" for i in range(n - 2)]
    page = attn.figure(patterns, tokens, plots.Caption("attn", "m", "p"), causal=True)
    page.write(tmp_path / "a.html")
    text = (tmp_path / "a.html").read_text()
    data = json.loads(re.search(r"var D = (\{.*?\});\n", text).group(1))
    for layer in range(2):
        for head in range(3):
            raw = np.frombuffer(base64.b64decode(data["data"][layer][head]), dtype="<u2") / data["scale"]
            expected = patterns[layer, head].numpy()[np.tril_indices(n)]
            assert np.abs(raw - expected).max() < 1e-4
    assert "\\u003cb\\u003e" in text and "<b>" not in outside_plotlyjs(tmp_path / "a.html")


# ---------------------------------------------------------------- commands on a tiny model

@pytest.fixture
def tiny(tiny_model_dir, cached_load):
    return str(tiny_model_dir("gpt2"))


def test_lens_page_hover_lists_the_top_five_and_json_is_unchanged(tmp_path, tiny):
    out = tmp_path / "lens.html"
    plain = runner.invoke(app, ["lens", "Thank you very", "--model", tiny, "--format", "json"])
    result = runner.invoke(app, ["lens", "Thank you very", "--model", tiny, "--format", "json", "--plot", str(out)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(plain.stdout)       # no "top" lists without --k
    with_k = json.loads(runner.invoke(app, ["lens", "Thank you very", "--model", tiny, "--format", "json",
                                            "--k", "5"]).stdout)
    (traces,) = figure_data(out)
    hover = traces[0]["customdata"]
    for cell in with_k["cells"]:
        r, c = with_k["layers"].index(cell["layer"]), with_k["positions"].index(cell["position"])
        lines = hover[r][c].split("<br>")
        assert lines[1] == f"layer {cell['layer']}"
        listed = [line for line in lines if re.match(r"\d\. ", line)]
        assert listed == [f"{t['rank']}. {t['token']}  {t['probability']:.4f}" for t in cell["top"]]


def test_user_text_is_escaped_in_every_page(tmp_path, tiny):
    for args in (["lens", EVIL], ["attn", EVIL, "--layer", "0", "--head", "1"], ["trace", EVIL]):
        out = tmp_path / f"{args[0]}.html"
        result = runner.invoke(app, [*args, "--model", tiny, "--format", "json", "--plot", str(out)])
        assert result.exit_code == 0, result.stderr
        page = outside_plotlyjs(out)
        assert "<script>alert" not in page and "</div> sat" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt; cat &lt;/div&gt; sat" in page   # the heading, as text


def test_report_sections_and_errors(tmp_path, tiny):
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", EVIL, "--model", tiny, "-o", str(out), "--sections", "next,tokens"])
    assert result.exit_code == 0, result.stderr
    page = outside_plotlyjs(out)
    assert page.index("<h2>tokens</h2>") < page.index("<h2>next-token distribution</h2>")
    assert "<h2>lens</h2>" not in page and "<script>alert" not in page
    assert "1 forward passes" in result.stderr
    bad = runner.invoke(app, ["report", "x", "--model", tiny, "-o", str(out), "--sections", "lens,bogus"])
    assert bad.exit_code == 2 and "--sections" in bad.stderr
    bad = runner.invoke(app, ["report", "x", "--model", tiny, "-o", str(tmp_path / "r.png")])
    assert bad.exit_code == 2 and ".html" in bad.stderr


def test_report_words_number_the_rows_as_its_charts_do(tmp_path, tiny):
    # issue 61 item 10: the explanations said "layer 0 of the residual stream" for the embedding and "Rows are layers
    # (0 = embedding at the bottom)", while the charts (and docs/engine.md#layers) say `embed`, then block 0
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", "Thank you very", "--model", tiny, "-o", str(out),
                                 "--sections", "embedding,residual,lens"])
    assert result.exit_code == 0, result.stderr
    words = " ".join(re.findall(r'<p class="explain">(.*?)</p>', outside_plotlyjs(out), re.S))
    assert words.count("embed") >= 3 and "block 0" in words
    for old in ("layer 0", "0 = embedding", "Rows are layers", "layer by layer", "at that layer"):
        assert old not in words, old


def test_report_numbers_are_the_commands_numbers(tmp_path, tiny):
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", "Thank you very", "--model", tiny, "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "2 forward passes" in result.stderr
    nxt = json.loads(runner.invoke(app, ["next", "Thank you very", "--model", tiny, "--format", "json",
                                         "--k", "10"]).stdout)
    figures = figure_data(out)
    bars = figures[-1][0]
    assert bars["x"] == pytest.approx([t["probability"] for t in nxt["top"]], abs=1e-6)
    top = nxt["top"][0]["token"]
    dla = json.loads(runner.invoke(app, ["dla", "Thank you very", "--model", tiny, "--format", "json",
                                         "--target-id", str(nxt["top"][0]["token_id"]), "--by", "head"]).stdout)
    mlp = {r["component"]: r["contribution"] for r in dla["rows"]}
    dla_bars = [t for fig in figures for t in fig if t.get("type") == "bar" and t.get("name") == "MLP"]
    assert dla_bars[0]["y"] == pytest.approx([mlp[f"L{layer}.mlp"] for layer in range(len(dla_bars[0]["y"]))],
                                             abs=1e-6)
    assert f"logit({top})" in out.read_text()


def test_a_long_prompt_is_pooled_during_the_run(tmp_path, tiny, monkeypatch):
    from anatomy_cli.output.html import attn

    monkeypatch.setattr(attn, "MAX_SHOWN", 8)  # the tiny model's context is 64: make 15 tokens "long"
    out = tmp_path / "a.html"
    plain = runner.invoke(app, ["attn", EVIL, "--model", tiny, "--layer", "1", "--head", "2", "--format", "json"])
    result = runner.invoke(app, ["attn", EVIL, "--model", tiny, "--layer", "1", "--head", "2", "--format", "json",
                                 "--plot", str(out)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(plain.stdout)      # the table's rows stay exact
    text = out.read_text()
    data = json.loads(re.search(r"var D = (\{.*?\});\n", text).group(1))
    assert (data["f"], data["n"], data["tri"], data["total"]) == (2, 8, False, 15)
    weights = {(w["query_position"], w["key_position"]): w["weight"] for w in json.loads(plain.stdout)["weights"]}
    block = np.frombuffer(base64.b64decode(data["data"][1][2]), dtype="<u2").reshape(8, 8) / data["scale"]
    expected = (sum(weights.get((q, k), 0.0) for q in (4, 5) for k in (2, 3)) / 2)   # queries 4-5, keys 2-3
    assert block[2, 1] == pytest.approx(expected, abs=1e-4)
    assert "15 tokens: shown in blocks of 2 positions" in text
    # Blocks wholly after their query block are masked (the page draws them blank, not 0), and plotly's own
    # tooltip names no position (x, y are block numbers there; the line above the plot gives the positions).
    assert data["causal"] is True and np.all(block[np.triu_indices(8, 1)] == 0) and "(D.causal && k > q) ? null" in text
    assert '"hovertemplate":"weight %{z:.4f}' in text and "query %{y}" not in text


def test_byte_pieces_read_as_in_the_table(tmp_path, tiny):
    # GPT-2 splits 我 (e6 88 91) into the byte pieces <e6 88> and <91>: the page names them as the JSON does, made
    # visible once (not <e6·88>: the space of the display piece is not a leading space of the token).
    out = tmp_path / "lens.html"
    result = runner.invoke(app, ["lens", "我 cat", "--model", tiny, "--format", "json", "--plot", str(out)])
    assert result.exit_code == 0, result.stderr
    tokens = json.loads(result.stdout)["tokens"]
    assert "<e6 88>" in tokens
    shown = [t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for t in tokens]
    (traces,) = figure_data(out)
    firsts = [row.split("<br>")[0] for row in traces[0]["customdata"][0]]
    assert firsts == [f"position {i}: {t}" for i, t in enumerate(shown)]
    page = outside_plotlyjs(out)
    axis = re.search(r'"xaxis":\{"title":\{"text":"input token at each position"\},.*?"ticktext":(\[[^\]]*\])', page)
    assert json.loads(axis.group(1)) == shown and "e6·88" not in page and "e6\\u00b788" not in page


def figure_layouts(path) -> list[dict]:
    """The plotly layout of every figure in a page, read back from the file."""
    text = path.read_text(encoding="utf-8")
    return [json.loads(m.group(1)) for m in
            re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*\[.*?\],\s*(\{.*?\}),\s*\{"displaylogo"', text, re.S)]


@pytest.mark.usefixtures("cached_load")
def test_the_residual_chart_makes_room_for_its_rotated_lens_labels(tiny_model_dir, tmp_path):
    # issue 51 item 9: the report's residual chart (trace's HTML part) clipped its rotated lens tokens and put the
    # axis title under the toolbar; the margins now hold the longest label at 60° below the toolbar's band
    import dataclasses
    import math

    import anatomy_cli as anatomy
    from anatomy_cli.output.html import Page
    from anatomy_cli.output.html import trace as trace_html

    got = anatomy.trace(str(tiny_model_dir("gpt2")), "The capital of Germany is").result
    long = dataclasses.replace(got, layers=tuple(dataclasses.replace(r, lens_token="·responsibilities")
                                                 for r in got.layers))
    for result, chars in ((got, max(len(r.lens_token[:10]) for r in got.layers)), (long, 10)):
        path = tmp_path / "t.html"
        path.write_text(Page(title="t", lines=[]).add(trace_html.part(result)).render(), encoding="utf-8")
        (lay,) = figure_layouts(path)
        rise = chars * 7 * math.sin(math.radians(60))   # 7 px a character at 12 px, generously 7.5 in the code
        assert lay["margin"]["t"] >= 36 + 20 + rise       # the toolbar's band, the axis title, the labels
        assert lay["margin"]["r"] >= chars * 7 * math.cos(math.radians(60))
        plot_height = lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]
        assert plot_height >= 680 - 90 - 60               # the panels keep their height
