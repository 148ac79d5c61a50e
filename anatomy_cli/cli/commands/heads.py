"""`anatomy heads [PROMPT]`: five scores per attention head (entropy, sink, previous token, induction, duplicate)."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import (
    BatchSizeOpt,
    emit_prompts,
    load_weights,
    model_label,
    open_model,
    open_prompts,
    prompt_line,
    prompt_record,
    warn_cost,
)
from anatomy_cli.cli.options import (
    FormatOpt,
    PlotOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import PromptTooLong, UsageError
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text.options import PromptOptions


class Score(str, Enum):
    entropy = "entropy"
    first_token = "first_token"
    prev_token = "prev_token"
    induction = "induction"
    duplicate_token = "duplicate_token"


COLUMNS = (
    Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("entropy", "entropy", "float", 3), Column("first_token", "first tok", "float", 3),
    Column("prev_token", "prev tok", "float", 3), Column("induction", "induction", "float", 3),
    Column("duplicate_token", "duplicate", "float", 3),
)
NOTE = ("entropy: nats, mean over queries 1..n-1; first tok / prev tok: mean weight on position 0 / on q-1 over "
        "queries 1..n-1; induction / duplicate: on the random tokens repeated, mean weight from each token of the "
        "second copy to the token after its earlier occurrence / to that occurrence (Olsson et al. 2022; "
        "TransformerLens head detector)")


@app.command("heads")
@model_options()
@prompt_options()
def heads_command(
    prompt: Annotated[Optional[str], typer.Argument(
        metavar="[PROMPT]", show_default=False,
        help="Measure entropy, first_token and prev_token on this text ('-': one prompt per stdin line). "
             "Default: on the random sequence.")] = None,
    seq_len: Annotated[int, typer.Option(
        "--seq-len", min=2, help="Random tokens per copy of the repeated sequence (it is 2 x this long).")] = 50,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed that draws the random tokens.")] = 0,
    sort: Annotated[Optional[Score], typer.Option(
        "--sort", case_sensitive=False, show_default=False,
        help="Order by this score, highest first (entropy: lowest first). Default: layer, head.")] = None,
    top: Annotated[Optional[int], typer.Option(
        "--top", "-k", "-n", min=1, metavar="N", show_default=False,
        help="Show only the first N heads (--plot still colours every head and frames these N).")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """What each attention head does: one row per (layer, head) with five scores.

    entropy (nats), first_token (mass on position 0, the attention sink) and prev_token (weight on
    the previous position) are measured on PROMPT, or on the random sequence without one;
    induction and duplicate_token on --seq-len random ordinary tokens (seed --seed) repeated twice.
    Definitions and sources: docs/commands/heads.md. One forward with eager attention; the
    scores are computed layer by layer.

    Examples:

    \b
        anatomy heads --sort induction --top 5
        anatomy heads "The cat sat on the mat. The cat" --sort prev_token
        anatomy heads --seq-len 100 --seed 1 --format json
    """
    if prompt is not None:
        opened, encoded = open_prompts(prompt, spec, prompts)
    else:
        opened, encoded = open_model(spec), []
    _check(opened.info, encoded, seq_len, spec.model)
    lm = load_weights(opened)
    from anatomy_cli.models import cost
    warn_cost(f"heads on {len(encoded) + 1} prompts", lm,
              sum(cost.forward_flops(lm.info, n) for n in [*(len(e) for e in encoded), 2 * seq_len]))
    with status("heads") as line:
        results = run(lm, encoded, seq_len, seed, sort.value if sort else None, batch_size,
                      progress=line.counter("heads", "prompt layers"))
    # Every head is scored; --top cuts the rows printed, while the picture colours every head and frames the top.
    reports = [_report(lm, enc, dataclasses.replace(result, rows=result.rows[:top] if top else result.rows))
               for enc, result in results]
    emit_prompts(reports, fmt, from_stdin=prompt == "-")
    if plot:
        from anatomy_cli.output import plots

        for i, (enc, result) in enumerate(results, start=1):
            detail = f"induction, duplicate on {seq_len} random tokens × 2, seed {seed}"
            cap = plots.Caption.of("heads", lm, enc.text if encoded else None, detail)
            plots.draw("heads", plot, i if prompt == "-" else None, result, lm.n_layers, lm.n_heads, cap,
                       top=top)


def run(lm, encoded: list, seq_len: int, seed: int, sort: str | None, batch_size: int, progress=None) -> list[tuple]:
    """``(Encoded, Heads)`` per prompt (the random sequence's own when there is none): the run `heads`
    renders (anatomy_cli.api calls it too). ``progress(done, total)``: patterns scored, one per prompt and layer."""
    import torch

    from anatomy_cli import engine
    from anatomy_cli.analyses import heads as analysis
    ids = analysis.random_repeat(engine.ordinary_token_ids(lm), seq_len, seed)
    rand = engine.encode_ids(lm, ids, text=f"<{seq_len} random tokens, seed {seed}, repeated>")
    start = rand.special.index(False)

    done, total = [0], (len(encoded) + 1) * lm.n_layers

    def reduce(i, _layer, pattern):
        done[0] += 1
        if progress is not None:
            progress(done[0], total)
        if i < len(encoded):
            return analysis.pattern_scores(pattern)
        return torch.cat([analysis.pattern_scores(pattern),
                          analysis.repeat_scores(pattern, start=start, seq_len=seq_len)])

    scores = engine.attention_patterns(lm, [*encoded, rand], reduce=reduce, batch_size=batch_size)
    options = dict(seq_len=seq_len, seed=seed, random_token_ids=ids[:seq_len], sort=sort)
    repeat = scores[-1][:, 3:]
    if not encoded:
        results = [(rand, analysis.heads(scores[-1][:, :3], repeat, measured_on="random", **options))]
    else:
        results = [(enc, analysis.heads(s, repeat, measured_on="prompt", **options)) for enc, s in zip(encoded, scores)]
    return results


def _check(info: ModelInfo, encoded: list, seq_len: int, name: str) -> None:
    """UsageError when the random sequence does not fit the context or a prompt has fewer than 2 tokens."""
    n_ctx = info.n_ctx
    extra = 0 if info.is_causal else 2  # an encoder's [CLS] ... [SEP]
    if n_ctx and 2 * seq_len + extra > n_ctx:
        raise PromptTooLong(f"--seq-len {seq_len} makes a random sequence of {2 * seq_len + extra} tokens; {name} "
                            f"takes at most {n_ctx} (use --seq-len {(n_ctx - extra) // 2} or less)")
    for i, enc in enumerate(encoded, start=1):
        if len(enc) < 2:
            which = f"prompt {i}" if len(encoded) > 1 else "the prompt"
            raise UsageError(f"{which} is {len(enc)} token: heads measures queries 1..n-1 and needs at least 2")


def _report(lm, enc, result) -> Report:
    data = {**prompt_record(lm, enc), "n_layers": lm.n_layers, "n_heads": lm.n_heads, **result.to_dict()}
    if result.measured_on == "random":  # token_ids / tokens are then the random sequence's
        data["prompt"] = None
    on = prompt_line(enc) if result.measured_on == "prompt" else "the random sequence"
    # The random sequence is on the first line: stdin tsv keeps only that one for all prompts.
    heading = [f"heads · {model_label(lm)} · {lm.n_layers} layers × {lm.n_heads} heads · induction, duplicate on "
               f"{result.seq_len} random tokens × 2, seed {result.seed}",
               f"entropy, first tok, prev tok on {on}"]
    shown = f"top {len(result.rows)} of {result.n_heads_total} heads" if len(result.rows) < result.n_heads_total \
        else f"{result.n_heads_total} heads"
    title = shown + (f" by {result.sort}" if result.sort else "")
    notes = [NOTE]
    if not lm.is_causal:
        notes.append(f"{lm.name} is bidirectional: prev_token and induction are the weight on those keys among all "
                     f"positions, before and after the query")
    return Report(data=data, sections=[Section(COLUMNS, data["heads"], title=title)], heading=heading, notes=notes)
