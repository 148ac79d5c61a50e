"""First calls that must not wait for torch (issue 32): `params PRESET` with an empty cache (target <= 0.3x
`import torch`) and prompt-level usage errors (target <= 0.5x `import torch`).

    python benchmarks/bench_first_call.py             # 5 runs each, prints a markdown table
    python benchmarks/bench_first_call.py --runs 3

Every figure is the median wall-clock time of a fresh subprocess, measured alternately with the baseline
``python -c "import torch"`` in the same run, offline, with an empty ``ANATOMY_CACHE_DIR`` per run:

* ``params llama-7b``, ``params mixtral-8x7b --per-layer --dtype bf16``: the shipped preset counts;
* ``trace "x y z" --position 99 --model DIR``: DIR a tiny random GPT-2 (save_pretrained, GPT-2's tokenizer);
* ``patch "a b c" "a b" --target " much" --model DIR``: prompts of different token lengths;
* ``trace "x y z" --position 99 --init random``: the gpt2 preset, its tokenizer from the package's BPE files.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parents[1]


def tiny_gpt2(workdir: Path) -> Path:
    out = workdir / "tiny-gpt2"
    if not (out / "config.json").is_file():
        code = ("import sys; sys.path.insert(0, 'tests'); import models\n"
                "from conftest import build_gpt2_tokenizer\n"
                f"models.save_tiny('gpt2', __import__('pathlib').Path({str(out)!r}), build_gpt2_tokenizer())\n")
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([PYTHON, "-c", code], cwd=ROOT, check=True, capture_output=True)
    return out


def timed(argv: list[str], env: dict, expect: int) -> float:
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        proc = subprocess.run(argv, env={**env, "ANATOMY_CACHE_DIR": cache}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - start
    if proc.returncode != expect:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "anatomy-first-call")
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("ANATOMY_SERVER", None)
    model = str(tiny_gpt2(args.workdir))
    anatomy = [PYTHON, "-m", "anatomy_cli", "--no-server"]  # in-process, as without a server
    cases = [
        ("`params llama-7b`, empty cache", [*anatomy, "params", "llama-7b"], 0, 0.3),
        ("`params mixtral-8x7b --per-layer --dtype bf16`, empty cache",
         [*anatomy, "params", "mixtral-8x7b", "--per-layer", "--dtype", "bf16"], 0, 0.3),
        ("`trace \"x y z\" --position 99 --model DIR` (exit 2)",
         [*anatomy, "trace", "x y z", "--position", "99", "--model", model], 2, 0.5),
        ("`patch \"a b c\" \"a b\" --target \" much\" --model DIR` (exit 2)",
         [*anatomy, "patch", "a b c", "a b", "--target", " much", "--model", model], 2, 0.5),
        ("`trace \"x y z\" --position 99 --init random` (gpt2 preset, exit 2)",
         [*anatomy, "trace", "x y z", "--position", "99", "--init", "random"], 2, 0.5),
    ]
    base: list[float] = []
    samples: dict[str, list[float]] = {label: [] for label, *_ in cases}
    for _ in range(args.runs):
        for label, argv, expect, _target in cases:
            base.append(timed([PYTHON, "-c", "import torch"], env, 0))
            samples[label].append(timed(argv, env, expect))
    torch_s = statistics.median(base)
    print(f"`python -c \"import torch\"`: median {torch_s:.2f} s over {len(base)} runs\n")
    print("| first call | median | ratio to `import torch` | target | result |")
    print("| --- | --- | --- | --- | --- |")
    for label, _argv, _expect, target in cases:
        t = statistics.median(samples[label])
        verdict = "pass" if t / torch_s <= target else "FAIL"
        print(f"| {label} | {t:.2f} s | {t / torch_s:.2f} | ≤ {target}× | {verdict} |")


if __name__ == "__main__":
    main()
