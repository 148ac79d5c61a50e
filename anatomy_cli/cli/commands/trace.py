"""`anatomy trace PROMPT`: the residual stream at one position, layer by layer, with the logit lens."""

from __future__ import annotations

from typing import Annotated, Optional

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
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.positions import check_position
from anatomy_cli.text.records import token_record

LAYER_COLUMNS = (
    Column("layer", "layer", "int"),
    Column("cos_to_embedding", "cos emb", "float", 3),
    Column("cos_to_previous", "cos prev", "float", 3),
    Column("resid_norm", "‖h‖", "float", 2),
    Column("attn_norm", "‖attn‖", "float", 2),
    Column("mlp_norm", "‖mlp‖", "float", 2),
    Column("lens_token", "lens"),
    Column("lens_probability", "lens p", "prob", 4),
)
TARGET_COLUMNS = (  # --target: the target token in each layer's lens distribution
    Column("target_rank", "target rank", "int"),
    Column("target_probability", "target p", "prob", 4),
)
TOP_COLUMNS = (
    Column("rank", "rank", "int"),
    Column("token", "token"),
    Column("token_id", "id", "id"),
    Column("probability", "probability", "prob", 4),
)
LAYERS_NOTE = ("layer 0 = {embedding}; layer {L} = last block's output{final}; "
               "cos emb / cos prev = cosine of h to layer 0 / to the layer before; ‖attn‖, ‖mlp‖ = what that "
               "layer's attention / MLP added; lens = top token of unembed(final_norm(h)), the norm recomputed "
               "from h itself")


@app.command("trace")
@model_options()
@prompt_options()
def trace_command(
    prompt: PromptArg,
    position: Annotated[Optional[int], typer.Option(
        "--position", "-p", metavar="N", show_default=False,
        help="Token position to follow (0-based; negative counts from the end, -1 = last token). "
             "Default: the last token; for encoders the last one that is not [SEP]/[CLS].")] = None,
    k: Annotated[int, typer.Option("--top", "-k", "--k", min=1, metavar="N",
                                   help="How many top next tokens to list.")] = 5,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    first_token: FirstTokenOpt = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Follow one token position through every layer: how much of the embedding survives, what each
    layer adds, and what the model would predict if it stopped there (the logit lens).

    One row per layer 0..L: cosine to the embedding and to the previous layer, the residual norm,
    the norms of what attention and the MLP added, and the logit lens's top token and probability.
    Then the model's own top-k next tokens. Encoders (BERT) have no next token: for them the lens
    and top-k read the masked-LM head at the position, or are omitted when there is no head.

    Examples:

    \b
        anatomy trace "Thank you very"
        anatomy trace "Thank you very" --position 1 --top 10
        anatomy trace "Thank you very" --init random --format json
        printf 'Thank you very\\nThe capital of France is\\n' | anatomy trace - --format jsonl
    """
    wanted = targets.choice(target, target_id, first_token=first_token)
    targets.check_first_token(first_token, wanted)
    opened, encoded = open_prompts(prompt, spec, prompts)
    check_position(position, encoded)
    target_id = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=spec.model,
                                                             vocab_size=opened.info.lm_head_rows)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli.output import plots
    if wanted is not None and not lm.has_unembed:
        raise UsageError(f"--target needs the logit lens, and {lm.name} has no LM head (unembedding)")
    reports = []
    for enc, (pos, result, target_info) in zip(encoded, run(lm, encoded, position, k, target_id, batch_size)):
        reports.append(_report(lm, enc, pos, result, target=target_info))
        if plot:
            detail = f"position {pos} = {enc.pieces[pos]}"
            plots.draw("trace", plot, len(reports) if prompt == "-" else None, result,
                       plots.Caption.of("trace", lm, enc.text, detail))
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def run(lm, encoded: list, position: int | None, k: int, target_id: int | None, batch_size: int) -> list[tuple]:
    """``(position, Trace, target record or None)`` per prompt: the run `trace` renders (anatomy_cli.api
    calls it too)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import trace as analysis
    if position is None:
        # An encoder's last token is its [SEP]: follow the last token of the text instead.
        positions = [[_last_text_token(enc)] for enc in encoded]
    else:
        positions = [[position]] * len(encoded)
    names = engine.residual_names(lm) + engine.layer_names(lm, "attn_out") + engine.layer_names(lm, "mlp_out")
    if lm.has_unembed:
        names.append("logits")
    with status(f"running {len(encoded)} prompt{'' if len(encoded) == 1 else 's'}"):
        caches = engine.run(lm, encoded, names, positions=positions, batch_size=batch_size)
    name_token = describe(lm)
    out = []
    for cache in caches:
        resid = cache.residual_stream()[:, 0]
        result = analysis.trace(
            resid, attn_out=cache.stack("attn_out")[:, 0], mlp_out=cache.stack("mlp_out")[:, 0],
            lens_logits=engine.unembed(lm, resid) if lm.has_unembed else None,
            logits=cache.logits[0] if lm.has_unembed else None, k=k, describe=name_token,
            target_id=target_id)
        target_info = token_record(target_id, *name_token(target_id)) if target_id is not None else None
        out.append((cache.positions[0], result, target_info))
    return out


def _last_text_token(enc) -> int:
    text_positions = [i for i, special in enumerate(enc.special) if not special]
    return text_positions[-1] if text_positions else len(enc) - 1


def _report(lm, enc, pos: int, result, target: dict | None = None) -> Report:
    predicts = None if not lm.has_unembed else ("next" if lm.is_causal else "masked")
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos],
            "n_layers": lm.n_layers, "predicts": predicts, "target": target, **result.to_dict()}
    heading = [f"trace · {model_label(lm)} · {lm.n_layers} layers",
               f"{prompt_line(enc)} · position {pos} = {enc.pieces[pos]}"]
    embedding = "embedding (token + position)" if lm.adapter.pos_embed else "token embedding (rotary positions)"
    notes = [LAYERS_NOTE.format(L=lm.n_layers, embedding=embedding,
                                final=" before the final norm" if lm.adapter.final_norm else "")]
    if not lm.has_unembed:
        notes = [notes[0].split("; lens = ")[0]]
    columns = LAYER_COLUMNS + (TARGET_COLUMNS if target else ())
    sections = [Section(columns, data["layers"], title="residual stream")]
    if predicts == "next":
        sections.append(Section(TOP_COLUMNS, data["top"], title=f"top {len(result.top)} next tokens"))
    elif predicts == "masked":
        sections.append(Section(TOP_COLUMNS, data["top"],
                                title=f"top {len(result.top)} tokens at position {pos} (masked-LM head)"))
        notes.append(f"{lm.name} is an encoder: the lens and the top tokens read its masked-LM head, the token "
                     f"it predicts AT position {pos}, not a next token")
    else:
        notes.append(f"logit lens unavailable: {lm.name} has no LM head (unembedding)")
    return Report(data=data, sections=sections, heading=heading, notes=notes)
