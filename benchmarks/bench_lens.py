"""`anatomy lens` against one forward plus one batched unembedding (issue 16).

    python benchmarks/bench_lens.py [--runs 20] [--warmup 3] [--workdir DIR] [--max-wait 15]

Figure (medians of in-process wall times, one loaded model, the two sides alternating):
  what `anatomy lens PROMPT` computes minus rendering (encode, `engine.run` of the residual stream
  at every position, `analyses.lens.lens_grid` over all (L + 1) x 15 rows: final norm, LM head,
  float64 log-softmax, top token, entropy, KL to the last layer, then the JSON cells) vs the raw
  transformers baseline: tokenizer, `model(**enc, output_hidden_states=True)` and ONE batched
  `lm_head(ln_f(stacked hidden states))` of those rows with a softmax top-1. Target <= 1.5x.
GPT-2 small shape with random weights (seed 0; benchmarks/run.py's checkpoint). Prints a markdown row.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench

PROMPT = bench.TRACE_PROMPT  # 15 GPT-2 tokens


def lens_in_process(lm, prompt: str):
    """What `anatomy lens PROMPT` computes, minus rendering (mirrors tasks/lens.py)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import lens as analysis
    from anatomy_cli.cli.commands._common import describe

    encoded = engine.check_length(lm, engine.encode(lm, [prompt]))
    [cache] = engine.run(lm, encoded, engine.residual_names(lm))
    grid = analysis.lens_grid(cache.residual_stream(), lambda h: engine.unembed(lm, h), describe=describe(lm),
                              positions=cache.positions)
    return grid.to_dict()


def forward_and_unembed(model, tokenizer, prompt: str):
    """The baseline: one forward with hidden states, then one batched final norm + LM head of all rows."""
    import torch

    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model(**enc, output_hidden_states=True, use_cache=False)
        rows = torch.stack(out.hidden_states)[:, 0]                       # [L + 1, pos, d_model]
        logits = model.lm_head(model.transformer.ln_f(rows))              # [L + 1, pos, vocab]
        probs, ids = torch.softmax(logits.double(), -1).max(-1)
    return ids.tolist(), probs.tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="keep/reuse the checkpoint here")
    parser.add_argument("--max-wait", type=float, default=15.0, help="seconds to wait for a quiet CPU per sample")
    args = parser.parse_args(argv)
    bench.BUSY["max_wait"] = args.max_wait

    import torch

    from anatomy_cli import engine

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-lens-"))
    bench.seed_tiktoken(work / "tiktoken")
    import os

    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(work / "tiktoken"))
    ckpt = work / "gpt2-small"
    if not (ckpt / "done.json").exists():
        bench.make_checkpoint("small", ckpt, lambda m: print(m, file=sys.stderr))
    lm = engine.load(str(ckpt), device="cpu")
    tokenizer = lm.tokenizer.hf
    n_tokens = len(tokenizer(PROMPT)["input_ids"])
    # Same answer on both sides: the lens's top token of every cell.
    data = lens_in_process(lm, PROMPT)
    ids, _ = forward_and_unembed(lm.model, tokenizer, PROMPT)
    raw_last = [c["token_id"] for c in data["cells"] if c["layer"] < lm.n_layers]
    same = sum(a == b for a, b in zip(raw_last, [i for row in ids[:-1] for i in row]))
    a, b = bench.alternate(bench.timed(lambda: lens_in_process(lm, PROMPT)),
                           bench.timed(lambda: forward_and_unembed(lm.model, tokenizer, PROMPT)),
                           args.runs, args.warmup)
    ratio = bench.median(a) / bench.median(b)
    result = {"tokens": n_tokens, "rows": (lm.n_layers + 1) * n_tokens, "anatomy_s": a, "baseline_s": b,
              "ratio": ratio, "busy_samples": bench.BUSY["busy"], "torch_threads": torch.get_num_threads(),
              "cells_agreeing_below_last_layer": f"{same}/{len(raw_last)}", "loadavg": bench.loadavg()}
    print(json.dumps(result), file=sys.stderr)
    print(f"| `lens` in-process (small, {n_tokens} tokens, {result['rows']} rows) vs forward + one batched "
          f"unembedding | {bench.fmt_s(bench.median(a))} | {bench.fmt_s(bench.median(b))} | {ratio:.2f} | ≤ 1.5 | "
          f"{'pass' if ratio <= 1.5 else 'fail'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
