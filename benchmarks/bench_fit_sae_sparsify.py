"""`fit-sae`'s TopK training step against sparsify's on the same activations, on the CPU (issue 62 item 2).

    python benchmarks/bench_fit_sae_sparsify.py [--sparsify-python /work/venv-sparsify/bin/python] [--d 576]
        [--d-sae 4608] [--k 32] [--batch 256] [--steps 60] [--rows 16384] [--threads N] [--workdir DIR]
        [--clock perf_counter|process_time] [--anatomy-root DIR ...]

The activations: a seeded synthetic transcoder task of SmolLM2's width (``x = c D + noise``, ``target = c E``, ``c``
sparse: 16 of 4·d ground-truth features per row, exponential magnitudes), saved once to ``DIR/acts.pt``; the last
2,048 rows are held out. Both trainers start from the same coder (anatomy's :class:`TopKCoder` initialisation,
sparsify's parameter names), train a transcoder with the same d_sae, k, batch, learning rate and row order for
``--steps`` steps, each in a fresh process:

  - anatomy: ``engine/sae_fit.py`` ``train``'s step (sparse-backward TopK, fused Adam), within
    ``engine/heap.py``'s ``kept_pages`` as ``train`` runs it (freed memory kept for the next step);
  - sparsify (eai-sparsify in a side venv, default /work/venv-sparsify: ``python3 -m venv /work/venv-sparsify &&
    /work/venv-sparsify/bin/pip install torch==2.13.0 eai-sparsify``): its ``SparseCoder`` (``transcode=True``)
    stepped as its ``Trainer`` steps one (forward to ``fvu``, backward, Adam); its Trainer itself reads a
    transformers model, not activations. Skipped, with one line, where that python is missing.

``--anatomy-root DIR`` (repeatable): also time the anatomy step of another checkout (e.g. ``git worktree add
/tmp/before HEAD~1``), one row each, in the same run.

Figures per side: the median step time after the first two, the held-out FVE after the last step, and the ratio of
the step time to the step's **floor**, the work any exact TopK step with Adam must do, timed here in the same run:

  - the encoder's dense forward, ``2·B·d·F`` FLOPs (one ``B×d @ d×F`` fp32 matmul): every latent's pre-activation
    is needed to choose the k largest. The rest of the arithmetic is ``k/F`` of it (0.7% at the defaults): the
    encoder's weight gradient touches the ``B·k`` chosen rows only (``2·B·k·d``; a dense TopK backward does a
    second ``2·B·d·F`` matmul there, which is why it is not in the floor), the decoder's forward and backward
    ``4·B·k·d``;
  - one fused Adam pass over the ``2·F·d + F + d`` parameters: Adam moves every weight at every step (its moments
    decay even where the gradient is 0), reading the weight, its gradient and two moments and writing three, a
    memory-bound pass that at SmolLM2's width takes longer than the matmul on this CPU.

Both parts are printed, with the ratios to the matmul alone (the figure this benchmark printed before) and to the
whole floor; and the ratio of anatomy's step to sparsify's. On a shared machine a single run is a ratio, not a
figure: the load average before and after is printed, and ``--clock process_time --threads 1`` times each step
and the floor in the process's CPU seconds instead of the wall's (steadier where other processes take the cores;
one thread, so that no OpenMP thread's waiting is counted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELD = 2048

# One process per side: reads the activations and the initial coder, trains, prints one JSON line.
SIDE = r"""
import contextlib, json, statistics, sys, time, torch
side, path, init, steps, batch, lr, k, threads, root, clock = sys.argv[1:11]
clock = getattr(time, clock)
torch.set_num_threads(int(threads))
steps, batch, lr, k = int(steps), int(batch), float(lr), int(k)
acts, start = torch.load(path), torch.load(init)
x, t = acts["x"], acts["target"]
n = x.shape[0] - %(held)d
order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
d_in, d_sae = start["encoder.weight"].shape[1], start["encoder.weight"].shape[0]
kept = contextlib.nullcontext  # as train runs its steps: anatomy's within engine/heap.py's kept_pages
def fve(y, target):
    return float(1 - (y - target).pow(2).sum() / (target - target.mean(0)).pow(2).sum())
if side == "anatomy":
    sys.path.insert(0, root)
    from anatomy_cli.engine import sae_fit
    try:
        from anatomy_cli.engine.heap import kept_pages as kept
    except ImportError:  # an older checkout (--anatomy-root)
        pass
    coder = sae_fit.TopKCoder(d_in, d_sae, k, transcode=True)
    coder.load_state_dict({"encoder.weight": start["encoder.weight"], "encoder.bias": start["encoder.bias"],
                           "W_dec": start["W_dec"], "b_dec": start["b_dec"]})
    opt = getattr(sae_fit, "adam", lambda p, lr: torch.optim.Adam(p, lr=lr))(coder.parameters(), lr)
    def loss(xb, tb):
        return sae_fit.fvu(coder(xb), tb)
    def predict(xb):
        return coder(xb)
else:
    from sparsify import SparseCoder, SparseCoderConfig
    coder = SparseCoder(d_in, SparseCoderConfig(num_latents=d_sae, k=k, transcode=True))
    coder.load_state_dict(start, strict=False)
    opt = torch.optim.Adam(coder.parameters(), lr=lr)
    def loss(xb, tb):
        return coder(xb, tb).fvu
    def predict(xb):
        return coder(xb, xb[:, :0].new_zeros(xb.shape[0], t.shape[1])).sae_out
