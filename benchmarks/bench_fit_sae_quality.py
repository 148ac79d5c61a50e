"""`fit-sae --transcoder`'s fit against sparsify's on the same real activations, and its quality against the
training tokens (issue 62 item 2, the quality half). Not in the suite; its figures are in docs/commands/sae.md.

    python benchmarks/bench_fit_sae_quality.py [--model smollm2] [--layers 3,15] [--corpus docs/] [--ctx 64]
        [--held 16] [--tokens 7936,32000,...] [--d-sae 1024] [--k 16] [--batch 256] [--epochs 4] [--lr LR]
        [--sparsify-python /work/venv-sparsify/bin/python] [--workdir DIR]

(1) The corpus is packed into ``--ctx`` windows as ``fit-sae`` packs it; the last ``--held`` windows are held out
(``fit-sae`` holds out one: ``--held`` windows give a steadier figure). The MLP input and output of each block in
``--layers`` (``fit-sae --transcoder``'s sites) are collected once over every window by ``fit-sae``'s own
``sae_fit.collect`` (its rows: each window's positions after the first, ``sae_fit.SKIPPED``; each forward stopped
at the last block read) and saved to ``DIR/acts.pt``, which every trainer reads: the rows are the same floats for
all of them (sparsify's side is handed them as they are). A file collected under another rule is collected again.

(2) Per block and per ``--tokens`` (the first N training tokens: the rows of the first N / ``--ctx`` training
windows, as ``fit-sae --max-tokens`` trains on them), transcoders with the same d_sae, k, batch, epochs and row
order (one ``torch.randperm`` per epoch from seed 0):

  - ``anatomy``: ``engine/sae_fit.py`` ``train`` on :class:`TopKCoder` at ``fit-sae --transcoder``'s learning rate
    (``default_lr(d_sae, scaled=True)``), as ``fit-sae`` trains without sparsify installed;
  - ``anatomy-jumprelu``: the same with ``--activation jumprelu`` (target L0 ``--k``, ``--l0-coeff``,
    ``--bandwidth``), written in SAELens' format;
  - ``sparsify``: eai-sparsify's ``SparseCoder`` (``transcode=True``) in a side venv (``--sparsify-python``),
    stepped as its ``Trainer`` steps it with its defaults (1.3: ``optimizer="signum"``, i.e. SignSGD under
    schedulefree's ``ScheduleFreeWrapper`` with momentum 0.95 at ``5e-3/sqrt(d_sae/2**14)``, the biases set
    from the first batch's means, the schedule-free average swapped in before ``save_to_disk`` as
    ``Trainer._checkpoint`` does); ``sparsify-adam``: its ``optimizer="adam"`` (Adam at ``2e-4/sqrt(d_sae/2**14)``
    with transformers' linear warm-up over ``min(1000, steps)`` steps and decay to 0, as the Trainer schedules it;
    its default warm-up, 1,000 steps, is longer than these fits). Skipped where that python is missing.

(3) Every written folder is read back as ``anatomy sae`` reads it (``models/sae/read.py``, ``engine/sae.py``
``Dictionary``): its FVE and mean L0 over all held-out rows pooled, and the means of the spliced CE and KL (nats)
over the first ``--kl-windows`` held-out windows (``splice_run``, ``analyses/sae.py`` ``health``: three forwards a
window), each window's first position left as the model computes it and out of the figures, as ``fit-sae``'s
held-out check does. One line per (block, tokens, trainer), then a table; the training's CPU seconds
(``time.process_time``, one thread) and the load average before and after.
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
sys.path.insert(0, str(ROOT))

# sparsify's side: one process per fit; prints one JSON line.
SPARSIFY = r"""
import json, math, sys, time, torch
acts_path, layer, n, d_sae, k, batch, epochs, opt_name, folder = sys.argv[1:10]
layer, n, d_sae, k, batch, epochs = int(layer), int(n), int(d_sae), int(k), int(batch), int(epochs)
torch.set_num_threads(1)
from sparsify import SparseCoder, SparseCoderConfig
acts = torch.load(acts_path)
x, t = acts["x"][layer][:n], acts["target"][layer][:n]
torch.manual_seed(0)
sae = SparseCoder(x.shape[1], SparseCoderConfig(num_latents=d_sae, k=k, transcode=True))
steps = epochs * math.ceil(n / batch)
if opt_name == "signum":
    from schedulefree import ScheduleFreeWrapper
    from sparsify.sign_sgd import SignSGD
    lr = 5e-3 / (d_sae / 2**14) ** 0.5
    opt = ScheduleFreeWrapper(SignSGD([dict(params=sae.parameters(), lr=lr)]), momentum=0.95)
    opt.train()
    sched = None
