"""What `anatomy generate` computes for one prompt: the run(s), the check, the sweep; records and sections.

Imported inside the command body (torch is loaded by then).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from anatomy_cli import engine
from anatomy_cli.analyses import generate as analysis
from anatomy_cli.engine.generate import Generation, generate, replay
from anatomy_cli.engine.steering import SteeringVector
from anatomy_cli.output.render import Column, Section

STEP_COLUMNS = (
    Column("step", "step", "int"),
    Column("token", "token"),
    Column("token_id", "id", "id"),
    Column("probability", "probability", "prob", 4),
    Column("rank", "rank", "int"),
    Column("top_text", "top tokens"),
)
LENS_COLUMN = Column("first_top1_layer", "first top-1 layer", "int")
SWEEP_COLUMNS = (
    Column("coef", "coef", "float", 2),
    Column("continuation", "continuation"),
    Column("kl", "KL from coef 0 (nats)", "number", 4),
    Column("target_logprob", "target logprob", "float", 3),
    Column("target_shift", "target shift", "float", 3),
)


@dataclass(frozen=True)
class Settings:
    """The command's options for one run: the token rule factory (a fresh sampler per run, so every
    coefficient of a sweep draws the same random numbers), the lengths, the steering vector."""

    choose: Callable[[], Callable[[torch.Tensor], int]]
    max_new_tokens: int
    k: int
    lens: bool
    vector: SteeringVector | None
    stop: tuple[int, ...]


def run_one(lm: engine.LoadedModel, ids: list[int], s: Settings, coef: float, *, lens: bool | None = None,
            use_cache: bool = True) -> Generation:
    hooks = s.vector.hooks(coef) if s.vector is not None else None
    return generate(lm, ids, max_new_tokens=s.max_new_tokens, choose=s.choose(), stop=s.stop, hooks=hooks,
                    lens=s.lens if lens is None else lens, use_cache=use_cache)


def check(lm: engine.LoadedModel, g: Generation, s: Settings, coef: float) -> float:
    """Largest |logit| difference between ``g`` (cached) and the same tokens replayed with a full forward per
    step and no cache (the same steering hooks)."""
    if not g.tokens:
        return 0.0
    hooks = s.vector.hooks(coef) if s.vector is not None else None
    again = generate(lm, list(g.prompt), max_new_tokens=len(g.tokens), choose=replay(g.tokens), hooks=hooks,
                     use_cache=False)
    return float((again.logits.double() - g.logits.double()).abs().max())


def decode(lm: engine.LoadedModel, tokens: tuple[int, ...]) -> str:
    """The continuation's text: its tokens' bytes joined, decoded as UTF-8 (a cut character: U+FFFD)."""
    return b"".join(lm.tokenizer.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


def trace_record(lm: engine.LoadedModel, g: Generation, s: Settings, describe) -> tuple[dict[str, Any], Section]:
    """The JSON keys and the table section of one generation's steps."""
    steps = analysis.steps(g.logits, g.tokens, s.k, describe, lens_logprob=g.lens_logprob, lens_top=g.lens_top)
    rows = []
    for st in steps:
        row = st.to_dict()
        row["top_text"] = ", ".join(f"{t.token} {t.probability:.3f}" for t in st.top)
        rows.append(row)
    columns = (*STEP_COLUMNS, LENS_COLUMN) if s.lens else STEP_COLUMNS
    data = {"continuation": decode(lm, g.tokens), "generated_ids": list(g.tokens), "stopped": g.stopped,
            "steps": [st.to_dict() for st in steps]}
    return data, Section(columns, rows, title=f"{len(steps)} generated tokens")


def sweep(lm: engine.LoadedModel, ids: list[int], s: Settings, coefs: list[float], target_id: int | None,
          do_check: bool) -> tuple[list[analysis.SweepRow], float | None]:
    """Every coefficient's continuation, KL and target shift (the first step against coefficient 0), and the
    largest cache-check difference over all runs (None without ``do_check``)."""
    base = run_one(lm, ids, s, 0.0, lens=False)
    worst = check(lm, base, s, 0.0) if do_check else None
    rows = []
    for coef in coefs:
        g = base if coef == 0 else run_one(lm, ids, s, coef, lens=False)
        if do_check and coef != 0:
            worst = max(worst or 0.0, check(lm, g, s, coef))
        rows.append(analysis.sweep_row(coef, decode(lm, g.tokens), len(g.tokens), g.logits[0], base.logits[0],
                                       target_id))
    return rows, worst
