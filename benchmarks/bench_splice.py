"""Why a cross-layer transcoder spliced into every block at once moves the next-token CE so far (issue 62): the
CLT and a per-layer transcoder set fitted on the same tokens, spliced into SmolLM2 in several ways, with plain
PyTorch hooks on transformers' own ``mlp`` modules and the weights read from the written files (not anatomy's
readers or ``clt_fit.spliced_logits``). Not in the suite; its figures are in docs/commands/sae.md.

    python benchmarks/bench_splice.py --corpus docs/ --per-layer DIR --clt DIR [--model smollm2] [--ctx 64]
        [--first W] [--windows N] [--fit-json FILE]

The windows are ``fit-sae``'s (the corpus packed as it packs it); ``--first`` the first one read (a fit on
``--max-tokens T`` trains on windows ``0 .. T/ctx − 2`` and holds out ``T/ctx − 1``), ``--windows`` how many.
Per dictionary and window:

  - ``closed``: every block's MLP output replaced by the reconstruction, the features read from the spliced
    forward's own MLP inputs (what ``fit-sae --clt`` reports, the replacement model's run);
  - ``open``: every block's MLP output replaced by the reconstruction computed from the *clean* forward's MLP
    inputs (the errors add up downstream, but no encoder reads a spliced input);
  - ``single``: one block at a time (open, the per-layer fit's figure), mean and max over blocks;
  - ``first m``: blocks ``0 .. m − 1`` spliced closed-loop (how the CE grows with the blocks spliced);
  - per block the FVE of the reconstruction on the clean inputs, and the mean L0 clean and closed-loop.

Every splice leaves each window's first positions as the model computes them, and every figure (CE, KL, FVE, L0)
is over the later positions: ``fit-sae``'s rule (``sae_fit.SKIPPED``: its rows and its held-out check), so these
figures are the fit's kind.

``--fit-json``: the CLT fit's JSON (``fit-sae --clt -f json``); its held-out window's reported CE is compared with
this script's closed-loop figure on the same window (the check that the fit's splice and the files agree).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anatomy_cli.engine.sae_fit import SKIPPED  # fit-sae's rule: each window's first positions kept


def read_per_layer(folder: Path, n: int) -> list[dict[str, torch.Tensor | int]]:
    """sparsify's transcoder files, one per block: TopK over ``x W_encᵀ + b_enc`` (ReLU), ``a W_dec + b_dec``."""
    out = []
    for layer in range(n):
        sub = folder / f"layers.{layer}.mlp"
        w = load_file(str(sub / "sae.safetensors"))
        k = json.loads((sub / "cfg.json").read_text())["k"]
        out.append({"W_enc": w["encoder.weight"], "b_enc": w["encoder.bias"], "W_dec": w["W_dec"],
                    "b_dec": w["b_dec"], "k": k})
    return out


def read_clt(folder: Path, n: int) -> list[dict[str, torch.Tensor]]:
    """circuit-tracer's ``cross_layer_transcoder`` files: ``W_enc_l``, ``b_enc_l``, ``b_dec_l``, ``threshold_l``,
    ``W_dec_l [F, n − l, d]``."""
    out = []
    for layer in range(n):
        e = load_file(str(folder / f"W_enc_{layer}.safetensors"))
        d = load_file(str(folder / f"W_dec_{layer}.safetensors"))
        out.append({"W_enc": e[f"W_enc_{layer}"], "b_enc": e[f"b_enc_{layer}"], "b_dec": e[f"b_dec_{layer}"],
                    "theta": e[f"threshold_{layer}"], "W_dec": d[f"W_dec_{layer}"]})
    return out


class Splicer:
    """Features from block inputs and reconstructions of block outputs, for one kind of dictionary."""

    def __init__(self, kind: str, weights: list[dict]) -> None:
        self.kind, self.w = kind, weights

    def features(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        w = self.w[layer]
        h = x @ w["W_enc"].T + w["b_enc"]
        if self.kind == "clt":
            return h * (h > w["theta"])
        top = h.topk(int(w["k"]), dim=-1)
        return torch.zeros_like(h).scatter(-1, top.indices, torch.relu(top.values))

    def output(self, m: int, acts: dict[int, torch.Tensor]) -> torch.Tensor:
        if self.kind == "clt":
            y = self.w[m]["b_dec"].clone()
            for layer in range(m + 1):
                y = y + acts[layer] @ self.w[layer]["W_dec"][:, m - layer]
            return y
        return acts[m] @ self.w[m]["W_dec"] + self.w[m]["b_dec"]


def run(model, ids: torch.Tensor, splicer: Splicer | None, spliced: set[int], mode: str,
        clean_in: dict[int, torch.Tensor] | None = None):
    """(logits [n, vocab], MLP inputs {block: [n, d]}, MLP outputs {block: [n, d]}, L0 {block: mean}) of one
    forward with ``spliced`` blocks' MLP outputs replaced at positions ``SKIPPED..`` (``mode`` closed: features from
    this forward's inputs; open: from ``clean_in``); the L0 over those positions."""
    ins: dict[int, torch.Tensor] = {}
    outs: dict[int, torch.Tensor] = {}
    acts: dict[int, torch.Tensor] = {}
    l0: dict[int, float] = {}

    def pre(layer):
        def fn(mod, args):
            ins[layer] = x = args[0][0].float()
            if splicer is not None:  # every block's features: a CLT's output m reads blocks 0..m
                acts[layer] = splicer.features(layer, x if mode == "closed" else clean_in[layer])
                l0[layer] = float((acts[layer][SKIPPED:] != 0).sum(-1).float().mean())
        return fn

    def post(layer):
        def fn(mod, args, out):
            if layer in spliced:
                new = splicer.output(layer, acts)[None].to(out.dtype)
                out = torch.cat([out[:, :SKIPPED], new[:, SKIPPED:]], 1)
            outs[layer] = out[0].float()
            return out
        return fn

    handles = [h for layer, block in enumerate(model.model.layers)
               for h in (block.mlp.register_forward_pre_hook(pre(layer)), block.mlp.register_forward_hook(post(layer)))]
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids[None]).logits[0].float()
    finally:
        for h in handles:
            h.remove()
    return logits, ins, outs, l0


