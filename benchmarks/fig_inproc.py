"""Figure 2: what `anatomy trace` computes in one process on one loaded model, against one raw forward."""

from __future__ import annotations

from common import TRACE_PROMPT
from common import Context
from common import Row
from common import alternate
from common import ratio_row
from common import timed
from workloads import SHORT_PROMPT
from workloads import hf_forward
from workloads import trace_in_process


def measure(ctx: Context) -> list[Row]:
    from anatomy_cli import engine

    rows = []
    for size, (path, _) in ctx.checkpoints.items():
        ctx.log(f"in-process trace, {size}")
        lm = engine.load(str(path), device="cpu")
        for label, prompt in (("", TRACE_PROMPT), (", short prompt", SHORT_PROMPT)):
            n_tokens = len(lm.tokenizer.hf(prompt)["input_ids"])
            ours = trace_in_process(lm, prompt)
            theirs = hf_forward(lm.model, lm.tokenizer.hf, prompt)
            same = [t["token_id"] for t in ours["top"]] == theirs
            a, b = alternate(timed(lambda lm=lm, prompt=prompt: trace_in_process(lm, prompt)),
                             timed(lambda lm=lm, prompt=prompt: hf_forward(lm.model, lm.tokenizer.hf, prompt)),
                             ctx.inproc_runs, max(ctx.warmup, 1))
            row = ratio_row(f"2. in-process trace ({size}, {n_tokens} tokens{label})", a, b, 1.10, top5_agree=same)
            if label:  # informational: see the notes
                row.target, row.ok = "(info)", None
            rows.append(row)
        del lm
    return rows
