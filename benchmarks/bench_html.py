"""HTML pages in a real browser (issue 31): how long a page takes to open and to switch heads.

    python benchmarks/bench_html.py                     # 10 opens of each page, alternating
    python benchmarks/bench_html.py --runs 20 --json /tmp/html.json --smollm2

Debian's chromium driven by playwright, as in tests/test_html_browser.py: one browser, a new tab per open,
every request that is not ``file://`` aborted. "open" is the navigation until every plotly figure of the page
is drawn (``gd._fullLayout``), "switch" picking head 3 until the title says so. Each page is written twice:
with the plotly.js that ``anatomy`` writes (the cartesian bundle shipped in ``anatomy_cli/data/plotly``) and
with plotly.py's full bundle (what the pages had before), the two opened alternately. Pages:

1. ``attn512``: the page of tests/test_html_browser.py, a 512-token causal pattern (2 layers x 4 heads,
   synthetic, every weight shown). Target: opens and responds within 2 s.
2. ``report`` (with ``--smollm2``): ``anatomy report`` of the real SmolLM2-135M on a 9-token prompt.
3. ``attn512-smollm2`` (with ``--smollm2``): ``anatomy attn --plot`` of SmolLM2 (30 layers x 9 heads) on the
   first 512 tokens of docs/article.md, shown in blocks of 4 positions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import print_figures

WAIT_DRAWN = ("[...document.querySelectorAll('.js-plotly-plot')].length > 0 && "
              "[...document.querySelectorAll('.js-plotly-plot')].every(g => g._fullLayout)")


def attn512(path: Path) -> None:
    import torch

    from anatomy_cli.output import plots
    from anatomy_cli.output.html import attn

    n = 512
    g = torch.Generator().manual_seed(0)
    mask = torch.triu(torch.full((n, n), float("-inf")), 1)
    patterns = torch.softmax(torch.randn(2, 4, n, n, generator=g) + mask, -1)
    attn.figure(patterns, [f"·t{i}" for i in range(n)], plots.Caption("attn", "synthetic", "512 tokens"),
                causal=True).write(path)


def report(path: Path) -> None:
    from typer.testing import CliRunner

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_attribution import gguf_path

    from anatomy_cli.cli.main import app

    result = CliRunner().invoke(app, ["report", "The capital of Germany is the city of", "--model",
                                      str(gguf_path()), "-o", str(path)])
    if result.exit_code != 0:
        sys.exit(f"report failed: {result.output}")


def attn512_smollm2(path: Path) -> None:
    from typer.testing import CliRunner

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_attribution import gguf_path

    from anatomy_cli import engine
    from anatomy_cli.cli.main import app

    model = str(gguf_path())
    lm = engine.load(model, device="cpu", dtype="fp32")
    article = (Path(__file__).resolve().parents[1] / "docs" / "article.md").read_text(encoding="utf-8")
    enc = engine.encode(lm, [article], bos=False)[0]
    text = article[:enc.offsets[511][1]]                               # the first 512 tokens' text
    result = CliRunner().invoke(app, ["attn", text, "--model", model, "--layer", "0", "--head", "0", "--plot",
                                      str(path), "--format", "json"])
    if result.exit_code != 0:
        sys.exit(f"attn failed: {result.output[-2000:]}")


def write_both(make, folder: Path, name: str) -> tuple[Path, Path]:
    """``make`` writes the page twice: with anatomy's plotly.js and with plotly.py's full bundle."""
    from plotly.offline import get_plotlyjs

    from anatomy_cli.output.html import _page

    ours, full = folder / f"{name}.html", folder / f"{name}-full.html"
    make(ours)
    saved = _page.plotly_js
    _page.plotly_js = get_plotlyjs
    try:
        make(full)
    finally:
        _page.plotly_js = saved
    return ours, full


def open_once(browser, path: Path, switch: bool) -> tuple[float, float | None]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://") else r.abort())
    try:
        start = time.perf_counter()
        page.goto(path.resolve().as_uri())
        page.wait_for_function(WAIT_DRAWN)
        opened = time.perf_counter() - start
        switched = None
        if switch:
            start = time.perf_counter()
            page.select_option("#attn-head", "3")
            page.wait_for_function("document.getElementById('attn').layout.title.text.endsWith('head 3')")
            switched = time.perf_counter() - start
        return opened, switched
    finally:
        page.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--smollm2", action="store_true", help="also the report page of the real SmolLM2")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or sys.exit("no chromium on PATH (apt-get install -y chromium)")
    figures = {"date": time.strftime("%Y-%m-%dT%H:%M%z"), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "load_before": os.getloadavg(), "pages": {}}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        folder = Path(tmp)
        pages = {"attn512": (write_both(attn512, folder, "attn512"), True)}
        if args.smollm2:
            pages["report"] = (write_both(report, folder, "report"), False)
            pages["attn512-smollm2"] = (write_both(attn512_smollm2, folder, "attn512-smollm2"), True)
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        for name, ((ours, full), switch) in pages.items():
            open_once(browser, ours, switch), open_once(browser, full, switch)  # warm-up
            rows = {"anatomy": [], "full": []}
            for i in range(args.runs):
                rows["anatomy"].append(open_once(browser, ours, switch))
                rows["full"].append(open_once(browser, full, switch))
                print(f"{name} run {i + 1}: {rows['anatomy'][-1][0]:.2f} s vs {rows['full'][-1][0]:.2f} s",
                      file=sys.stderr, flush=True)
            out = {"mb": {"anatomy": ours.stat().st_size / 1e6, "full": full.stat().st_size / 1e6}}
            for side, samples in rows.items():
                opens = [o for o, _ in samples]
                out[side] = {"open_median_s": statistics.median(opens), "open_min_s": min(opens),
                             "open_max_s": max(opens), "open_s": opens}
                if switch:
                    out[side]["switch_median_s"] = statistics.median(s for _, s in samples)
            figures["pages"][name] = out
            print(name, json.dumps(out), file=sys.stderr, flush=True)
        browser.close()
    print_figures(figures, args.json)


if __name__ == "__main__":
    main()
