"""anatomy's cost against hand-written transformers code, measured side by side (issue 8).

    python benchmarks/run.py                       # small + medium, 5 runs, writes docs/performance.md
    python benchmarks/run.py --quick               # small only, 3 runs, 64 batch prompts
    python benchmarks/run.py --sizes tiny --runs 1 --warmup 0 --max-wait 0 --out /tmp/perf.md   # smoke

Creates full-size random GPT-2 checkpoints (save_pretrained, with the real GPT-2
tokenizer built from the package's anatomy_cli/data/gpt2) in a temporary directory (``--workdir`` keeps
them), then times each anatomy command and its baseline (``benchmarks/baseline.py``)
alternately: ``--warmup`` unrecorded runs of each, then ``--runs`` recorded pairs; the
table shows medians. Subprocess figures are wall-clock seconds from spawn to exit; peak
RSS is ``/usr/bin/time``'s maximum resident set size of the command.
Every subprocess gets the same environment: offline, a tiktoken cache seeded from the
shared files, and bytecode caching on (PYTHONDONTWRITEBYTECODE removed: as after ``pip install``).

Figures, as named by ``--skip``: e2e (1. end to end, and 6. peak RSS of those runs), inproc (2.),
cold (3.), params (4.), params70b (4b/4c), batch (5.). Targets and results: docs/performance.md.
Before each recorded sample the driver waits (``--max-wait``) until other processes leave
the CPUs idle: on a shared 2-core machine torch's threads slow down many times over otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT2_BPE = ROOT / "anatomy_cli" / "data" / "gpt2"  # GPT-2's BPE files, shipped in the package
BASELINE = Path(__file__).resolve().with_name("baseline.py")
PYTHON = sys.executable
# The console script next to this Python (as a user runs it), else the module.
_SCRIPT = shutil.which("anatomy", path=str(Path(PYTHON).parent))
ANATOMY = [_SCRIPT] if _SCRIPT else [PYTHON, "-m", "anatomy_cli"]

# GPT-2 shapes; "tiny" only keeps the smoke test fast (real vocabulary, tiny width).
SIZES = {
    "tiny": dict(n_embd=64, n_layer=2, n_head=2),
    "small": dict(n_embd=768, n_layer=12, n_head=12),
    "medium": dict(n_embd=1024, n_layer=24, n_head=16),
}
LLAMA_70B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=8192, num_hidden_layers=80,
                 intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                 max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)
TRACE_PROMPT = "The old lighthouse keeper climbed the stairs every evening to light the lamp, and"
SHORT_PROMPT = "Thank you very"
_TIKTOKEN_URLS = {
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}
_WORDS = ("time year people way day man thing woman life child world school state family student group country "
          "problem hand part place case week company system program question work government number night point "
          "home water room mother area money story fact month lot right study book eye job word business issue "
          "side kind head house service friend father power hour game line end member law car city community name "
          "president team minute idea kid body information back parent face others level office door health "
          "person art war history party result change morning reason research girl guy moment air teacher force "
          "education foot boy age policy music market sense nation plan college interest death experience effect "
          "class control care field development role effort rate heart drug show leader light voice wife police "
          "mind price report decision son view relationship town road arm difference value building action model "
          "season society tax director position player record paper space ground form event official matter "
          "center couple site project activity star table need court oil situation cost industry figure street "
          "image phone data picture practice piece land product doctor wall patient worker news test movie north "
          "love support technology step baby computer type attention film tree source organization hair window "
          "evidence population site truth garden river bank summer winter bird horse ocean island bridge forest "
          "little old new good great small large long young important public bad same able early free simple "
          "and the of to in for on with at by from about over after into under again then also only very").split()


# ---------------------------------------------------------------- measuring

@dataclass
class Sample:
    seconds: float
    max_rss: int  # bytes
    stdout: str


TIME = shutil.which("time", path="/usr/bin:/bin")


def run_proc(cmd: list[str], env: dict[str, str], stdin: str | None = None) -> Sample:
    """Run ``cmd`` to completion: wall seconds, its peak RSS and its stdout.

    Peak RSS comes from ``/usr/bin/time`` (its ``%M``), else from a small Python wrapper's
    ``getrusage(RUSAGE_CHILDREN)``: the measured process must be spawned by a small
    process, because Linux starts a child's ``ru_maxrss`` at its parent's high-water mark
    (this driver holds whole models).
    """
    with tempfile.TemporaryDirectory() as tmp:
        rss_file = Path(tmp) / "rss"
        if TIME:
            wrapped = [TIME, "-o", str(rss_file), "-f", "%M", *cmd]
        else:
            wrapped = [PYTHON, "-c", _RUSAGE_WRAPPER, str(rss_file), *cmd]
        start = time.perf_counter()
        proc = subprocess.run(wrapped, input=(stdin or "").encode("utf-8"), capture_output=True, env=env)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.decode('utf-8', 'replace')}")
        max_rss_kb = int(rss_file.read_text().split()[-1])  # Linux: kilobytes
    return Sample(seconds, max_rss_kb * 1024, proc.stdout.decode("utf-8", "replace"))


_RUSAGE_WRAPPER = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def _busy_jiffies() -> tuple[int, int] | None:
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


BUSY = {"waits": 0, "busy": 0, "max_wait": 15.0}


def wait_quiet(window: float = 0.25, threshold: float = 0.25) -> None:
    """Wait until the other processes use under ``threshold`` of the CPUs (this one is idle meanwhile).

    The machine may be shared: a sample that starts while something else computes measures the
    other process. Gives up after ``BUSY["max_wait"]`` seconds (0: no waiting) and counts the
    sample as busy.
    """
    if BUSY["max_wait"] <= 0:
        return
    deadline = time.monotonic() + BUSY["max_wait"]
    BUSY["waits"] += 1
    while True:
        before = _busy_jiffies()
        time.sleep(window)
        after = _busy_jiffies()
        if before is None or after is None or after[1] == before[1]:
            return
        if (after[0] - before[0]) / (after[1] - before[1]) < threshold:
            return
        if time.monotonic() > deadline:
            BUSY["busy"] += 1
            return


def alternate(a, b, runs: int, warmup: int) -> tuple[list, list]:
    """Call ``a()`` and ``b()`` alternately: ``warmup`` unrecorded pairs, then ``runs`` recorded pairs,
    each pair started on a quiet machine (:func:`wait_quiet`)."""
    for _ in range(warmup):
        a()
        b()
    results_a, results_b = [], []
    for i in range(runs):
        # Swap the order every other pair so neither side always runs second.
        first, second = (a, b) if i % 2 == 0 else (b, a)
        wait_quiet()
        x = first()
        wait_quiet()
        y = second()
        results_a.append(x if first is a else y)
        results_b.append(y if first is a else x)
    return results_a, results_b


def timed(fn):
    """``fn`` wrapped to return its wall seconds (for in-process figures)."""
    def call():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return call


def median(values) -> float:
    return statistics.median(values)


# ---------------------------------------------------------------- setup

def seed_tiktoken(cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    for name, url in _TIKTOKEN_URLS.items():
        target = cache / hashlib.sha1(url.encode()).hexdigest()
        if not target.exists():
            shutil.copyfile(GPT2_BPE / name, target)


def make_checkpoint(size: str, out: Path, log) -> tuple[Path, int]:
    """A random GPT-2 of ``size`` saved with save_pretrained (+ tokenizer); reused when present.

    Returns (directory, parameter count)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from anatomy_cli.models.model_files import gpt2_tokenizer

    config = GPT2Config(vocab_size=50257, n_positions=1024, bos_token_id=50256, eos_token_id=50256,
                        **SIZES[size])
    done = out / "done.json"
    if done.exists():
        return out, json.loads(done.read_text())["n_params"]
    log(f"writing the {size} checkpoint to {out}")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer = gpt2_tokenizer()  # built from the gpt2 files seeded into TIKTOKEN_CACHE_DIR
    assert len(tokenizer) == 50257, len(tokenizer)
    tokenizer.save_pretrained(out)
    del model
    done.write_text(json.dumps({"n_params": n_params}))
    return out, n_params


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences of about 16 GPT-2 tokens (14-16 common words), fixed seed."""
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < n:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(14, 16))]
        prompts.append(" ".join(words).capitalize())
    return prompts


def machine() -> dict[str, str]:
    import torch
    import transformers

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    except OSError:
        pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "ram": ram, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": str(torch.get_num_threads()), "os": platform.platform()}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- figures

@dataclass
class Row:
    figure: str
    anatomy: str
    baseline: str
    ratio: float | None
    target: str
    ok: bool | None
    samples: dict = field(default_factory=dict)


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fmt_mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def ratio_row(figure: str, a: list[float], b: list[float], target: float, unit=fmt_s, higher_ok=False,
              **samples) -> Row:
    ma, mb = median(a), median(b)
    ratio = ma / mb
    ok = ratio >= target if higher_ok else ratio <= target
    return Row(figure, unit(ma), unit(mb), ratio, f"{'≥' if higher_ok else '≤'} {target:g}", ok,
               dict(anatomy=a, baseline=b, pair_ratios=[x / y for x, y in zip(a, b)], **samples))


def trace_in_process(lm, prompt: str):
    """What `anatomy trace PROMPT` computes, minus rendering (mirrors commands/trace.py)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import trace as analysis
    from anatomy_cli.cli.commands._common import describe

    encoded = engine.check_length(lm, engine.encode(lm, [prompt]))
    names = engine.residual_names(lm) + engine.layer_names(lm, "attn_out") + engine.layer_names(lm, "mlp_out")
    names.append("logits")
    [cache] = engine.run(lm, encoded, names, positions=[[-1]])
    resid = cache.residual_stream()[:, 0]
    return analysis.trace(resid, attn_out=cache.stack("attn_out")[:, 0], mlp_out=cache.stack("mlp_out")[:, 0],
                          lens_logits=engine.unembed(lm, resid), logits=cache.logits[0], k=5,
                          describe=describe(lm)).to_dict()