else:
    from transformers import get_linear_schedule_with_warmup
    lr = 2e-4 / (d_sae / 2**14) ** 0.5
    opt = torch.optim.Adam([dict(params=sae.parameters(), lr=lr)])
    sched = get_linear_schedule_with_warmup(opt, min(1000, steps), steps)
g = torch.Generator().manual_seed(0)
curve, fired, start = [], torch.zeros(d_sae, dtype=torch.bool), time.process_time()
for epoch in range(epochs):
    if epoch == epochs - 1:
        fired.zero_()
    order = torch.randperm(n, generator=g)
    for s in range(0, n, batch):
        idx = order[s:s + batch]
        xb, tb = x[idx], t[idx]
        if not curve:  # the Trainer's first step: centred pre-activations, b_dec the target's mean
            with torch.no_grad():
                sae.encoder.bias.data = -xb.mean(0) @ sae.encoder.weight.data.T
                sae.b_dec.data = tb.mean(0)
        res = sae(xb, tb)
        res.fvu.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        curve.append(float(res.fvu.detach()))
        fired[res.latent_indices.flatten()] = True
if opt_name == "signum":
    opt.eval()
sae.save_to_disk(folder)
print(json.dumps({"steps": len(curve), "fvu_first": curve[0], "fvu_last": sum(curve[-10:]) / len(curve[-10:]),
                  "dead_fraction": 1 - float(fired.float().mean()), "cpu_seconds": time.process_time() - start,
                  "lr": lr}))
