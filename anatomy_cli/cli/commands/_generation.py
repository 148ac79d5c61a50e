"""What `anatomy generate` computes for one prompt: the run(s), the check, the sweep; records and sections.

Imported inside the command body (torch is loaded by then).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from anatomy_cli import engine
from anatomy_cli.analyses import generate as analysis
from anatomy_cli.engine.generate import Generation, generate, replay
from anatomy_cli.engine.steering import SteeringVector
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text.tokenization import Encoded

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


def prepare(lm: engine.LoadedModel, steer: Path | None, *, sample: bool, temperature: float, top_p: float,
            seed: int | None, max_new_tokens: int, k: int, lens: bool, feature: SteeringVector | None = None,
            notes: list[str] | None = None) -> tuple[SteeringVector | None, Settings]:
    """The steering vector read from ``steer`` (or ``feature``'s, an SAE decoder row: ``generate
    --steer-feature``, with its ``notes``) and checked against ``lm`` (warnings on stderr), and the run
    settings. Raises UsageError for a bad vector file or bad sampling values."""
    from anatomy_cli.cli.app import warn
    from anatomy_cli.engine import steering
    from anatomy_cli.engine.generate import greedy, stop_ids

    vector = steering.load(Path(steer)) if steer is not None else feature
    if vector is not None:
        for line in steering.check(vector, lm, str(steer or "the SAE feature")) + list(notes or ()):
            warn(line)
    if sample:
        analysis.sampler(temperature=temperature, top_p=top_p)  # bad values fail before the first run

    def choose() -> Callable[[torch.Tensor], int]:
        return analysis.sampler(temperature=temperature, top_p=top_p, seed=seed) if sample else greedy

    return vector, Settings(choose, max_new_tokens, k, lens, vector, stop_ids(lm))


def header(lm: engine.LoadedModel, enc: Encoded, sampling: dict[str, Any], steer: Path | None,
           vector: SteeringVector | None, coefs: list[float], feature: int | None = None) -> dict[str, Any]:
    """The first keys of one prompt's record: the prompt record, ``sampling``, ``steer`` (``file``: the
    vector's, or the SAE's with ``feature``, its id)."""
    from anatomy_cli.cli.commands._common import prompt_record

    steering = None if vector is None else {"file": str(steer), "site": vector.site, "layers": vector.layers,
                                            "coef": coefs, **({"feature": feature} if feature is not None else {})}
    return {**prompt_record(lm, enc), "sampling": sampling, "steer": steering}


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


def continuation(lm: engine.LoadedModel, g: Generation, s: Settings, describe) -> analysis.Continuation:
    """The :class:`~anatomy_cli.analyses.generate.Continuation` of one generation."""
    steps = analysis.steps(g.logits, g.tokens, s.k, describe, lens_logprob=g.lens_logprob, lens_top=g.lens_top)
    return analysis.Continuation(decode(lm, g.tokens), tuple(g.tokens), g.stopped, tuple(steps))


def trace_section(c: analysis.Continuation, s: Settings) -> Section:
    """The table section of one generation's steps."""
    rows = []
    for st in c.steps:
        row = st.to_dict()
        row["top_text"] = ", ".join(f"{t.token} {t.probability:.3f}" for t in st.top)
        rows.append(row)
    columns = (*STEP_COLUMNS, LENS_COLUMN) if s.lens else STEP_COLUMNS
    return Section(columns, rows, title=f"{len(c.steps)} generated tokens")


def sweep(lm: engine.LoadedModel, ids: list[int], s: Settings, coefs: list[float], target_id: int | None,
          do_check: bool, target: str | None = None) -> tuple[analysis.Sweep, float | None]:
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
    return analysis.Sweep(tuple(rows), target), worst


@dataclass(frozen=True)
class Outcome:
    """One prompt's result: the report the command prints, the result object (a Continuation, or a Sweep for
    several coefficients), the JSON lines of ``--format jsonl``, and the picture's caption detail."""

    report: Report
    result: analysis.Continuation | analysis.Sweep
    rows: list[dict[str, Any]]


def one_prompt(lm: engine.LoadedModel, enc: Encoded, s: Settings, coefs: list[float], target_id: int | None,
               do_check: bool, header: dict[str, Any]) -> Outcome:
    """Everything `generate` computes and reports for one prompt (``header``: the record's first keys: the
    prompt record, ``sampling``, ``steer``)."""
    from anatomy_cli.cli.commands._common import describe, model_label, prompt_line

    described = describe(lm)
    heading = [f"generate · {model_label(lm)}", prompt_line(enc)]
    data = dict(header)
    result: analysis.Continuation | analysis.Sweep
    if len(coefs) > 1:
        target = None if target_id is None else described(target_id)[0]
        result, worst = sweep(lm, list(enc.ids), s, coefs, target_id, do_check, target)
        data.update(result.to_dict())
        sections = [Section(SWEEP_COLUMNS, data["sweep"], title="coefficient sweep")]
        rows = [{"prompt": enc.text, **r} for r in data["sweep"]]
    else:
        g = run_one(lm, list(enc.ids), s, coefs[0])
        worst = check(lm, g, s, coefs[0]) if do_check else None
        result = continuation(lm, g, s, described)
        data.update(result.to_dict())
        sections = [trace_section(result, s)]
        rows = [{"prompt": enc.text, **st} for st in data["steps"]]
        heading.append(f"continuation {result.text!r} · stopped: {result.stopped}")
    notes = []
    if do_check:
        data["check"] = {"max_abs_logit_diff": worst}
        notes.append(f"cache check: largest |logit difference| cached vs uncached {worst:.3g}")
    return Outcome(Report(data=data, sections=sections, heading=heading, notes=notes), result, rows)


def caption(lm: engine.LoadedModel, enc: Encoded, result: analysis.Continuation | analysis.Sweep,
            vector: SteeringVector | None, coefs: list[float]) -> Any:
    """The picture's caption: the prompt and what is drawn (the steered blocks and coefficients, or the lens)."""
    from anatomy_cli.output.plots import Caption

    if isinstance(result, analysis.Sweep):
        where = "" if vector is None else f"{vector.site} of block{'s' if len(vector.layers) > 1 else ''} " \
                                          f"{', '.join(map(str, vector.layers))}"
        detail = f"steering {where} · coefficients {', '.join(f'{c:g}' for c in coefs)}"
    else:
        detail = f"logit lens of every block at each of {len(result.steps)} steps"
        if vector is not None:
            detail += f" · steered, coefficient {coefs[0]:g}"
    return Caption.of("generate", lm, enc.text, detail)