times = []
with kept():
    for s in range(steps):
        idx = order[(s * batch) %% n:(s * batch) %% n + batch]
        begun = clock()
        value = loss(x.index_select(0, idx), t.index_select(0, idx))  # as train gathers its batch
        value.backward()
        opt.step()
        opt.zero_grad()
        times.append(clock() - begun)
with torch.no_grad():
    held = fve(predict(x[n:]), t[n:])
print(json.dumps({"side": side, "step_s": statistics.median(times[2:]), "fve": held, "last_fvu": float(value)}))
"""


def make_data(workdir: Path, d: int, d_sae: int, k: int, rows: int) -> tuple[Path, Path]:
    """The activations and the initial coder (anatomy's TopKCoder initialisation with the data's centring)."""
    import torch

    from anatomy_cli.engine import sae_fit

    acts, init = workdir / "acts.pt", workdir / f"init-{d}-{d_sae}-{k}.pt"
    gen = torch.Generator().manual_seed(0)
    if not acts.is_file():
        g = 4 * d
        D, E = torch.randn(g, d, generator=gen) / d ** 0.5, torch.randn(g, d, generator=gen) / d ** 0.5
        idx = torch.rand(rows, g, generator=gen).argsort(-1)[:, :16]
        c = torch.zeros(rows, g).scatter(1, idx, torch.empty(rows, 16).exponential_(generator=gen))
        torch.save({"x": c @ D + 0.01 * torch.randn(rows, d, generator=gen), "target": c @ E}, acts)
    if not init.is_file():
        data = torch.load(acts)
        torch.manual_seed(0)
        coder = sae_fit.TopKCoder(d, d_sae, k, transcode=True)
        x, t = data["x"][:-HELD], data["target"][:-HELD]
        coder.encoder.bias.data = -x.mean(0) @ coder.encoder.weight.data.T
        coder.b_dec.data = t.mean(0)
        torch.save({k: v.detach().clone() for k, v in coder.state_dict().items()}, init)
    return acts, init


def _median_seconds(fn: Callable[[], object], clock: Callable[[], float], runs: int = 12) -> float:
    times = []
    for _ in range(runs):
        begun = clock()
        fn()
        times.append(clock() - begun)
    return statistics.median(times[2:])


def floor_seconds(batch: int, d: int, d_sae: int, threads: int, clock: Callable[[], float]) -> tuple[float, float]:
    """(one fp32 ``[batch, d] @ [d, d_sae]`` matmul, one fused Adam step over a TopK coder's parameters with
    their gradients present), median times here now."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(batch, d), torch.randn(d, d_sae)
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((d_sae, d), (d_sae,), (d_sae, d), (d,))]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-4, fused=True)
    return _median_seconds(lambda: a @ b, clock), _median_seconds(opt.step, clock)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sparsify-python", default=os.environ.get("ANATOMY_SPARSIFY_PYTHON",
                                                                    "/work/venv-sparsify/bin/python"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/anatomy-bench-fit-sae"))
    parser.add_argument("--d", type=int, default=576)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--clock", choices=["perf_counter", "process_time"], default="perf_counter",
                        help="process_time with --threads 1: the CPU time, steadier than the wall on a shared machine")
    parser.add_argument("--anatomy-root", type=Path, action="append", default=[],
                        help="another checkout whose anatomy step is timed too (repeatable)")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    acts, init = make_data(args.workdir, args.d, args.d_sae, args.k, args.rows)
    lr = 2e-4 / (args.d_sae / 2**14) ** 0.5
    matmul, adam = floor_seconds(args.batch, args.d, args.d_sae, args.threads, getattr(time, args.clock))
    floor = matmul + adam
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.threads} threads, {args.clock}; "
          f"floor {floor * 1e3:.1f} ms = "
          f"encoder matmul ({args.batch}x{args.d} @ {args.d}x{args.d_sae} fp32) {matmul * 1e3:.1f} ms + one fused "
          f"Adam pass over {2 * args.d_sae * args.d + args.d_sae + args.d:,} parameters {adam * 1e3:.1f} ms")
    print(f"| trainer | step (s) | x matmul | x floor | x sparsify | held-out FVE after {args.steps} steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    sides = [("anatomy", sys.executable, str(ROOT))]
    sides += [(f"anatomy at {root}", sys.executable, str(root.resolve())) for root in args.anatomy_root]
    if Path(args.sparsify_python).is_file():
        sides.insert(0, ("sparsify", args.sparsify_python, str(ROOT)))
    else:
        print(f"sparsify: skipped (no python at {args.sparsify_python}; see this file's docstring)")
    code = SIDE % {"held": HELD}
    reference = None
    for name, python, root in sides:
        proc = subprocess.run([python, "-c", code, name.split()[0], str(acts), str(init), str(args.steps),
                               str(args.batch), str(lr), str(args.k), str(args.threads), root, args.clock],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"| {name} | failed: {proc.stderr.strip().splitlines()[-1:]} | | | | |")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        if name == "sparsify":
            reference = r["step_s"]
        versus = "" if reference is None else f"{r['step_s'] / reference:.2f}"
        print(f"| {name} | {r['step_s']:.4f} | {r['step_s'] / matmul:.1f} | {r['step_s'] / floor:.2f} | {versus} | "
              f"{r['fve']:.3f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