def hf_forward(model, tokenizer, prompt: str):
    """A bare HF forward with hidden states, and the top-5 of the last position."""
    import torch

    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model(**enc, output_hidden_states=True, use_cache=False)
    return torch.topk(torch.softmax(out.logits[0, -1].double(), -1), 5).indices.tolist()


def next_in_process(lm, prompts: list[str], batch_size: int):
    """What `anatomy next -` computes for stdin prompts, minus rendering (mirrors commands/next_token.py)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import next_token as analysis
    from anatomy_cli.cli.commands._common import describe

    encoded = engine.check_length(lm, engine.encode(lm, prompts))
    caches = engine.run(lm, encoded, ["logits"], positions=[[-1]] * len(encoded), batch_size=batch_size)
    name_token = describe(lm)
    return [analysis.next_tokens(c.logits[0], 10, name_token).to_dict() for c in caches]


def raw_batches(model, tokenizer, prompts: list[str], batch_size: int):
    """The baseline's batched loop (benchmarks/baseline.py next) on an already loaded model."""
    import torch

    out = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.inference_mode():
            hidden = model.base_model(**enc, use_cache=False).last_hidden_state
            logits = model.lm_head(hidden[torch.arange(len(batch)), enc["attention_mask"].sum(1) - 1])
        out.append(torch.topk(torch.log_softmax(logits.double(), -1), 10).indices)
    return out


