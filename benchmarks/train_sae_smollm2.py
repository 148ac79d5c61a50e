"""Train a small TopK SAE with EleutherAI sparsify on `anatomy corpus --save-activations` output, then read it
back with `anatomy sae` (not in the suite; its figures are in docs/commands/sae.md).

    python benchmarks/train_sae_smollm2.py [--out DIR] [--layer 15] [--max-tokens 40000] [--d-sae 4096] [--k 32]
        [--epochs 8] [--sae-python PYTHON]         # in anatomy's environment, with pip install -e '.[train]'
    python benchmarks/train_sae_smollm2.py --smoke                   # tiny sizes: checks that it runs

Three steps, each a process: (1) `anatomy corpus docs/ --model smollm2 --save-activations
blocks.L.hook_resid_post --out DIR/run` (with --no-lens: only the forward is needed); (2) the training, run by
the Python of an environment where sparsify is installed (`train` below: this file's own function, importing
nothing from anatomy): sparsify's SparseCoder on every saved row, Adam on sparsify's FVU loss, as its Trainer
does (decoder rows kept at unit norm), saved with SparseCoder.save_to_disk to DIR/sae/layers.L; (3) `anatomy
sae PROMPT --sae DIR/sae/layers.L --model smollm2 --format json` on a paragraph of docs/corpus.md. Prints one
JSON object: sizes, seconds per step, the training's last FVU and the health section.

sparsify's Trainer computes activations from a model as it trains; it has no reader for saved activations, so
the loop is written here (the same lines as docs/corpus.md shows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(run: str, site: str, out: str, d_sae: int, k: int, epochs: int, batch: int = 1024) -> dict:
    """Train a TopK SAE (sparsify) on the activations at ``site`` saved under ``run``; save it to ``out``."""
    import glob

    import torch
    from safetensors.torch import load_file
    from sparsify import SparseCoder
    from sparsify import SparseCoderConfig

    torch.manual_seed(0)
    files = sorted(glob.glob(f"{run}/activations/{site}/shard-*.safetensors"))
    x = torch.cat([load_file(f)["activations"] for f in files]).float()       # [tokens, d_model]
    sae = SparseCoder(x.shape[1], SparseCoderConfig(num_latents=d_sae, k=k))
    sae.b_dec.data = x.mean(0)
    opt = torch.optim.Adam(sae.parameters(), lr=2e-4 / (d_sae / 2**14) ** 0.5)  # sparsify's default lr
    fvu = []
    for _ in range(epochs):
        for xb in x[torch.randperm(len(x))].split(batch):
            loss = sae(xb).fvu
            loss.backward()
            sae.remove_gradient_parallel_to_decoder_directions()
            opt.step()
            opt.zero_grad()
            sae.set_decoder_norm_to_unit_norm()
            fvu.append(float(loss))
    sae.save_to_disk(out)
    return {"tokens": len(x), "d_in": x.shape[1], "steps": len(fvu), "last_fvu": sum(fvu[-10:]) / len(fvu[-10:])}


def _prompt() -> str:
    """The first paragraph of docs/corpus.md after its title."""
    text = (ROOT / "docs" / "corpus.md").read_text().split("\n\n")
    return " ".join(text[1].split())


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/anatomy-sae-bench")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=40000)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--d-sae", type=int, default=4096)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--sae-python", default=sys.executable,
                    help="a Python with eai-sparsify (default this one: pip install -e '.[train]')")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (2,048 tokens, d_sae 256, one epoch)")
    return ap


def main() -> None:
    a = parser().parse_args()
    found = subprocess.run([a.sae_python, "-c", "import sparsify"], capture_output=True)
    if found.returncode != 0:
        sys.exit(f"error: {a.sae_python} cannot import sparsify: pass --sae-python PYTHON, or run "
                 "`pip install -e '.[train]'` in this environment (anatomy fit-sae trains without it)")
    if a.smoke:
        a.max_tokens, a.d_sae, a.epochs, a.out = 2048, 256, 1, a.out + "-smoke"
    out, site = Path(a.out), f"blocks.{a.layer}.hook_resid_post"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seconds = {}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "anatomy_cli", "corpus", str(ROOT / "docs"), "--model", a.model,
                    "--ctx", str(a.ctx), "--max-tokens", str(a.max_tokens), "--no-lens", "--save-activations", site,
                    "--out", str(out / "run"), "--format", "json"], env=env, check=True, stdout=subprocess.DEVNULL)
    seconds["corpus"] = time.perf_counter() - t
    t = time.perf_counter()
    sae_dir = out / "sae" / f"layers.{a.layer}"
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import train_sae_smollm2 as b; "
            f"print(json.dumps(b.train({str(out / 'run')!r}, {site!r}, {str(sae_dir)!r}, {a.d_sae}, {a.k}, "
            f"{a.epochs})))")
    trained = json.loads(subprocess.run([a.sae_python, "-c", code], check=True, capture_output=True,
                                        text=True).stdout.splitlines()[-1])
    seconds["train"] = time.perf_counter() - t
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "anatomy_cli", "sae", _prompt(), "--model", a.model, "--sae",
                          str(sae_dir), "--format", "json"], env=env, check=True, capture_output=True, text=True)
    seconds["sae"] = time.perf_counter() - t
    data = json.loads(res.stdout)
    print(json.dumps({"model": a.model, "site": site, "ctx": a.ctx, "d_sae": a.d_sae, "k": a.k,
                      "epochs": a.epochs, "training": trained, "seconds": seconds,
                      "prompt_tokens": len(data["health"]["l0"]), "health": data["health"],
                      "warnings": data.get("warnings", [])}, indent=1))


if __name__ == "__main__":
    main()
