"""Figures 5 and 5b: `anatomy next -` on a stdin batch against `baseline.py next`, and the same in one process."""

from __future__ import annotations

import json

from common import ANATOMY
from common import BASELINE
from common import PYTHON
from common import Context
from common import Row
from common import alternate
from common import ratio_row
from common import timed
from workloads import make_prompts
from workloads import next_in_process
from workloads import raw_batches


def measure(ctx: Context) -> list[Row]:
    from anatomy_cli import engine

    rows = []
    n_prompts, batch = ctx.n_prompts, ctx.batch_size
    prompts = make_prompts(n_prompts)
    stdin = "\n".join(prompts) + "\n"
    for size in ctx.batch_of:
        path, _ = ctx.checkpoints[size]
        ctx.log(f"batch next, {size}, {n_prompts} prompts")
        a, b = alternate(ctx.proc([*ANATOMY, "next", "-", "--model", str(path), "--format", "jsonl",
                                   "--batch-size", str(batch)], stdin),
                         ctx.proc([PYTHON, str(BASELINE), "next", str(path), str(batch)], stdin),
                         ctx.runs, ctx.warmup)
        for sample in (a[0], b[0]):
            if len(sample.stdout.splitlines()) != n_prompts:
                raise RuntimeError(f"batch: expected {n_prompts} output lines")
        ours = [json.loads(line)["top"][0]["token_id"] for line in a[0].stdout.splitlines()]
        theirs = [json.loads(line)["top"][0]["token_id"] for line in b[0].stdout.splitlines()]
        lm = engine.load(str(path), device="cpu")
        lengths = [len(x) for x in lm.tokenizer.hf(prompts)["input_ids"]]
        rows.append(ratio_row(
            f"5. `next -` {n_prompts} prompts ({min(lengths)}-{max(lengths)} tokens, mean "
            f"{sum(lengths) / len(lengths):.1f}), batch {batch} ({size}), prompts/s",
            [n_prompts / s.seconds for s in a], [n_prompts / s.seconds for s in b], 0.85,
            unit=lambda x: f"{x:.1f}/s", higher_ok=True,
            top1_agree=sum(x == y for x, y in zip(ours, theirs)) / n_prompts))
        if "inproc" not in ctx.skip:
            rows.append(_in_process(ctx, lm, path, prompts, size))
        del lm
    return rows


def _in_process(ctx: Context, lm, path, prompts: list[str], size: str) -> Row:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(path)  # the baseline's own, as in baseline.py
    hf.pad_token, hf.padding_side = hf.eos_token, "right"
    ctx.log(f"in-process batches, {size}")
    a, b = alternate(timed(lambda: next_in_process(lm, prompts, ctx.batch_size)),
                     timed(lambda: raw_batches(lm.model, hf, prompts, ctx.batch_size)), ctx.runs, max(ctx.warmup, 1))
    n = len(prompts)
    row = ratio_row(f"5b. in-process batches ({size}), prompts/s", [n / x for x in a], [n / x for x in b], 0.85,
                    unit=lambda x: f"{x:.1f}/s", higher_ok=True)
    row.target, row.ok = "(info)", None
    return row