# ---------------------------------------------------------------- the run

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small only, 3 runs, 64 batch prompts")
    parser.add_argument("--sizes", help="GPT-2 shapes, comma-separated: tiny, small, medium (default small,medium)")
    parser.add_argument("--runs", type=int, help="recorded runs per figure (default 5; --quick 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded runs of each side first (default 1)")
    parser.add_argument("--inproc-runs", type=int, help="recorded runs of in-process figures (default 4x --runs)")
    parser.add_argument("--prompts", type=int, help="prompts for the batch figure (default 256; --quick 64)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size, both sides (default 8)")
    parser.add_argument("--batch-models", help="model sizes for the batch figure (default: the first size)")
    parser.add_argument("--skip", default="", help="figures to skip: e2e,inproc,cold,params,params70b,batch")
    parser.add_argument("--threads", type=int, help="torch threads on both sides (default: torch's own, one per core)")
    parser.add_argument("--max-wait", type=float, default=15.0,
                        help="seconds to wait for other processes to go quiet before each sample (0: never)")
    parser.add_argument("--workdir", type=Path, help="keep checkpoints and caches here (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md",
                        help="markdown file whose '## Results' section is (re)written")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args(argv)

    sizes = (args.sizes or ("small" if args.quick else "small,medium")).split(",")
    for s in sizes:
        if s not in SIZES:
            parser.error(f"unknown size {s!r}; use {', '.join(SIZES)}")
    runs = args.runs or (3 if args.quick else 5)
    inproc_runs = args.inproc_runs or 4 * runs
    n_prompts = args.prompts or (64 if args.quick else 256)
    batch_of = (args.batch_models or sizes[0]).split(",")
    skip = set(filter(None, args.skip.split(",")))
    warmup = args.warmup
    BUSY["max_wait"] = args.max_wait
    if not (GPT2_BPE / "encoder.json").is_file():
        sys.exit(f"GPT-2 BPE files not found at {GPT2_BPE}")

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    tmp = None
    if args.workdir:
        work = args.workdir.resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="anatomy-bench-")
        work = Path(tmp.name)
    began = time.perf_counter()
    load_before = loadavg()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TIKTOKEN_CACHE_DIR=str(work / "tiktoken"),
               NO_COLOR="1")
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TIKTOKEN_CACHE_DIR=str(work / "tiktoken"))
    seed_tiktoken(work / "tiktoken")
    rows: list[Row] = []
    notes: list[str] = []

    def proc(cmd, stdin=None):
        return lambda: run_proc(cmd, env, stdin)

    try:
        checkpoints = {s: make_checkpoint(s, work / f"gpt2-{s}", log) for s in sizes}
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        from anatomy_cli import engine

        # 1. end to end, 6. memory
        if "e2e" not in skip:
            for size, (path, n_params) in checkpoints.items():
                log(f"e2e trace, {size}")
                a, b = alternate(proc([*ANATOMY, "trace", TRACE_PROMPT, "--model", str(path), "--format", "json"]),
                                 proc([PYTHON, str(BASELINE), "trace", str(path), TRACE_PROMPT]), runs, warmup)
                ours, theirs = json.loads(a[0].stdout), json.loads(b[0].stdout)
                same = [t["token_id"] for t in ours["top"]] == [t["token_id"] for t in theirs["top"]]
                if not same:
                    notes.append(f"e2e {size}: anatomy's top-5 differs from the baseline's")
                n_tokens = len(ours["token_ids"])
                rows.append(ratio_row(f"1. e2e `trace` ({size}, {n_tokens} tokens), wall", [s.seconds for s in a],
                                      [s.seconds for s in b], 1.15, top5_agree=same))
                weights = 4 * n_params
                rss_a, rss_b = median([s.max_rss for s in a]), median([s.max_rss for s in b])
                limit = 1.3 * weights + 400e6
                rows.append(Row(f"6. peak RSS `trace` ({size}; fp32 weights {fmt_mb(weights)})", fmt_mb(rss_a),
                                fmt_mb(rss_b), rss_a / weights, f"≤ 1.3× weights + 400 MB = {fmt_mb(limit)}",
                                rss_a <= limit, dict(anatomy=[s.max_rss for s in a],
                                                     baseline=[s.max_rss for s in b], weights=weights)))

        # 2. in process
        if "inproc" not in skip:
            for size, (path, _) in checkpoints.items():
                log(f"in-process trace, {size}")
                lm = engine.load(str(path), device="cpu")
                for label, prompt in (("", TRACE_PROMPT), (", short prompt", SHORT_PROMPT)):
                    n_tokens = len(lm.tokenizer.hf(prompt)["input_ids"])
                    ours = trace_in_process(lm, prompt)
                    theirs = hf_forward(lm.model, lm.tokenizer.hf, prompt)
                    same = [t["token_id"] for t in ours["top"]] == theirs
                    a, b = alternate(timed(lambda: trace_in_process(lm, prompt)),
                                     timed(lambda: hf_forward(lm.model, lm.tokenizer.hf, prompt)),
                                     inproc_runs, max(warmup, 1))
                    row = ratio_row(f"2. in-process trace ({size}, {n_tokens} tokens{label})", a, b, 1.10,
                                    top5_agree=same)
                    if label:  # informational: see the notes
                        row.target, row.ok = "(info)", None
                    rows.append(row)
                del lm

        # 3. cold start
        if "cold" not in skip:
            log("cold start")
            torch_cmd = proc([PYTHON, "-c", "import torch"])
            for label, cmd in (("`anatomy --help`", [*ANATOMY, "--help"]),
                               ("`anatomy tokens \"Thank you very\"`", [*ANATOMY, "tokens", "Thank you very"])):
                a, b = alternate(proc(cmd), torch_cmd, runs, warmup)
                rows.append(ratio_row(f"3. cold start {label} vs `import torch`", [s.seconds for s in a],
                                      [s.seconds for s in b], 0.3))

        # 4. params
        if "params" not in skip:
            log("params gpt2")
            a, b = alternate(proc([*ANATOMY, "params", "gpt2", "--format", "json"]),
                             proc([PYTHON, str(BASELINE), "params"]), runs, warmup)
            total = json.loads(a[0].stdout)
            theirs = int(b[0].stdout.strip())
            ours_total = total.get("total") if isinstance(total.get("total"), int) else None
            if ours_total != theirs:
                notes.append(f"params: anatomy counts {ours_total} parameters, the baseline {theirs}")
            rows.append(ratio_row("4. `params gpt2` vs meta-device script", [s.seconds for s in a],
                                  [s.seconds for s in b], 1.2, baseline_total=theirs, anatomy_total=ours_total))
        if "params70b" not in skip and "params" not in skip:
            log("params 70B")
            cfg = work / "llama-70b"
            cfg.mkdir(exist_ok=True)
            (cfg / "config.json").write_text(json.dumps(LLAMA_70B))
            samples = []
            for _ in range(warmup + max(1, min(runs, 3))):
                wait_quiet()
                samples.append(run_proc([*ANATOMY, "params", str(cfg), "--format", "json"], env))
            samples = samples[warmup:]
            secs, rss = [s.seconds for s in samples], [s.max_rss for s in samples]
            rows.append(Row("4b. `params` 70B LLaMA-shaped config, wall", fmt_s(median(secs)), "—", None,
                            "(info)", None, dict(anatomy=secs)))
            rows.append(Row("4c. `params` 70B LLaMA-shaped config, peak RSS", fmt_mb(median(rss)), "—", None,
                            "< 1,000 MB", median(rss) < 1e9, dict(anatomy=rss)))

        # 5. batches
        if "batch" not in skip:
            prompts = make_prompts(n_prompts)
            stdin = "\n".join(prompts) + "\n"
            for size in batch_of:
                path, _ = checkpoints[size]
                log(f"batch next, {size}, {n_prompts} prompts")
                a, b = alternate(proc([*ANATOMY, "next", "-", "--model", str(path), "--format", "jsonl",
                                       "--batch-size", str(args.batch_size)], stdin),
                                 proc([PYTHON, str(BASELINE), "next", str(path), str(args.batch_size)], stdin),
                                 runs, warmup)
                for sample in (a[0], b[0]):
                    if len(sample.stdout.splitlines()) != n_prompts:
                        raise RuntimeError(f"batch: expected {n_prompts} output lines")
                ours = [json.loads(line)["top"][0]["token_id"] for line in a[0].stdout.splitlines()]
                theirs = [json.loads(line)["top"][0]["token_id"] for line in b[0].stdout.splitlines()]
                tp_a = [n_prompts / s.seconds for s in a]
                tp_b = [n_prompts / s.seconds for s in b]
                lm = engine.load(str(path), device="cpu")
                lengths = [len(x) for x in lm.tokenizer.hf(prompts)["input_ids"]]
                rows.append(ratio_row(
                    f"5. `next -` {n_prompts} prompts ({min(lengths)}-{max(lengths)} tokens, mean "
                    f"{sum(lengths) / len(lengths):.1f}), batch {args.batch_size} ({size}), prompts/s",
                    tp_a, tp_b, 0.85, unit=lambda x: f"{x:.1f}/s", higher_ok=True,
                    top1_agree=sum(x == y for x, y in zip(ours, theirs)) / n_prompts))
                from transformers import AutoTokenizer

                hf = AutoTokenizer.from_pretrained(path)  # the baseline's own, as in baseline.py
                hf.pad_token, hf.padding_side = hf.eos_token, "right"
                if "inproc" not in skip:
                    log(f"in-process batches, {size}")
                    a, b = alternate(timed(lambda: next_in_process(lm, prompts, args.batch_size)),
                                     timed(lambda: raw_batches(lm.model, hf, prompts, args.batch_size)),
                                     runs, max(warmup, 1))
                    row = ratio_row(f"5b. in-process batches ({size}), prompts/s", [n_prompts / x for x in a],
                                    [n_prompts / x for x in b], 0.85, unit=lambda x: f"{x:.1f}/s", higher_ok=True)
                    row.target, row.ok = "(info)", None
                    rows.append(row)
                del lm
    finally:
        if tmp is not None:
            tmp.cleanup()

    rows.sort(key=lambda r: r.figure.split(" ")[0])  # by figure number; stable: small before medium
    if BUSY["busy"]:
        notes.append(f"{BUSY['busy']} of {BUSY['waits']} samples started while other processes kept the CPUs "
                     f"busy for {BUSY['max_wait']:g} s: this machine was shared; those figures are noisier")
    info = machine()
    info.update(date=datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
                load_before=load_before, load_after=loadavg(),
                wall=f"{time.perf_counter() - began:.0f} s")
    section = render_section(rows, info, notes, runs=runs, inproc_runs=inproc_runs, warmup=warmup,
                             sizes=sizes, argv=argv if argv is not None else sys.argv[1:])
    write_section(args.out, section)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "rows": [vars(r) for r in rows]}, indent=1))
    print(section)
    log(f"done in {info['wall']}; wrote {args.out}")
    return 0


