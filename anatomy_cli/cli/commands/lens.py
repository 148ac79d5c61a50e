"""`anatomy lens PROMPT`: the logit lens at every layer and position, optionally following a target token."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import (
    BatchSizeOpt,
    PromptArg,
    describe,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
    warn_cost,
)
from anatomy_cli.cli.options import (
    FirstTokenOpt,
    FormatOpt,
    PlotOpt,
    TargetIdOpt,
    TargetOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Format, Report, Section, resolve_format
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions

HOVER_TOP = 5  # top tokens per cell in an HTML page's hover text


class Stat(str, Enum):
    prob = "prob"
    logprob = "logprob"
    rank = "rank"
    entropy = "entropy"
    kl = "kl"


CELL_COLUMNS = (
    Column("layer", "layer", "int"), Column("position", "pos", "int"), Column("token", "token"),
    Column("token_id", "id", "id"), Column("probability", "probability", "prob", 4),
    Column("logprob", "logprob", "float", 3), Column("entropy", "entropy", "float", 3), Column("kl", "kl", "float", 3),
)
TARGET_COLUMNS = (Column("target_rank", "target rank", "int"), Column("target_probability", "target p", "prob", 4))
NOTE = ("layer 0 = {embedding}; layer {L} = last block's output; each cell is the top token of "
        "softmax(unembed(final_norm(h))) at that layer and position, the norm recomputed from h itself; "
        "{stat}")
STAT_NOTE = {"prob": "number = its probability", "logprob": "number = its natural-log probability",
             "rank": "number = the target's rank (1 = top)",
             "entropy": "number = the entropy of the distribution (nats)",
             "kl": "number = KL(final layer || this layer) in nats"}


@app.command("lens")
@model_options()
@prompt_options()
def lens_command(
    prompt: PromptArg,
    stat: Annotated[Stat, typer.Option("--stat", "-s", case_sensitive=False,
                                       help="The number shown in each cell ('rank' needs --target).")] = Stat.prob,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    first_token: FirstTokenOpt = False,
    layers: Annotated[Optional[str], typer.Option(
        "--layers", metavar="L,L,...", show_default=False,
        help="Show only these layers (0 = embedding .. L = last block); the last layer is always kept.")] = None,
    stride: Annotated[Optional[int], typer.Option(
        "--stride", min=1, metavar="N", show_default=False,
        help="Show every N-th layer (0, N, 2N, ...) and the last.")] = None,
    k: Annotated[Optional[int], typer.Option(
        "--top", "-k", "--k", min=1, metavar="N", show_default=False,
        help="The N most probable tokens per cell (JSON 'top'; the table lists them in the cell).")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """The logit lens at every layer and position: what the model would predict if it stopped there.

    A grid with layers 0..L as rows and the prompt's positions as columns; each cell is the most
    probable token of unembed(final_norm(h)) at that layer and position, with --stat's number.
    --target adds the target's rank and probability in every cell and, per position, the first
    layer where it is the top token. The table shows the grid; tsv/csv/json give one row per cell.

    Examples:

    \b
        anatomy lens "The capital of Germany is"
        anatomy lens "The capital of Germany is" --target " Berlin" --stat rank
        anatomy lens "Thank you very" --stride 4 --stat entropy
        anatomy lens "Thank you very" --layers 0,6,12 --top 3 --format json
    """
    wanted = targets.choice(target, target_id, first_token=first_token)
    targets.check_first_token(first_token, wanted)
    if stat is Stat.rank and wanted is None:
        raise UsageError("--stat rank is the target's rank: give --target TEXT or --target-id N")
    if layers is not None and stride is not None:
        raise UsageError("--layers and --stride both thin the rows: give one of them")
    chosen = _parse_layers(layers) if layers is not None else None
    opened, encoded = open_prompts(prompt, spec, prompts)
    rows = _rows(opened.info.n_layers, chosen, stride)
    target_token = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=spec.model,
                                                               vocab_size=opened.info.lm_head_rows)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli import engine
    from anatomy_cli.analyses import lens as analysis
    if not lm.has_unembed:
        raise UsageError(f"{lm.name} has no LM head (unembedding): the logit lens has nothing to read tokens from")
    from anatomy_cli.models import cost
    n_tokens = sum(len(e) for e in encoded)
    warn_cost(f"lens on {n_tokens:,} tokens", lm,
              sum(cost.forward_flops(lm.info, len(e)) + cost.lens_flops(lm.info, len(e)) for e in encoded))
    with status(f"running {lm.name}"):
        caches = engine.run(lm, encoded, engine.residual_names(lm), batch_size=batch_size)
    name_token = describe(lm)
    as_grid = resolve_format(fmt) is Format.table
    from anatomy_cli.output import plots

    # An HTML page's hover text lists each cell's top 5 tokens, whatever --k the table shows.
    k_run = max(k or 1, HOVER_TOP) if plots.is_html(plot) else k
    reports = []
    for i, (enc, cache) in enumerate(zip(encoded, caches), start=1):
        what = f"lens · prompt {i}/{len(encoded)}" if len(encoded) > 1 else "lens"
        with status(what) as line:
            grid = analysis.lens_grid(cache.residual_stream(), lambda h: engine.unembed(lm, h), describe=name_token,
                                      positions=cache.positions, k=k_run, target_id=target_token,
                                      progress=line.counter(what, "positions"))
        grid = grid.select(rows)
        reports.append(_report(lm, enc, grid.keep_top(k) if k_run != k else grid, stat.value, as_grid))
        if plot:
            cap = plots.Caption.of("lens", lm, enc.text, f"--stat {stat.value}")
            plots.draw("lens", plot, len(reports) if prompt == "-" else None,
                       grid, stat.value, [enc.pieces[p] for p in grid.positions], cap)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _parse_layers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--layers {text!r}: give layer numbers separated by commas, e.g. 0,6,12") from None
    if not values:
        raise UsageError("--layers is empty: give layer numbers separated by commas, e.g. 0,6,12")
    negative = [v for v in values if v < 0]
    if negative:
        raise UsageError(f"--layers: layer {negative[0]} is negative; layers count from 0 (the embedding)")
    return values


def _rows(n_layers: int, chosen: list[int] | None, stride: int | None) -> list[int]:
    """The layers to show, ascending, the last (``n_layers``) always included."""
    if chosen is not None:
        bad = [v for v in chosen if v > n_layers]
        if bad:
            raise UsageError(f"--layers: layer {bad[0]} is out of range; this model has layers 0..{n_layers} "
                             f"(0 = embedding, {n_layers} = last block)")
        wanted = set(chosen)
    else:
        wanted = set(range(0, n_layers + 1, stride or 1))
    return sorted(wanted | {n_layers})


def _fmt(value: float, stat: str) -> str:
    if stat == "rank":
        return f"#{int(value)}"
    if stat == "prob":
        return f"{value:.2f}" if value >= 0.005 else f"{value:.0e}"
    return f"{value:.2f}"


def _report(lm, enc, grid, stat: str, as_grid: bool) -> Report:
    data = {**prompt_record(lm, enc), "n_layers": lm.n_layers, "predicts": "next" if lm.is_causal else "masked",
            "stat": stat, **grid.to_dict()}
    cells = data["cells"]
    heading = [f"lens · {model_label(lm)} · {lm.n_layers} layers", prompt_line(enc)]
    embedding = "embedding (token + position)" if lm.adapter.pos_embed else "token embedding"
    notes = [NOTE.format(embedding=embedding, L=lm.n_layers, stat=STAT_NOTE[stat])]
    if not lm.is_causal:
        notes.append(f"{lm.name} is an encoder: each cell reads its masked-LM head, the token it predicts AT that "
                     "position, not a next token")
    if grid.target_id is not None:
        first = ", ".join(f"{p}: {'-' if layer is None else layer}"
                          for p, layer in zip(grid.positions, data["target"]["first_layer"]))
        notes.append(f"target {grid.target_token} ({grid.target_id}): first layer where it is the top token, by "
                     f"position: {first}")
    if not as_grid:
        columns = list(CELL_COLUMNS) + (list(TARGET_COLUMNS) if grid.target_id is not None else [])
        rows = cells
        if grid.k_given:
            columns.append(Column("top_tokens", "top"))
            rows = [{**c, "top_tokens": " ".join(t["token"] for t in c["top"])} for c in cells]
        return Report(data=data, sections=[Section(columns, rows, title="logit lens")], heading=heading, notes=notes)
    values = grid.stat(stat).tolist()
    columns = [Column("layer", "layer", "int")] + [Column(f"p{p}", f"{p} {enc.pieces[p]}") for p in grid.positions]
    rows = []
    for r, layer in enumerate(grid.layers):
        row: dict[str, Any] = {"layer": layer}
        for c, p in enumerate(grid.positions):
            if grid.k_given and stat in ("prob", "logprob"):
                top = cells[r * len(grid.positions) + c]["top"]
                row[f"p{p}"] = " ".join(
                    f"{t['token']} {_fmt(t['probability'] if stat == 'prob' else t['logprob'], stat)}" for t in top)
            else:
                tokens = " ".join(grid.top_tokens[r][c])
                row[f"p{p}"] = f"{tokens} {_fmt(values[r][c], stat)}"
        rows.append(row)
    sections = [Section(columns, rows, title=f"logit lens: top token · {stat}")]
    if grid.target_id is not None:
        ranks, probs = grid.target_ranks.tolist(), grid.target_logprobs.exp().tolist()
        target_rows = [{"layer": layer, **{f"p{p}": f"#{ranks[r][c]} {_fmt(probs[r][c], 'prob')}"
                                           for c, p in enumerate(grid.positions)}}
                       for r, layer in enumerate(grid.layers)]
        sections.append(Section(columns, target_rows, title=f"target {grid.target_token}: rank · probability"))
    return Report(data=data, sections=sections, heading=heading, notes=notes)
