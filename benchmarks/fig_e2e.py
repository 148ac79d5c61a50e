"""Figures 1 and 6: `anatomy trace` end to end against `baseline.py trace`, wall time and peak RSS."""

from __future__ import annotations

import json

from common import ANATOMY
from common import BASELINE
from common import PYTHON
from common import TRACE_PROMPT
from common import Context
from common import Row
from common import alternate
from common import fmt_mb
from common import median
from common import ratio_row


def measure(ctx: Context) -> list[Row]:
    rows = []
    for size, (path, n_params) in ctx.checkpoints.items():
        ctx.log(f"e2e trace, {size}")
        a, b = alternate(ctx.proc([*ANATOMY, "trace", TRACE_PROMPT, "--model", str(path), "--format", "json"]),
                         ctx.proc([PYTHON, str(BASELINE), "trace", str(path), TRACE_PROMPT]), ctx.runs, ctx.warmup)
        ours, theirs = json.loads(a[0].stdout), json.loads(b[0].stdout)
        same = [t["token_id"] for t in ours["top"]] == [t["token_id"] for t in theirs["top"]]
        if not same:
            ctx.notes.append(f"e2e {size}: anatomy's top-5 differs from the baseline's")
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
    return rows