"""


def load_avg() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def collect(args: argparse.Namespace, path: Path) -> None:
    """The windows of ``args.corpus`` and every chosen block's MLP input and output over them (``fit-sae``'s rows:
    ``sae_fit.collect``), to ``path``."""
    import torch

    import anatomy_cli as anatomy
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.corpus.windows import token_stream
    from anatomy_cli.corpus.windows import windows
    from anatomy_cli.engine import sae_fit
    from anatomy_cli.models import sites

    lm = anatomy.load(args.model)
    hf = lm.tokenizer.hf
    bos = hf.bos_token_id if lm.info.add_bos and hf.bos_token_id is not None else None
    wins = list(windows(token_stream(open_source(args.corpus).pieces(), hf, eos=hf.eos_token_id), ctx=args.ctx,
                        bos=bos, max_tokens=args.max_tokens))
    wins = [w for w in wins if len(w) == args.ctx]  # whole windows only (the last may be short)
    points = [sites.hook_name(layer, s) for layer in args.layers for s in (sites.Site.mlp_in, sites.Site.mlp_out)]
    start = time.process_time()
    acts = sae_fit.collect(lm, wins, points)
    print(f"collected {len(wins)} windows of {args.ctx} ({len(wins) * args.ctx} tokens, {len(acts[0])} rows) at "
          f"{len(points)} points: {time.process_time() - start:.0f} CPU s, load {load_avg()}", file=sys.stderr)
    train_rows = sae_fit.rows(wins[:-args.held])
    torch.save({"windows": wins, "held": args.held, "train_rows": train_rows, "skipped": sae_fit.SKIPPED,
                "x": {layer: acts[2 * i][:train_rows].clone() for i, layer in enumerate(args.layers)},
                "target": {layer: acts[2 * i + 1][:train_rows].clone() for i, layer in enumerate(args.layers)},
                "x_held": {layer: acts[2 * i][train_rows:].clone() for i, layer in enumerate(args.layers)},
                "target_held": {layer: acts[2 * i + 1][train_rows:].clone() for i, layer in enumerate(args.layers)}},
               path)


def collected_now(acts: dict) -> bool:
    """``acts`` (a saved ``acts.pt``) holds the rows ``sae_fit.collect`` gives now (an older file kept position 0)."""
    from anatomy_cli.engine import sae_fit

    return acts.get("skipped") == sae_fit.SKIPPED and "x_held" in acts


def training_rows(acts: dict, tokens: str, ctx: int) -> tuple[int, int]:
    """(the tokens, the rows) of the first ``tokens`` training tokens in whole windows (``all``: every training
    window)."""
    from anatomy_cli.engine import sae_fit

    train_windows = acts["windows"][:-acts["held"]]
    chosen = train_windows if tokens == "all" else train_windows[:int(tokens) // ctx]
    return sum(map(len, chosen)), sae_fit.rows(chosen)


def fit_anatomy(acts: dict, layer: int, n: int, args: argparse.Namespace, out: Path, *, jumprelu: bool) -> dict:
    """anatomy's transcoder as ``fit-sae --transcoder`` trains it (``jumprelu``: ``--activation jumprelu``, its
    target L0 ``--k``, written in SAELens' format), at fit-sae's learning rate unless ``--lr``."""
    import torch

    from anatomy_cli.engine import sae_fit

    torch.manual_seed(0)
    jump = {"bandwidth": args.bandwidth, "l0_coeff": args.l0_coeff} if jumprelu else None
    coder = sae_fit.make_coder(acts["x"][layer].shape[1], args.d_sae, args.k, transcode=True, use_sparsify=False,
                               jumprelu=jump)
    start = time.process_time()
    trained = sae_fit.train(acts["x"][layer][:n], acts["target"][layer][:n], coder, epochs=args.epochs,
                            batch=args.batch, lr=args.lr or sae_fit.default_lr(args.d_sae, scaled=True))
    cpu = time.process_time() - start
    if jumprelu:
        sae_fit.save_saelens(coder, out, hook=f"blocks.{layer}.mlp.hook_in", hook_out=f"blocks.{layer}.hook_mlp_out",
                             model_name=args.model)
    else:
        sae_fit.save_sparsify(coder, out)
    curve = trained["fvu"]
    return {"steps": trained["steps"], "fvu_first": curve[0], "fvu_last": sum(curve[-10:]) / len(curve[-10:]),
            "dead_fraction": 1 - float(trained["fired"].float().mean()), "cpu_seconds": cpu}


def fit_sparsify(acts_path: Path, layer: int, n: int, args: argparse.Namespace, opt: str, out: Path) -> dict:
    cmd = [args.sparsify_python, "-c", SPARSIFY, str(acts_path), str(layer), str(n), str(args.d_sae), str(args.k),
           str(args.batch), str(args.epochs), opt, str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"sparsify's fit failed:\n{done.stderr[-3000:]}")
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def held_out(lm, folder: Path, layer: int, acts: dict, kl_windows: int) -> dict:
    """The folder read as ``sae`` reads it: its FVE on every held-out row (pooled), and spliced into the first
    ``kl_windows`` held-out windows (``splice_run``, three forwards each, positions from ``sae_fit.SKIPPED`` on), the
    mean next-token CE and KL."""
    import torch

    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine import sae_fit
    from anatomy_cli.models.sae import read

    d = engine_sae.Dictionary(read.read(folder), lm.device)
    x, t = acts["x_held"][layer], acts["target_held"][layer].double()
    with torch.inference_mode():
        feats = d.encode(x)
        r = d.decode(feats, x).double()
    l0 = float((feats != 0).sum(-1).float().mean())
    fve = 1 - float((t - r).pow(2).sum() / (t - t.mean(0)).pow(2).sum())
    wins = acts["windows"][-acts["held"]:][:kl_windows]
    ce = ce_clean = kl = 0.0
    for w in wins:  # fit-sae's held-out check: the first positions as the model computes them, and no figure
        splice = engine_sae.splice_run(lm, list(w), d, skip=sae_fit.SKIPPED)
        h = analysis.health(splice, list(w)[sae_fit.SKIPPED:], None)
        ce, ce_clean, kl = ce + h.ce_spliced_nats, ce_clean + h.ce_clean_nats, kl + h.kl_spliced_nats
    n = max(1, len(wins))
    return {"fve": fve, "l0": l0, "ce_clean": ce_clean / n, "ce_spliced": ce / n, "kl": kl / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--layers", default="3,15", type=lambda s: [int(v) for v in s.split(",")])
    p.add_argument("--corpus", default=str(ROOT / "docs"))
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--held", type=int, default=16)
    p.add_argument("--kl-windows", type=int, default=8, help="held-out windows the spliced CE/KL is measured on")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--tokens", default="7936",
                   help="training tokens per fit (whole windows; their rows, each window's first position left out), "
                        "comma-separated ('all': every one)")
    p.add_argument("--d-sae", type=int, default=1024)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--trainers", default="anatomy,sparsify,sparsify-adam",
                   help="anatomy (TopK), anatomy-jumprelu (target L0 --k), sparsify, sparsify-adam")
    p.add_argument("--l0-coeff", type=float, default=1.0, help="anatomy-jumprelu: fit-sae's --l0-coeff")
    p.add_argument("--bandwidth", type=float, default=0.05, help="anatomy-jumprelu: fit-sae's --bandwidth")
    p.add_argument("--sparsify-python", default="/work/venv-sparsify/bin/python")
    p.add_argument("--workdir", default="/tmp/bench_fit_sae_quality")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    acts_path = work / "acts.pt"
    if not acts_path.exists() or not collected_now(torch.load(acts_path, mmap=True)):
        collect(args, acts_path)
    acts = torch.load(acts_path, mmap=True)  # all of docs/: 2 GB
    import anatomy_cli as anatomy

    lm = anatomy.load(args.model)
    held = acts["windows"][-acts["held"]:]
    trainers = args.trainers.split(",")
    if not Path(args.sparsify_python).exists():
        print(f"no {args.sparsify_python}: sparsify skipped", file=sys.stderr)
        trainers = [t for t in trainers if not t.startswith("sparsify")]
    print(f"train rows {acts['train_rows']}, held out {len(held)} windows of {args.ctx} "
          f"({len(acts['x_held'][args.layers[0]])} rows); load {load_avg()}", file=sys.stderr)
    rows = []
    for tokens in args.tokens.split(","):
        n_tokens, n = training_rows(acts, tokens, args.ctx)
        for layer in args.layers:
            for trainer in trainers:
                out = work / f"{trainer}-{n}" / f"layers.{layer}.mlp"
                if trainer.startswith("anatomy"):
                    fit = fit_anatomy(acts, layer, n, args, out, jumprelu=trainer == "anatomy-jumprelu")
                else:
                    fit = fit_sparsify(acts_path, layer, n, args, trainer.partition("-")[2] or "signum", out)
                row = {"layer": layer, "tokens": n_tokens, "rows": n, "trainer": trainer, **fit,
                       **held_out(lm, out, layer, acts, args.kl_windows), "load": load_avg()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("| block | tokens | rows | trainer | steps | fvu_last | dead | held-out L0 | held-out FVE | CE spliced "
          "(clean) | KL | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['tokens']:,} | {r['rows']:,} | {r['trainer']} | {r['steps']} | "
              f"{r['fvu_last']:.3f} | {r['dead_fraction']:.0%} | {r['l0']:.1f} | {r['fve']:.3f} | "
              f"{r['ce_spliced']:.3f} ({r['ce_clean']:.3f}) | {r['kl']:.3f} | {r['cpu_seconds']:.1f} |")


if __name__ == "__main__":
    main()
