"""Figure 3: cold start of `anatomy --help` and `anatomy tokens` against `python -c "import torch"`."""

from __future__ import annotations

from common import ANATOMY
from common import PYTHON
from common import Context
from common import Row
from common import alternate
from common import ratio_row


def measure(ctx: Context) -> list[Row]:
    ctx.log("cold start")
    rows = []
    torch_cmd = ctx.proc([PYTHON, "-c", "import torch"])
    for label, cmd in (("`anatomy --help`", [*ANATOMY, "--help"]),
                       ("`anatomy tokens \"Thank you very\"`", [*ANATOMY, "tokens", "Thank you very"])):
        a, b = alternate(ctx.proc(cmd), torch_cmd, ctx.runs, ctx.warmup)
        rows.append(ratio_row(f"3. cold start {label} vs `import torch`", [s.seconds for s in a],
                              [s.seconds for s in b], 0.3))
    return rows
