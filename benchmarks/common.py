"""What every benchmark shares: measuring (alternating runs, quiet waits, peak RSS), setup
(GPT-2-shaped random checkpoints, prompts, the machine's description), result rows and the
markdown section of docs/performance.md. One module per figure imports it; `run.py` drives them.
"""


from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPT2_BPE = ROOT / "anatomy_cli" / "data" / "gpt2"  # GPT-2's BPE files, shipped in the package
BASELINE = Path(__file__).resolve().with_name("baseline.py")
PYTHON = sys.executable
# The console script next to this Python (as a user runs it), else the module.
_SCRIPT = shutil.which("anatomy", path=str(Path(PYTHON).parent))
ANATOMY = [_SCRIPT] if _SCRIPT else [PYTHON, "-m", "anatomy_cli"]
TRACE_PROMPT = "The old lighthouse keeper climbed the stairs every evening to light the lamp, and"



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


# ---------------------------------------------------------------- one run's context

@dataclass
class Context:
    """What the figure modules share in one run: settings, the work directory, the subprocess
    environment, the GPT-2-shaped checkpoints by size (path, parameter count), and the notes."""

    work: Path
    env: dict[str, str]
    runs: int
    warmup: int
    inproc_runs: int
    n_prompts: int
    batch_size: int
    batch_of: list[str]
    skip: set[str]
    checkpoints: dict[str, tuple[Path, int]]
    log: Any
    notes: list[str] = field(default_factory=list)

    def proc(self, cmd: list[str], stdin: str | None = None):
        """A zero-argument callable running ``cmd`` once (for :func:`alternate`)."""
        return lambda: run_proc(cmd, self.env, stdin)


def print_figures(figures: dict[str, Any], path: Path | None) -> None:
    """The end of a ``bench_*.py`` script: the load average after, the figures as JSON on stdout, and in
    ``path`` when given."""
    import json

    figures["load_after"] = os.getloadavg()
    text = json.dumps(figures, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")
