"""The fits' printed estimates against what the fits take (issue 61, item 4).

    python benchmarks/bench_fit_estimate.py [--model smollm2] [--only sae|tuned|jacobian]

Runs small but real fits on the model, each the CLI in a fresh process (as a user runs it), with ``--format json``:

- ``fit-sae docs/ --layer 15 --max-tokens 2000 --epochs 2`` (one block, 2,000 tokens);
- ``fit-lens tuned --corpus docs/ --tokens 512 --ctx 128 --steps 4``;
- ``fit-lens jacobian`` on the tour's two prompts, ``--source-layers 26-28 --max-seq-len 32 --dim-batch 64``.

For each: the estimate the command printed (its JSON ``estimate``/``cost``: every phase, the weights' load
included), the phases' own measured seconds (``timings``), the command's wall time from launch (Python's and
torch's start-up included, which no estimate counts), and the ratios wall / estimate and measured / estimated per
phase. Target: within 1.5x on a quiet machine. Prints markdown rows and the load average before and after each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "sae": ["fit-sae", "docs/", "--layer", "15", "--max-tokens", "2000", "--epochs", "2", "--out", "{tmp}/sae"],
    "tuned": ["fit-lens", "tuned", "--corpus", "docs/", "--tokens", "512", "--ctx", "128", "--steps", "4", "--out",
              "{tmp}/tuned"],
    "jacobian": ["fit-lens", "jacobian", "--prompts", "docs/examples/lens-prompts.txt", "--source-layers", "26-28",
                 "--max-seq-len", "32", "--dim-batch", "64", "--out", "{tmp}/lens.pt"],
}


def run(name: str, model: str) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"bench_fit_estimate.{name}.")
    args = [a.format(tmp=tmp) for a in RUNS[name]]
    cmd = [sys.executable, "-m", "anatomy_cli", *args, "--model", model, "--format", "json", "--no-server"]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"})
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout)
    return {"name": name, "wall": wall, "timings": data["timings"], "load_before": load,
            "load_after": os.getloadavg()[0], "line": proc.stderr.splitlines()[0] if proc.stderr else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--only", choices=sorted(RUNS), nargs="*")
    args = ap.parse_args()
    print("| fit | load before → after | estimated | phases measured | wall (from launch) | wall / estimate | "
          "per phase: measured / estimated |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only or list(RUNS):
        r = run(name, args.model)
        t = r["timings"]
        phases = ", ".join(f"{p['phase']} {p['seconds']:.0f}/{p['estimated_seconds']:.0f} s"
                           f" ({p['seconds'] / max(p['estimated_seconds'], 1e-9):.2f})" for p in t["phases"])
        print(f"| {name} | {r['load_before']:.1f} → {r['load_after']:.1f} | {t['estimated_seconds']:.0f} s | "
              f"{t['seconds']:.0f} s | {r['wall']:.0f} s | {r['wall'] / t['estimated_seconds']:.2f} | {phases} |",
              flush=True)


if __name__ == "__main__":
    main()
