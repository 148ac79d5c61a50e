"""`explain`'s time per feature against the cost it prints before it starts (issue 60, Tests and benchmark).

    python benchmarks/bench_explain.py [--model smollm2] [--explain 2] [--max-new-tokens 32]

On the model (the subject, the explainer and the scorer at once, as docs/commands/explain.md's example), each
command the CLI in a fresh process with ``--format json``:

1. a random TopK dictionary (64 features, k 4, at block 3's output; written here, seeded) and
   ``features DICT --corpus docs/ --max-tokens 2000 --ctx 64 --out DIR --delphi DIR/latents``;
2. ``explain DIR --max-features N --test 3 --non-activating 3 --shown 6`` (one scorer prompt per scorer and
   explanation: 4 per feature), stderr read as it comes, each line stamped.

Printed, as a markdown row: the load average before and after, the features run's wall time, and for explain:
when its cost line came (seconds from launch: Python's start, the model's load and the first prompt's prefill
and 5 new tokens), the cost it printed (``per_feature_s``, ``total_s``: an upper bound, every explanation taken as
--max-new-tokens long and every scorer answer 32 tokens), the time per feature measured after the line ((wall −
line) / features) and the ratio measured / printed. The numbers of a run are in docs/commands/explain.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def dictionary(folder: Path, d_in: int = 576, d_sae: int = 64, k: int = 4, block: int = 3) -> Path:
    """A random SAELens TopK SAE (decoder = encoder transposed), seeded."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    w = rng.normal(size=(d_in, d_sae)).astype(np.float32) / np.sqrt(d_in)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"W_enc": w, "b_enc": np.zeros(d_sae, np.float32), "W_dec": np.ascontiguousarray(w.T),
               "b_dec": np.zeros(d_in, np.float32)}, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": d_in, "d_sae": d_sae, "dtype": "float32", "architecture": "topk", "k": k,
           "apply_b_dec_to_input": False, "normalize_activations": "none",
           "metadata": {"hook_name": f"blocks.{block}.hook_resid_post", "prepend_bos": False, "context_size": 64}}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "anatomy_cli", *args, "--format", "json", "--no-server"]


def stamped(cmd: list[str]) -> tuple[float, str, list[tuple[float, str]]]:
    """``(wall, stdout, [(seconds from launch, stderr line)])``; exits on failure."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.PIPE, text=True, env=ENV)
        lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in proc.stderr or ()]
        proc.wait()
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read()
    if proc.returncode:
        sys.exit(f"{cmd[3]} failed:\n" + "\n".join(line for _, line in lines[-30:]))
    return wall, text, lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--explain", type=int, default=2, help="features explained")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_explain."))
    sae, feats = dictionary(tmp / "sae"), tmp / "feats"
    load0 = os.getloadavg()[0]
    f_wall, _, _ = stamped(cli("features", str(sae), "--corpus", "docs/", "--model", args.model, "--max-tokens",
                               "2000", "--ctx", "64", "--out", str(feats), "--delphi", str(feats / "latents")))
    e_wall, text, lines = stamped(cli("explain", str(feats), "--explainer", args.model, "--max-features",
                                      str(args.explain), "--test", "3", "--non-activating", "3", "--shown", "6",
                                      "--max-new-tokens", str(args.max_new_tokens)))
    load1 = os.getloadavg()[0]
    cost = json.loads(text)["cost"]
    at = next(t for t, line in lines if "per feature about" in line)
    measured = (e_wall - at) / cost["features"]
    print("| model | load before → after | features (wall) | explain (wall) | cost line at | printed per feature "
          "(all) | measured per feature after the line | measured / printed |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.model} | {load0:.1f} → {load1:.1f} | {f_wall:.0f} s | {e_wall:.0f} s | {at:.0f} s | "
          f"{cost['per_feature_s']:.0f} s ({cost['total_s']:.0f} s) | {measured:.0f} s | "
          f"{measured / cost['per_feature_s']:.2f} |")
    print(next(line for _, line in lines if "per feature about" in line))


if __name__ == "__main__":
    main()
