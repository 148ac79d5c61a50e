"""`anatomy dla PROMPT --target TOKEN`: direct logit attribution to the embedding, layers and heads."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app, warn
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
    FirstTokenFoilOpt,
    FoilIdOpt,
    FoilOpt,
    FormatOpt,
    PlotOpt,
    TargetIdOpt,
    TargetOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import UsageError
from anatomy_cli.models.adapters import heads_split as decompose_heads
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.positions import check_position
from anatomy_cli.text.records import token_record


class By(str, Enum):
    layer = "layer"
    head = "head"


class Sort(str, Enum):
    model = "model"
    abs = "abs"
    value = "value"


COLUMNS = (
    Column("component", "component"), Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("contribution", "contribution", "float", 4), Column("bar", "", "signed_bar"),
)
NOTE = ("contribution = unembedding direction · final_norm_frozen(component), the final norm's scale frozen at its "
        "value for the final residual{centred} (TransformerLens's apply_ln_to_stack); L3 = block 3 (blocks.3.*); "
        "bias = final norm's bias and LM head bias; the rows add up to the model's own {what}")


@app.command("dla")
@model_options()
@prompt_options()
def dla_command(
    prompt: PromptArg,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    foil: FoilOpt = None,
    foil_id: FoilIdOpt = None,
    first_token: FirstTokenFoilOpt = False,
    position: Annotated[Optional[int], typer.Option(
        "--position", "-p", metavar="N", show_default=False,
        help="The position whose logit is decomposed (0-based; negative counts from the end). "
        "Default: the last.")] = None,
    by: Annotated[By, typer.Option("--by", case_sensitive=False,
                                   help="'head': one row per attention head (plus the output projection's "
                                   "bias) instead of one per attention layer.")] = By.layer,
    top: Annotated[Optional[int], typer.Option(
        "--top", "-k", min=1, metavar="N", show_default=False,
        help="Keep the N rows of largest |contribution|; the rest are summed into one 'other' row, so the "
        "rows still add up to the logit. Default: every row.")] = None,
    sort: Annotated[Sort, typer.Option(
        "--sort", case_sensitive=False,
        help="Row order: 'model' (embedding, blocks in order, bias), 'abs' (largest |contribution| first) or "
        "'value' (most positive first).")] = Sort.model,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Direct logit attribution: how much each component wrote the target's logit at one position.

    One row per contribution: the embedding (and position embedding), each layer's attention and
    MLP output (--by head: each head, plus the attention output projection's bias), and a final
    'bias' row. With --foil the rows explain logit(target) - logit(foil). The final norm's scale is
    frozen at its value for the final residual; the rows add up to the model's own logit (JSON
    'total' and 'logit'). Soft-capped models (Gemma 2) are decomposed before the soft-capping.

    Examples:

    \b
        anatomy dla "The capital of Germany is" --target " Berlin"
        anatomy dla "The capital of Germany is" --target " Berlin" --foil " Paris" --by head
        anatomy dla "Thank you very" --target-id 881 --format json
        anatomy dla "The capital of Germany is" --target " Berlin" --by head --top 10 --sort abs
    """
    wanted = targets.choice(target, target_id, first_token=first_token)
    if wanted is None:
        raise UsageError("dla needs a token: give --target TEXT or --target-id N")
    foiled = targets.choice(foil, foil_id, option="--foil", first_token=first_token)
    targets.check_first_token(first_token, wanted, foiled, options="--target or --foil")
    ids: dict[str, int] = {}

    opened, encoded = open_prompts(prompt, spec, prompts)
    adapter = opened.adapter
    if not adapter.causal or adapter.post_ln:
        raise UsageError(f"dla needs a linear path from the residual stream to the logits; {spec.model} "
                         f"({adapter.name}) has a non-linear masked-LM head (dense, GELU, LayerNorm) after "
                         "post-LN blocks, so its logits are not a sum of per-component terms")
    if by is By.head and decompose_heads(adapter) is None:
        raise UsageError(f"dla --by head: {spec.model} ({adapter.name}) adds its attention output through a "
                         "module that is neither the output projection nor a norm, so it does not split into "
                         "heads; use --by layer")
    check_position(position, encoded)
    vocab = opened.info.lm_head_rows
    for key, choice in (("target", wanted), ("foil", foiled)):
        if choice is not None:
            ids[key] = targets.resolve(opened.tokenizer, choice, model=spec.model, vocab_size=vocab)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli import engine
    from anatomy_cli.analyses import dla as analysis
    from anatomy_cli.engine import decompose
    if not lm.has_unembed:
        raise UsageError(f"{lm.name} has no LM head (unembedding): there is no logit to attribute")
    if ids.get("foil") is not None and ids["foil"] == ids["target"]:
        raise UsageError("--foil is the same token as --target: their logit difference is 0 by definition")
    names = decompose.names(lm, by_head=by is By.head)
    pos = -1 if position is None else position
    caches = engine.run(lm, encoded, names, positions=[[pos]] * len(encoded), batch_size=batch_size)
    unembedding = decompose.unembedding_direction(lm, ids["target"], ids.get("foil"))
    name_token = describe(lm)
    reports = []
    for enc, cache in zip(encoded, caches):
        result = analysis.logit_attribution(lm, cache, ids["target"], ids.get("foil"), by_head=by is By.head,
                                            unembedding=unembedding)
        if (mismatch := result.mismatch()) is not None:
            warn(mismatch)
        reports.append(_report(lm, enc, cache.positions[0], result.select(top, sort.value), ids, name_token, by))
        if plot:
            from anatomy_cli.output import plots

            what = f"logit({name_token(ids['target'])[0]})" + (
                f" − logit({name_token(ids['foil'])[0]})" if ids.get("foil") is not None else "")
            cap = plots.Caption.of("dla", lm, enc.text, f"position {cache.positions[0]} = "
                                   f"{enc.pieces[cache.positions[0]]}")
            plots.draw("dla", plot, len(reports) if prompt == "-" else None, result, lm.n_layers, lm.n_heads, what, cap)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")




def _report(lm, enc, pos: int, result, ids: dict[str, int], name_token, by: By) -> Report:
    def token(i: int | None) -> dict[str, Any] | None:
        return None if i is None else token_record(i, *name_token(i))

    target, foil = token(ids["target"]), token(ids.get("foil"))
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos], "target": target,
            "foil": foil, "by": by.value, **result.to_dict()}
    what = (f"logit({target['token']}) − logit({foil['token']})" if foil else f"logit({target['token']})")
    heading = [f"dla · {model_label(lm)} · {lm.n_layers} layers",
               f"{prompt_line(enc)} · position {pos} = {enc.pieces[pos]} · {what}"]
    biggest = max((abs(r["contribution"]) for r in data["rows"]), default=0.0) or 1.0
    rows = [{**r, "bar": r["contribution"] / biggest} for r in data["rows"]]
    notes = [NOTE.format(centred=", each contribution centred (LayerNorm)" if result.centred else "",
                         what="logit difference" if foil else "logit"),
             f"sum of rows {result.total:.6f} · model's {what} {result.logit:.6f}"]
    if result.head_norm:
        notes.insert(1, f"per head: each head's output through {result.head_norm} (the norm after attention), "
                     "its scale frozen at its value on this prompt, so the heads add up to the attention output")
    if result.other_rows:
        notes.insert(1, f"other = the sum of the {result.other_rows} rows outside the --top {len(rows) - 1}")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="direct logit attribution")],
                  heading=heading, notes=notes)