def ce(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """The mean next-token CE of positions ``SKIPPED..n − 2``."""
    logp = torch.log_softmax(logits[SKIPPED:-1].double(), -1)
    return float(-logp.gather(1, ids[SKIPPED + 1:, None]).mean())


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """The mean KL(p ‖ q) of positions ``SKIPPED..``."""
    lp, lq = torch.log_softmax(p[SKIPPED:].double(), -1), torch.log_softmax(q[SKIPPED:].double(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def fve(recon: torch.Tensor, target: torch.Tensor) -> float:
    """The FVE of positions ``SKIPPED..``."""
    recon, target = recon[SKIPPED:], target[SKIPPED:]
    err = (target - recon).pow(2).sum()
    return float(1 - err / (target - target.mean(0)).pow(2).sum())


def measure(model, ids: torch.Tensor, dicts: dict[str, Splicer], prefixes: list[int], rows, fves, l0s) -> None:
    """One window's figures into ``rows`` (name -> key -> values), ``fves`` and ``l0s`` (name -> per window ->
    per block)."""
    n = len(model.model.layers)
    clean, clean_in, clean_out, _ = run(model, ids, None, set(), "open")
    for name, sp in dicts.items():
        def add(key: str, v: float, name: str = name) -> None:
            rows[name].setdefault(key, []).append(v)

        add("ce clean", ce(clean, ids))
        acts = {layer: sp.features(layer, clean_in[layer]) for layer in range(n)}
        fves[name].append([fve(sp.output(m, acts), clean_out[m]) for m in range(n)])
        add("L0 clean, mean of blocks",
            statistics.mean(float((a[SKIPPED:] != 0).sum(-1).float().mean()) for a in acts.values()))
        for mode in ("closed", "open"):
            logits, _, _, l0 = run(model, ids, sp, set(range(n)), mode, clean_in)
            add(f"ce {mode}", ce(logits, ids))
            add(f"kl {mode}", kl(clean, logits))
            if mode == "closed":
                l0s[name].append([l0[layer] for layer in range(n)])
                add("L0 closed, mean of blocks", statistics.mean(l0.values()))
        singles = [kl(clean, run(model, ids, sp, {m}, "open", clean_in)[0]) for m in range(n)]
        add("kl single mean", statistics.mean(singles))
        add("kl single max", max(singles))
        add("kl single sum", sum(singles))
        for p in prefixes:
            add(f"ce first {p} closed", ce(run(model, ids, sp, set(range(p)), "closed")[0], ids))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--per-layer", type=Path, required=True)
    ap.add_argument("--clt", type=Path, required=True)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--first", type=int, required=True)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--prefixes", default="1,5,10,20,30")
    ap.add_argument("--fit-json", type=Path)
    a = ap.parse_args()
    import anatomy_cli as anatomy
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.corpus.windows import token_stream
    from anatomy_cli.corpus.windows import windows

    load = os.getloadavg()[0]
    t0 = time.process_time()
    lm = anatomy.load(a.model)
    model, hf = lm.model, lm.tokenizer.hf
    n = len(model.model.layers)
    wins = list(windows(token_stream(open_source(a.corpus).pieces(), hf, eos=hf.eos_token_id), ctx=a.ctx,
                        max_tokens=(a.first + a.windows) * a.ctx))[a.first:]
    dicts = {"per-layer": Splicer("tc", read_per_layer(a.per_layer, n)), "clt": Splicer("clt", read_clt(a.clt, n))}
    prefixes = [int(p) for p in a.prefixes.split(",")]
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in dicts}
    fves: dict[str, list[list[float]]] = {name: [] for name in dicts}
    l0s: dict[str, list[list[float]]] = {name: [] for name in dicts}
    for w in wins:
        measure(model, torch.tensor(w), dicts, prefixes, rows, fves, l0s)
        print(f"window done, {time.process_time() - t0:.0f} CPU s", file=sys.stderr, flush=True)
    print(f"# {len(wins)} windows from {a.first}, load {load:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"{time.process_time() - t0:.0f} CPU s, one thread: {torch.get_num_threads()}")
    for name in dicts:
        print(f"## {name}")
        for key, vals in rows[name].items():
            print(f"{key:>24}: {statistics.mean(vals):.3f}")
        per_block = [statistics.mean(col) for col in zip(*fves[name])]
        print(f"{'fve clean, mean':>24}: {statistics.mean(per_block):.3f} "
              f"(min {min(per_block):.3f} block {per_block.index(min(per_block))})")
        print(f"{'fve per block':>24}: " + " ".join(f"{v:.2f}" for v in per_block))
        closed_l0 = [statistics.mean(col) for col in zip(*l0s[name])]
        print(f"{'L0 closed per block':>24}: " + " ".join(f"{v:.1f}" for v in closed_l0))
        print(f"{'ce closed per window':>24}: " + " ".join(f"{v:.3f}" for v in rows[name]["ce closed"]))
    if a.fit_json is not None:
        fit = json.loads(a.fit_json.read_text())
        h = fit["blocks"][0]["health"]
        print("# the fit's own held-out window:", {k: v for k, v in h.items() if "ce" in k or "kl" in k})


if __name__ == "__main__":
    main()
