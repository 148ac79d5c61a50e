"""Figures 4, 4b, 4c: `anatomy params` against a meta-device script, and on a 70B LLaMA-shaped config."""

from __future__ import annotations

import json

from common import ANATOMY
from common import BASELINE
from common import PYTHON
from common import Context
from common import Row
from common import alternate
from common import fmt_mb
from common import fmt_s
from common import median
from common import ratio_row
from common import run_proc
from common import wait_quiet
from workloads import LLAMA_70B


def measure(ctx: Context) -> list[Row]:
    ctx.log("params gpt2")
    a, b = alternate(ctx.proc([*ANATOMY, "params", "gpt2", "--format", "json"]),
                     ctx.proc([PYTHON, str(BASELINE), "params"]), ctx.runs, ctx.warmup)
    total = json.loads(a[0].stdout)
    theirs = int(b[0].stdout.strip())
    ours_total = total.get("total") if isinstance(total.get("total"), int) else None
    if ours_total != theirs:
        ctx.notes.append(f"params: anatomy counts {ours_total} parameters, the baseline {theirs}")
    return [ratio_row("4. `params gpt2` vs meta-device script", [s.seconds for s in a], [s.seconds for s in b],
                      1.2, baseline_total=theirs, anatomy_total=ours_total)]


def measure_70b(ctx: Context) -> list[Row]:
    ctx.log("params 70B")
    cfg = ctx.work / "llama-70b"
    cfg.mkdir(exist_ok=True)
    (cfg / "config.json").write_text(json.dumps(LLAMA_70B))
    samples = []
    for _ in range(ctx.warmup + max(1, min(ctx.runs, 3))):
        wait_quiet()
        samples.append(run_proc([*ANATOMY, "params", str(cfg), "--format", "json"], ctx.env))
    samples = samples[ctx.warmup:]
    secs, rss = [s.seconds for s in samples], [s.max_rss for s in samples]
    return [Row("4b. `params` 70B LLaMA-shaped config, wall", fmt_s(median(secs)), "—", None, "(info)", None,
                dict(anatomy=secs)),
            Row("4c. `params` 70B LLaMA-shaped config, peak RSS", fmt_mb(median(rss)), "—", None, "< 1,000 MB",
                median(rss) < 1e9, dict(anatomy=rss))]
