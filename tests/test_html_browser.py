"""The HTML pages in a real browser: Debian's chromium driven by playwright (``executable_path``; playwright's
own browser download is not needed). One browser for the session; every page is opened from disk with
every request that is not ``file://`` aborted and recorded.

Each page must load with no console error, no network request and no dialog (every prompt here contains
``<script>alert(1)</script>``); hovering a lens cell shows the JSON's top token and probability; switching
the attention picker shows the JSON's weight; screenshots are not blank. Skipped, with the reason, only
where no chromium or no playwright is installed (``.ci/run`` installs chromium with apt-get).

``ANATOMY_REPORT_SCREENSHOT=docs/img/report.png`` also renders the README's report screenshot from the real
SmolLM2 (test ``test_report_screenshot_of_a_real_model``).
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()
EVIL = "The <script>alert(1)</script> cat </div> sat"
KINDS = ("heads", "trace", "dla", "ablate", "patch", "drift", "params", "report")


class Opened:
    """A page opened from disk, with what happened while it loaded."""

    def __init__(self, browser, path: Path, viewport=(1280, 900)):
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", self._dialog)
        self.page.route("**/*", self._route)
        start = time.perf_counter()
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function("[...document.querySelectorAll('.js-plotly-plot')].length > 0 && "
                                    "[...document.querySelectorAll('.js-plotly-plot')].every(g => g._fullLayout)")
        self.seconds = time.perf_counter() - start

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _route(self, route) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.requests.append(route.request.url)
            route.abort()

    def clean(self) -> None:
        assert self.errors == [] and self.requests == [] and self.dialogs == []

    def hover_cell(self, div: str, x: float, y: float, trace: int = 0) -> None:
        """Move the mouse to data point (x, y) of the heatmap in ``div``."""
        box = self.page.evaluate(
            """([id, x, y]) => { const gd = document.getElementById(id), L = gd._fullLayout, r = gd.getBoundingClientRect();
                return [r.left + L.xaxis._offset + L.xaxis.d2p(x), r.top + L.yaxis._offset + L.yaxis.d2p(y)]; }""",
            [div, x, y])
        self.page.mouse.move(1, 1)  # off the plot: the previous tooltip goes away first
        self.page.wait_for_function("!document.querySelector('.hoverlayer .hovertext')")
        self.page.mouse.move(box[0] - 3, box[1] - 3)
        self.page.mouse.move(box[0], box[1])
        self.page.wait_for_function(
            f"document.querySelector('.hoverlayer .hovertext') && document.getElementById('{div}-readout') !== null "
            f"? document.getElementById('{div}-readout').textContent.includes('weight') : "
            "!!document.querySelector('.hoverlayer .hovertext')")

    def hover_lines(self) -> list[str]:
        self.page.wait_for_selector(".hoverlayer .hovertext")
        return self.page.evaluate(
            "[...document.querySelectorAll('.hoverlayer .hovertext tspan.line')].map(t => t.textContent)")

    def screenshot_is_not_blank(self, path: Path | None = None) -> None:
        from PIL import Image

        png = self.page.screenshot(full_page=True, path=str(path) if path else None)
        colours = Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50


@pytest.fixture(scope="module")
def pages(tiny_model_dir, tmp_path_factory):
    """Every kind of page, made on the tiny GPT-2 with a prompt that contains a script, plus the JSON."""
    from anatomy_cli import engine

    model = str(tiny_model_dir("gpt2"))
    folder = tmp_path_factory.mktemp("html")
    from conftest import FixedLoader

    from anatomy_cli.engine.loader import using_loader

    lm = engine.load(model)
    with using_loader(FixedLoader(lm)):
        runs = {
            "lens": ["lens", EVIL],
            "attn": ["attn", EVIL, "--layer", "1", "--head", "2"],
            "heads": ["heads", EVIL, "--seq-len", "20"],
            "trace": ["trace", EVIL],
            "dla": ["dla", EVIL, "--target", " the", "--by", "head"],
            "ablate": ["ablate", EVIL, "--target", " the"],
            "patch": ["patch", EVIL, "The <script>alert(2)</script> dog </div> sat", "--target", " the"],
            "drift": ["drift", "bank"],
            "params": ["params", model],
        }
        out, data = {}, {}
        for kind, args in runs.items():
            path = folder / f"{kind}.html"
            extra = [] if kind == "params" else ["--model", model]
            result = runner.invoke(app, [*args, *extra, "--format", "json", "--plot", str(path)])
            assert result.exit_code == 0, (kind, result.stderr)
            out[kind], data[kind] = path, json.loads(result.stdout)
        result = runner.invoke(app, ["report", EVIL, "--model", model, "-o", str(folder / "report.html")])
        assert result.exit_code == 0, result.stderr
        out["report"] = folder / "report.html"
        lens_k = runner.invoke(app, ["lens", EVIL, "--model", model, "--format", "json", "--k", "5"])
        data["lens_k"] = json.loads(lens_k.stdout)
        attn = runner.invoke(app, ["attn", EVIL, "--model", model, "--layer", "0", "--head", "3", "--format", "json"])
        data["attn_0_3"] = json.loads(attn.stdout)
    return out, data


@pytest.mark.parametrize("kind", KINDS)  # lens and attn: in their own tests below
def test_every_page_opens_offline_and_runs_no_script(browser, pages, kind):
    opened = Opened(browser, pages[0][kind])
    try:
        opened.clean()
        body = opened.page.inner_text("body")
        if kind not in ("drift", "params"):
            assert "<script>alert(1)</script> cat </div> sat" in body   # shown as text
        opened.screenshot_is_not_blank()
        # No button that leaves the page (plotly.js 4 shows "Share chart..." to Plotly Cloud unless told not to).
        titles = opened.page.evaluate("[...document.querySelectorAll('.modebar-btn')].map(b => b.dataset.title)")
        assert "Download plot as a PNG" in titles
        assert not [t for t in titles if re.search(r"cloud|share|chart studio|edit", t, re.I)], titles
    finally:
        opened.page.close()


def test_lens_hover_shows_the_json_top_token(browser, pages):
    paths, data = pages
    cells = {(c["layer"], c["position"]): c for c in data["lens_k"]["cells"]}
    opened = Opened(browser, paths["lens"])
    try:
        div = opened.page.evaluate("document.querySelector('.js-plotly-plot').id")
        for layer, position in ((0, 3), (1, 10)):  # blocks 0 and 1 of the tiny model (rows: embed, 0, 1)
            opened.hover_cell(div, position, data["lens"]["layers"].index(layer))
            lines = opened.hover_lines()
            assert lines[1] == f"layer {layer}"
            first = next(line for line in lines if line.startswith("1. "))
            token, prob = re.fullmatch(r"1\. (.*?)\s+([0-9.]+)", first).groups()
            cell = cells[(layer, position)]
            assert token == cell["top"][0]["token"] == cell["token"]
            assert float(prob) == pytest.approx(cell["probability"], abs=5e-5)
            assert lines[0] == f"position {position}: {data['lens']['tokens'][position]}"
        opened.clean()
        assert "<script>alert(1)</script> cat </div> sat" in opened.page.inner_text("body")
        opened.screenshot_is_not_blank()
    finally:
        opened.page.close()


def test_attention_picker_switches_heads(browser, pages):
    paths, data = pages
    weights = {(w["query_position"], w["key_position"]): w["weight"] for w in data["attn_0_3"]["weights"]}
    first = {(w["query_position"], w["key_position"]): w["weight"] for w in data["attn"]["weights"]}
    opened = Opened(browser, paths["attn"])
    try:
        readout = opened.page.locator("#attn-readout")
        opened.hover_cell("attn", 2, 5)
        assert readout.inner_text().endswith(f"weight {first[(5, 2)]:.4f}")
        tokens = data["attn"]["tokens"]
        assert readout.inner_text().startswith(f"layer 1 head 2 · query 5 {tokens[5]} → key 2 {tokens[2]} ·")
        opened.page.select_option("#attn-layer", "0")
        opened.page.select_option("#attn-head", "3")
        assert opened.page.evaluate("document.getElementById('attn-readout').textContent") == "layer 0 head 3"
        for q, k in ((5, 2), (12, 0), (14, 14)):
            opened.hover_cell("attn", k, q)
            assert readout.inner_text().endswith(f"weight {weights[(q, k)]:.4f}"), (q, k)
        opened.clean()
        assert "<script>alert(1)</script> cat </div> sat" in opened.page.inner_text("body")
        opened.screenshot_is_not_blank()
    finally:
        opened.page.close()


def test_a_512_token_attention_page_opens(browser, tmp_path, record_property):
    from anatomy_cli.output import plots
    from anatomy_cli.output.html import attn

    n = 512
    g = torch.Generator().manual_seed(0)
    mask = torch.triu(torch.full((n, n), float("-inf")), 1)
    patterns = torch.softmax(torch.randn(2, 4, n, n, generator=g) + mask, -1)
    page = attn.figure(patterns, [f"·t{i}" for i in range(n)], plots.Caption("attn", "synthetic", "512 tokens"),
                       causal=True)
    page.write(tmp_path / "long.html")
    opened = Opened(browser, tmp_path / "long.html")
    try:
        start = time.perf_counter()
        opened.page.select_option("#attn-head", "3")
        opened.page.wait_for_function("document.getElementById('attn-readout').textContent === 'layer 0 head 3'")
        switch = time.perf_counter() - start
        opened.hover_cell("attn", 100, 400)  # cells are 1-2 pixels: read which cell the mouse landed on
        shown = opened.page.locator("#attn-readout").inner_text()
        q, k, w = re.fullmatch(r"layer 0 head 3 · query (\d+) \S+ → key (\d+) \S+ · weight ([0-9.]+)", shown).groups()
        assert abs(int(q) - 400) <= 4 and abs(int(k) - 100) <= 4
        assert float(w) == pytest.approx(float(patterns[0, 3, int(q), int(k)]), abs=6e-5)
        opened.clean()
        # Recorded, not asserted (docs/performance.md): timings on a shared CI machine vary.
        record_property("open_seconds", round(opened.seconds, 2))
        record_property("switch_seconds", round(switch, 2))
        print(f"512-token attn page: {(tmp_path / 'long.html').stat().st_size / 1e6:.1f} MB, opened in "
              f"{opened.seconds:.2f} s, head switch {switch:.2f} s")
    finally:
        opened.page.close()


@pytest.mark.skipif(not os.environ.get("ANATOMY_REPORT_SCREENSHOT"), reason="set ANATOMY_REPORT_SCREENSHOT=FILE.png "
                    "to render the README's report screenshot")
def test_report_screenshot_of_a_real_model(browser, smollm2_gguf, tmp_path, monkeypatch):
    target = Path(os.environ["ANATOMY_REPORT_SCREENSHOT"]).resolve()
    (tmp_path / smollm2_gguf.name).symlink_to(smollm2_gguf)
    monkeypatch.chdir(tmp_path)  # the page names the model as given: the file name, not a venv path
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "The capital of Germany is the city of", "--model", smollm2_gguf.name,
                                 "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    opened = Opened(browser, out, viewport=(1360, 2500))
    try:
        opened.clean()
        opened.page.screenshot(path=str(target))  # the top of the page: the header to the lens grid
        opened.screenshot_is_not_blank()
    finally:
        opened.page.close()
