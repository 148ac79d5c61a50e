"""`anatomy circuit` against circuit-tracer 0.5.0 on the same SmolLM2 graph, on the CPU (issue 49).

    python benchmarks/bench_circuit.py [--ct-python .venv-ct/bin/python] [--workdir DIR] [--features 256]
        [--max-feature-nodes 256] [--batch-size 32] [--runs 1]

Both sides run as fresh processes, one after the other, on the same inputs: the directory `anatomy convert` makes of
the SmolLM2-135M-Instruct GGUF (Q4_1 dequantized to fp32), seeded random per-layer transcoders in circuit-tracer's
`transcoder_set` layout (tests/reference/circuit_tracer_ref.py `write`; F features per block, JumpReLU on even blocks),
the prompt "The capital of France is" with circuit-tracer's BOS, `max_feature_nodes`, `batch_size`, and the defaults
of both (10 logits / p 0.95, re-ranking every 4 batches, pruning 0.8 / 0.98):
  - circuit-tracer: `circuit_tracer_ref.py attribute` (ReplacementModel with the nnsight backend, `attribute(...)`,
    `Graph.to_pt`, `prune_graph`, `compute_graph_scores`, `create_graph_files`), in its own venv (transformers 4.57.3);
  - anatomy: `python -m anatomy_cli circuit PROMPT --model DIR --transcoders DIR --bos ... --out graph.pt --json F`.
Figures: each process's wall time end to end (imports, model load, attribution, files written) and its peak resident
memory (`os.wait4`'s ru_maxrss of that process alone); circuit-tracer's own time inside `attribute(...)` beside.
Targets (the issue): anatomy not slower, peak memory within 1.5x. Prints one markdown row per run and the ratios, with
the load average before and after: on a shared machine a single run is a ratio, not a figure.
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
REF = ROOT / "tests" / "reference" / "circuit_tracer_ref.py"
PROMPT = "The capital of France is"


def peak_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of ``cmd`` run to its end; waited with ``os.wait4``, so the rusage is
    this child's alone (RUSAGE_CHILDREN would be the largest of all children so far)."""
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: a full stderr pipe would stall the child
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})})
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode:
            err.seek(0)
            sys.exit(f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{err.read()[-3000:]}")
    return wall, usage.ru_maxrss / 1024, out


def prepare(workdir: Path, ct_python: str, features: int) -> tuple[Path, Path]:
    model = workdir / "smollm2-hf"
    if not (model / "model.safetensors").is_file():
        subprocess.run([sys.executable, "-m", "anatomy_cli", "convert", "smollm2", "--to", str(model),
                        "--overwrite"], check=True)
    transcoders = workdir / "ct" / "transcoders"
    if not (transcoders / "config.yaml").is_file():
        subprocess.run([ct_python, str(REF), "write", "--model", str(model), "--out", str(workdir / "ct"),
                        "--features", str(features), "--seed", "0"], check=True)
    return model, transcoders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ct-python", default=os.environ.get("ANATOMY_CT_PYTHON", str(ROOT / ".venv-ct/bin/python")))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/anatomy-bench-circuit"))
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--max-feature-nodes", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    if not Path(args.ct_python).is_file():
        sys.exit(f"no circuit-tracer python at {args.ct_python}: build .venv-ct as .ci/run does, or --ct-python")
    args.workdir.mkdir(parents=True, exist_ok=True)
    model, transcoders = prepare(args.workdir, args.ct_python, args.features)
    common = ["--max-feature-nodes", str(args.max_feature_nodes), "--batch-size", str(args.batch_size)]
    ct_cmd = [args.ct_python, str(REF), "attribute", "--model", str(model), "--out", str(args.workdir / "ct"),
              "--prompt", PROMPT, *common]
    ours_dir = args.workdir / "anatomy"
    ours_dir.mkdir(exist_ok=True)
    ours_cmd = [sys.executable, "-m", "anatomy_cli", "circuit", PROMPT, "--model", str(model), "--transcoders",
                str(transcoders), "--bos", *common, "--out", str(ours_dir / "graph.pt"), "--json",
                str(ours_dir / "graph.json"), "--format", "json"]
    load_before = os.getloadavg()
    rows = []
    for run in range(args.runs):
        ct_wall, ct_rss, ct_out = peak_child(ct_cmd)
        inside = json.loads(ct_out.strip().splitlines()[-1])
        our_wall, our_rss, _ = peak_child(ours_cmd, env={"PYTHONPATH": str(ROOT)})
        rows.append((ct_wall, ct_rss, inside["attribute_s"], our_wall, our_rss))
        print(f"| run {run + 1} | {our_wall:.1f} s | {ct_wall:.1f} s (attribute {inside['attribute_s']:.1f} s) | "
              f"{our_wall / ct_wall:.2f} | {our_rss:.0f} MB | {ct_rss:.0f} MB | {our_rss / ct_rss:.2f} |", flush=True)
    load_after = os.getloadavg()
    best = min(rows, key=lambda r: r[3])
    print(json.dumps({"time_ratio": best[3] / best[0], "memory_ratio": best[4] / best[1],
                      "load_before": load_before, "load_after": load_after, "features": args.features,
                      "max_feature_nodes": args.max_feature_nodes, "batch_size": args.batch_size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
