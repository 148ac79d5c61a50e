"""`anatomy serve` under load (issue 27): 32 concurrent client processes, mixed commands over two tiny models.

    python benchmarks/bench_serve_load.py [--clients 32] [--rounds 4] [--workdir DIR]

Each of ``--clients`` threads starts real `anatomy` client processes one after another (``--rounds`` each),
all at once against one server holding a tiny GPT-2 and a tiny Llama. Every answer (exit code and stdout) is
compared with its in-process twin, computed in this process with the server out of the way. Reported:
requests, lost (no answer or another exit code), different (stdout differs), the p50/p95/max latency of a
request (client spawn to exit) and the throughput, beside one client alone (the same commands back to back).
Prints a markdown table for docs/serve.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench


def tiny_llama(out: Path) -> Path:
    """A random 2-layer Llama (d_model 64) with GPT-2's tokenizer, saved with save_pretrained; reused."""
    import torch
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    from anatomy_cli.models.model_files import gpt2_tokenizer

    if (out / "model.safetensors").exists():
        return out
    config = LlamaConfig(vocab_size=50257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=50256, eos_token_id=50256)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    gpt2_tokenizer().save_pretrained(out)
    return out


def mixed(model: Path) -> list[tuple[list[str], str | None]]:
    m = ["--model", str(model)]
    return [(["trace", "Thank you very", *m, "--format", "json"], None),
            (["next", "The capital of France is", *m, "--k", "3"], None),
            (["next", "-", *m, "--format", "jsonl"], "Thank you very\nOne, two, three,\n"),
            (["tokens", "Hello world", *m], None),
            (["drift", "bank", *m, "--format", "json"], None),
            (["lens", "The cat sat on the", *m, "--format", "csv"], None),
            (["trace", "a b c d", *m, "--position", "1"], None),
            (["next", "x", *m, "--target", "much more"], None)]   # a usage error: exit 2, one line


def twin(args: list[str], stdin: str | None) -> tuple[int, str]:
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    result = CliRunner().invoke(app, args, input=stdin)
    return result.exit_code, result.stdout


def client(args: list[str], stdin: str | None, env: dict) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([bench.PYTHON, "-m", "anatomy_cli", *args], input=stdin or "", capture_output=True,
                              text=True, env=env, timeout=1200)
    except subprocess.TimeoutExpired:  # counted as lost
        return time.perf_counter() - t0, -1, ""
    return time.perf_counter() - t0, proc.returncode, proc.stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="anatomy-serve-load-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o700)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TIKTOKEN_CACHE_DIR": str(work / "tiktoken")}
    env.pop("ANATOMY_SERVER", None)
    bench.seed_tiktoken(work / "tiktoken")
    os.environ.update(env)
    models = [bench.make_checkpoint("tiny", work / "gpt2-tiny", print)[0], tiny_llama(work / "llama-tiny")]
    jobs = [job for model in models for job in mixed(model)]
    twins = {tuple(a): twin(a, s) for a, s in jobs}

    from anatomy_cli.serve import lifecycle
    from anatomy_cli.serve import protocol

    sock = work / "run" / "anatomy.sock"
    log = work / "server.log"
    pid = lifecycle.detach(["serve", "--socket", str(sock), *[x for m in models for x in ("--model", str(m))]],
                           sock, log)
    senv = {**env, protocol.ENV_SOCKET: str(sock)}
    try:
        while any(m["state"] != "ready" for m in protocol.request(sock, {"op": "status"})["models"]):
            time.sleep(0.2)
        for a, s in jobs:  # warm: the tokenizer caches, the first forward of each command
            client(a, s, senv)
        alone = [client(a, s, senv)[0] for a, s in jobs]
        results: list[tuple[list[str], float, int, str]] = []
        lock = threading.Lock()

        def one_client(i: int) -> None:
            for r in range(args.rounds):
                a, s = jobs[(i + r) % len(jobs)]
                seconds, code, out = client(a, s, senv)
                with lock:
                    results.append((a, seconds, code, out))

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one_client, range(args.clients)))
        wall = time.perf_counter() - t0
        requests = protocol.request(sock, {"op": "status"})["requests"]
    finally:
        lifecycle.stop(sock)
    lost = sum(code != twins[tuple(a)][0] for a, _, code, _ in results)
    different = sum(code == twins[tuple(a)][0] and out != twins[tuple(a)][1] for a, _, code, out in results)
    latencies = [s for _, s, _, _ in results]
    print(f"\nmachine: {bench.machine()} · load average {bench.loadavg()} · server pid {pid}\n")
    print("| figure | value |\n| --- | --- |")
    rows = [("clients at once × requests each", f"{args.clients} × {args.rounds} = {len(results)} "
             f"({len(jobs)} distinct commands over a tiny GPT-2 and a tiny Llama)"),
            ("answered by the server", f"{requests - 2 * len(jobs)} of {len(results)}"),
            ("lost (no answer, or another exit code than in-process)", str(lost)),
            ("stdout different from the in-process twin", str(different)),
            ("latency p50 / p95 / max (client spawn to exit)",
             f"{percentile(latencies, 0.5):.2f} s / {percentile(latencies, 0.95):.2f} s / {max(latencies):.2f} s"),
            ("throughput", f"{len(results) / wall:.1f} requests/s ({wall:.1f} s in all)"),
            ("one client alone, p50 / p95", f"{percentile(alone, 0.5):.2f} s / {percentile(alone, 0.95):.2f} s")]
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0 if lost == 0 and different == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