# ---------------------------------------------------------------- markdown

def render_section(rows: list[Row], info: dict, notes: list[str], *, runs: int, inproc_runs: int, warmup: int,
                   sizes: list[str], argv: list[str]) -> str:
    lines = ["## Results", "",
             f"`{' '.join(['python benchmarks/run.py', *argv])}`", "",
             f"- date: {info['date']}; whole run {info['wall']}",
             f"- machine: {info['cpu']}, {info['cores']} cores, {info['ram']} RAM; {info['os']}",
             f"- Python {info['python']}, torch {info['torch']} ({info['torch_threads']} threads), "
             f"transformers {info['transformers']}",
             f"- load average before / after: {info['load_before']} / {info['load_after']}",
             f"- medians of {runs} runs after {warmup} warm-up run(s) of each side, the two sides alternating "
             f"(in-process figures: {inproc_runs} runs); GPT-2 shapes: {', '.join(sizes)}", "",
             "| figure | anatomy | baseline | ratio | target | pass |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "—"
        ok = "—" if r.ok is None else ("pass" if r.ok else "**FAIL**")
        lines.append(f"| {r.figure} | {r.anatomy} | {r.baseline} | {ratio} | {r.target} | {ok} |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    lines += ["", "What each figure measures (wall time from spawn to exit for commands; PROMPT is "
              f"\"{TRACE_PROMPT}\"):", "",
              "1. `anatomy trace PROMPT --model DIR --format json` vs `baseline.py trace DIR PROMPT` (AutoTokenizer, "
              "AutoModelForCausalLM.from_pretrained, one forward with `output_hidden_states=True`, top-5).",
              "2. One process, one loaded model: what `anatomy trace` computes without rendering (encode, "
              "`engine.run` of the residual stream and the attention/MLP outputs at the last position, the logit "
              "lens, `analyses.trace`) vs tokenizer + `model(**enc, output_hidden_states=True)` + top-5. The short "
              "prompt is for information: there the logit lens (one head product per layer) costs about as much "
              "as the forward itself.",
              "3. `anatomy --help` and `anatomy tokens \"Thank you very\"` vs `python -c \"import torch\"`.",
              "4. `anatomy params gpt2 --format json` vs `baseline.py params` (GPT2LMHeadModel built under "
              "`torch.device(\"meta\")`, sum of `numel`); 4b/4c: `anatomy params DIR` on a 70B LLaMA-shaped "
              "config.json (hidden 8192, 80 layers, FFN 28672, 64 heads, 8 KV heads, vocab 32000).",
              "5. The prompts on stdin to `anatomy next - --format jsonl` vs `baseline.py next` (the same batch "
              "size, right padding, the LM head on each prompt's last position, top-10 as JSON lines); "
              "throughput = prompts / wall time, loading included. 5b: the same two loops in one process "
              "on one loaded model (information).",
              "6. Peak RSS (`/usr/bin/time`'s maximum resident set size) of the figure-1 runs; the ratio column is "
              "RSS / fp32 weight bytes."]
    return "\n".join(lines) + "\n"


HEADER = """# Performance

What anatomy costs on top of the hand-written `transformers` code it replaces, measured by
`benchmarks/run.py` (baselines in `benchmarks/baseline.py`).
"""


def write_section(path: Path, section: str) -> None:
    """Replace the ``## Results`` section of ``path`` (up to the next ``## `` heading), keep the rest.

    Without one, the section goes before the first ``## `` heading (after the introduction).
    """
    lines = (path.read_text(encoding="utf-8") if path.exists() else HEADER).splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("## ")]
    start = next((i for i in headings if lines[i].strip() == "## Results"), None)
    if start is None:
        start = end = headings[0] if headings else len(lines)
    else:
        end = next((i for i in headings if i > start), len(lines))
    before, after = "\n".join(lines[:start]).rstrip("\n"), "\n".join(lines[end:]).strip("\n")
    text = (before + "\n\n" if before else "") + section + ("\n" + after + "\n" if after else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
