"""`features`' pass against its floor (issue 60, Tests and benchmark: ≤ 1.3×).

    python benchmarks/bench_features.py [--model smollm2] [--block 3 --block 14] [--tokens 8192] [--runs 3]

In one process, on the CPU, for a random TopK dictionary (``--d-sae`` features, k ``--k``, at block B's output,
seeded; every feature followed, co-firing counted, the defaults of ``anatomy features``):

- anatomy: the pass of ``anatomy features DICT --corpus docs/ --max-tokens N --ctx C`` (corpus/feature_run.py
  ``run`` with the loaded model and no ``--out``: the corpus read and cut into windows, each batch's forward up to
  block B and the encoder, the counts, histograms, co-firing and the top-k and quantile candidates);
- the floor: the same windows (cut beforehand, not timed), in batches of the same size, through a hand-written
  loop: transformers' model with its blocks after B removed (the embedding, blocks 0..B, and the final norm, one
  RMSNorm), block B's output kept by a hook, and the encoder (``x W_enc + b_enc``, top k, ReLU), nothing else.

The two alternate (``--runs`` each, after one warm-up of each); the median of each, their ratio (and the ratio of
the fastest runs: on a shared machine the least disturbed), and the load average before and after are printed
as a markdown row per block, with anatomy's own split of its time
(``forward``: the forward and the encoder; ``features``: the rest, corpus/feature_batch.py ``add_batch``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_explain import dictionary  # a random TopK SAE at block B's output, seeded

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def floor_run(hf, block: int, windows: list[list[int]], batch: int, w_enc, b_enc, k: int) -> None:
    """The hand-written loop: blocks 0..block of ``hf`` (the rest removed) and the TopK encoder, per batch."""
    import torch

    base = hf.model
    layers = base.layers
    base.layers = torch.nn.ModuleList(list(layers)[:block + 1])
    seen = {}
    handle = base.layers[block].register_forward_hook(lambda m, a, out: seen.__setitem__("x", out[0] if isinstance(
        out, tuple) else out))
    try:
        with torch.inference_mode():
            for start in range(0, len(windows), batch):
                ids = torch.tensor(windows[start:start + batch])
                base(input_ids=ids, use_cache=False)
                h = seen["x"].reshape(-1, w_enc.shape[0]) @ w_enc + b_enc
                vals, idx = h.topk(k, dim=-1)
                torch.zeros_like(h).scatter_(-1, idx, vals.relu())
    finally:
        handle.remove()
        base.layers = layers


def pass_of(feature_run, src, spec, settings, lm, split: dict[str, float]) -> None:
    """anatomy's pass (no ``--out``); its own time split added to ``split``."""
    result = feature_run.run(src, spec, settings, tokenizer=lm.tokenizer, lm=lm)
    for key, value in result.stats.seconds.items():
        split[key] = split.get(key, 0.0) + value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--block", type=int, action="append", help="the dictionary's block (repeatable; default 3 and 14)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from anatomy_cli import engine
    from anatomy_cli.corpus import feature_run
    from anatomy_cli.corpus.runner import plan
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.models.spec import ModelSpec

    spec = ModelSpec(args.model, device="cpu")
    lm = engine.load(spec)
    tmp = Path(tempfile.mkdtemp(prefix="bench_features."))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.model}, {lm.n_layers} blocks; "
          f"{args.tokens:,} tokens of docs/, ctx {args.ctx}, batch {args.batch}; TopK d_sae {args.d_sae}, k {args.k}; "
          f"median of {args.runs} alternating runs")
    print("| block | load before → after | anatomy pass | its forward+encoder / rest | floor | ratio |")
    print("|---|---|---|---|---|---|")
    for block in args.block or [3, 14]:
        sae = dictionary(tmp / f"sae{block}", lm.d_model, args.d_sae, args.k, block)
        settings = feature_run.FeatureSettings(ctx=args.ctx, bos=False, sae=str(sae), hook=None,
                                               features=tuple(range(args.d_sae)), max_tokens=args.tokens,
                                               batch_size=args.batch)
        src = open_source(str(ROOT / "docs"), column="text")
        windows = [list(w) for shard in plan(src, lm.tokenizer, settings) for w in shard.windows]
        from safetensors.torch import load_file

        weights = load_file(str(sae / "sae_weights.safetensors"))
        split: dict[str, float] = {}
        ours = functools.partial(pass_of, feature_run, src, spec, settings, lm, split)
        floor = functools.partial(floor_run, lm.model, block, windows, args.batch, weights["W_enc"].float(),
                                  weights["b_enc"].float(), args.k)

        load0 = os.getloadavg()[0]
        ours(), floor()  # warm-up
        split.clear()
        a, b = [], []
        for _ in range(args.runs):
            for fn, times in ((ours, a), (floor, b)):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        load1 = os.getloadavg()[0]
        ma, mb = statistics.median(a), statistics.median(b)
        fwd, rest = (split.get("forward", 0.0) / args.runs, split.get("features", 0.0) / args.runs)
        print(f"| {block} | {load0:.1f} → {load1:.1f} | {ma:.2f} s ({min(a):.2f}–{max(a):.2f}) | {fwd:.2f} s / "
              f"{rest:.2f} s | {mb:.2f} s ({min(b):.2f}–{max(b):.2f}) | {ma / mb:.2f}× (best {min(a) / min(b):.2f}×) |")


if __name__ == "__main__":
    main()
