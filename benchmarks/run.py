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

Figures, as named by ``--skip``, one module each: e2e (``fig_e2e.py``: 1. end to end, and 6. peak RSS of
those runs), inproc (``fig_inproc.py``: 2.), cold (``fig_cold.py``: 3.), params and params70b
(``fig_params.py``: 4., 4b/4c), batch (``fig_batch.py``: 5., 5b). Shared code: ``common.py``.
Targets and results: docs/performance.md.
Before each recorded sample the driver waits (``--max-wait``) until other processes leave
the CPUs idle: on a shared 2-core machine torch's threads slow down many times over otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fig_batch
import fig_cold
import fig_e2e
import fig_inproc
import fig_params
from common import *  # noqa: F403  (the other benchmarks import their helpers from here: `import run as bench`)
from common import BUSY
from common import GPT2_BPE
from common import ROOT
from common import Context
from common import Row
from common import loadavg
from common import machine
from common import render_section
from common import write_section
from workloads import *  # noqa: F403
from workloads import SIZES
from workloads import make_checkpoint
from workloads import seed_tiktoken

FIGURES = (("e2e", fig_e2e.measure), ("inproc", fig_inproc.measure), ("cold", fig_cold.measure),
           ("params", fig_params.measure), ("params70b", fig_params.measure_70b), ("batch", fig_batch.measure))


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
    try:
        checkpoints = {s: make_checkpoint(s, work / f"gpt2-{s}", log) for s in sizes}
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        ctx = Context(work=work, env=env, runs=runs, warmup=warmup, inproc_runs=inproc_runs, n_prompts=n_prompts,
                      batch_size=args.batch_size, batch_of=batch_of, skip=skip, checkpoints=checkpoints, log=log)
        for name, measure in FIGURES:
            if name not in skip and not (name == "params70b" and "params" in skip):
                rows += measure(ctx)
    finally:
        if tmp is not None:
            tmp.cleanup()

    rows.sort(key=lambda r: r.figure.split(" ")[0])  # by figure number; stable: small before medium
    if BUSY["busy"]:
        ctx.notes.append(f"{BUSY['busy']} of {BUSY['waits']} samples started while other processes kept the CPUs "
                     f"busy for {BUSY['max_wait']:g} s: this machine was shared; those figures are noisier")
    info = machine()
    info.update(date=datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
                load_before=load_before, load_after=loadavg(),
                wall=f"{time.perf_counter() - began:.0f} s")
    section = render_section(rows, info, ctx.notes, runs=runs, inproc_runs=inproc_runs, warmup=warmup,
                             sizes=sizes, argv=argv if argv is not None else sys.argv[1:])
    write_section(args.out, section)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "rows": [vars(r) for r in rows]}, indent=1))
    print(section)
    log(f"done in {info['wall']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
