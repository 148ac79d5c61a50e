"""`anatomy patch CLEAN CORRUPT --target TOKEN`: activation patching, one site x layer x position grid."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands import _attribution
from anatomy_cli.cli.commands._attribution import CheckOpt, Method, MethodOpt
from anatomy_cli.cli.commands._common import (
    load_weights,
    model_label,
    open_texts,
    prompt_line,
    warn_cost,
)
from anatomy_cli.cli.commands.ablate import _check_decoder, token_record
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
from anatomy_cli.cli.records import model_record
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Format, Report, Section, emit, resolve_format
from anatomy_cli.text.options import PromptOptions


class PatchSite(str, Enum):
    resid_pre = "resid_pre"
    attn_out = "attn_out"
    mlp_out = "mlp_out"
    head = "head"
    resid_post = "resid_post"


CELL_COLUMNS = (Column("layer", "layer", "int"), Column("position", "position", "int"),
                Column("head", "head", "int"), Column("value", "value", "float", 3),
                Column("metric", "metric", "float", 4))


@app.command("patch")
@model_options()
@prompt_options(truncate=False)
def patch_command(
    clean: Annotated[str, typer.Argument(metavar="CLEAN", show_default=False,
                                         help="The prompt whose activations are copied in.")],
    corrupt: Annotated[str, typer.Argument(metavar="CORRUPT", show_default=False,
                                           help="The prompt that is run and patched; same token count as CLEAN.")],
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    foil: FoilOpt = None,
    foil_id: FoilIdOpt = None,
    first_token: FirstTokenFoilOpt = False,
    site: Annotated[PatchSite, typer.Option(
        "--site", case_sensitive=False, help="resid_pre: input of block l; attn_out / mlp_out: what block l's "
        "attention / MLP adds; head: one head at all positions (layer x head grid); resid_post: output of "
        "block l.")] = PatchSite.resid_pre,
    method: MethodOpt = Method.exact,
    check_n: CheckOpt = 0,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Patched runs per forward pass (more: faster, more memory).")] = 32,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Activation patching: run CORRUPT, and at one site, layer and position replace the activation
    with CLEAN's; one patched run per cell of the grid.

    Each cell is (m - m_corrupt) / (m_clean - m_corrupt) at the last position, where m is
    logit(target) - logit(foil), or the target's logit without --foil: 0 = the corrupt run,
    1 = the clean run. The patched runs go in batches of --batch-size, each starting from the
    corrupt run's activations at the patched layer. --method attribution estimates every cell
    at once from one backward (attribution patching); --check N reruns the N largest exactly.

    Examples:

    \b
        anatomy patch "The Eiffel Tower is in the city of" "The Colosseum is in the city of" \\
            --target " Paris" --foil " Rome" -m SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy patch "The Eiffel Tower is in the city of" "The Colosseum is in the city of" \\
            --target " Paris" --foil " Rome" --site head --format json
        anatomy patch CLEAN CORRUPT --target " Paris" --foil " Rome" --site head --method attribution --check 10
    """
    from anatomy_cli.text import targets

    for name, text in (("CLEAN", clean), ("CORRUPT", corrupt)):
        if text == "":
            raise UsageError(f"{name} is empty: give some text")
    wanted = targets.choice(target, target_id, option="--target", first_token=first_token)
    unwanted = targets.choice(foil, foil_id, option="--foil", first_token=first_token)
    targets.check_first_token(first_token, wanted, unwanted, options="--target or --foil")
    _attribution.check_options(method, check_n)
    if wanted is None:
        raise UsageError("--target TEXT or --target-id N is required: the token whose logit patching moves, "
                         "e.g. --target ' Paris'")
    opened, (enc_clean, enc_corrupt) = open_texts([clean, corrupt], spec, prompts, truncate_hint=False)
    _check_decoder(spec.model, opened.info.is_causal)
    if len(enc_clean) != len(enc_corrupt):
        raise UsageError(f"CLEAN and CORRUPT must have the same number of tokens: CLEAN is {len(enc_clean)} "
                         f"({' '.join(enc_clean.pieces)}), CORRUPT is {len(enc_corrupt)} "
                         f"({' '.join(enc_corrupt.pieces)})")
    ids = targets.resolve_pair(opened.tokenizer, wanted, unwanted, model=spec.model,
                               vocab_size=opened.info.lm_head_rows)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    _check_decoder(lm.name, lm.is_causal and lm.has_unembed)
    if method is Method.exact:
        from anatomy_cli.models import cost
        runs = lm.n_layers * (lm.n_heads if site is PatchSite.head else len(enc_corrupt))
        warn_cost(f"patch: {runs:,} patched runs of {len(enc_corrupt):,} tokens", lm,
                  (runs + 1) * cost.forward_flops(lm.info, len(enc_corrupt)))
    with status("patch") as line:
        result, extra = run(lm, enc_clean, enc_corrupt, site.value, ids, method, check_n, batch_size,
                            progress=line.counter("patch", "patched runs"))
    fmt = resolve_format(fmt)
    emit(_attribution.extend(_report(lm, enc_clean, enc_corrupt, ids, result, wide=fmt is Format.table), extra,
                             grid=True), fmt)
    if plot:
        from anatomy_cli.output import plots
        from anatomy_cli.output.plots._text import shorten

        target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
        what = f"logit({target['token']}) - logit({foil['token']})" if foil else f"logit({target['token']})"
        how = " · attribution patching (estimates)" if extra else ""
        cap = plots.Caption.of("patch", lm, clean, f"corrupt '{shorten(corrupt, 40)}' · site {result.site}{how}")
        plots.draw("patch", plot, None, result, enc_clean.pieces, enc_corrupt.pieces, what, cap)


def run(lm, enc_clean, enc_corrupt, site: str, ids: dict, method: Method, check_n: int | None,
        batch_size: int, progress=None) -> tuple:
    """``(Patching, attribution extra or None)``: the run `patch` renders (anatomy_cli.api calls it too).
    ``progress(runs done, runs)``: the patched runs (not the attribution estimate)."""
    from anatomy_cli.analyses import patch as analysis
    from anatomy_cli.engine import interventions
    extra = None
    if method is Method.attribution:
        result, extra = _attribution.patch(lm, enc_clean.ids, enc_corrupt.ids, site, ids, check_n, batch_size)
    else:
        grid = interventions.patch_grid(lm, enc_clean.ids, enc_corrupt.ids, site, batch_size=batch_size,
                                       reduce=analysis.logit_metric(ids["target"], ids["foil"]), progress=progress)
        result = analysis.patching(site, "logit_diff" if ids["foil"] is not None else "logit", grid.layers,
                                   grid.columns, grid.grid, float(grid.clean), float(grid.corrupt))
    return result, extra


def _prompt(enc) -> dict:
    return {"prompt": enc.text, "token_ids": list(enc.ids), "tokens": list(enc.pieces)}


def _report(lm, clean, corrupt, ids: dict, result, *, wide: bool) -> Report:
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    differ = [i for i, (a, b) in enumerate(zip(clean.ids, corrupt.ids)) if a != b]
    data = {**model_record(lm), "bos": clean.bos, "bos_source": clean.bos_source,
            "clean": _prompt(clean), "corrupt": _prompt(corrupt),
            "differing_positions": differ, "target": target, "foil": foil, **result.to_dict()}
    what = f"logit({target['token']}) - logit({foil['token']})" if foil else f"logit({target['token']})"
    heading = [f"patch · {model_label(lm)} · site {result.site} · {len(result.cells)} patched runs",
               f"clean   {prompt_line(clean)}", f"corrupt {prompt_line(corrupt)}",
               (f"metric {what} at the last position: clean {result.clean_metric:.4f}, "
                f"corrupt {result.corrupt_metric:.4f}")]
    notes = ["value = (m - m_corrupt) / (m_clean - m_corrupt): 0 = corrupt run, 1 = clean run"]
    if result.clean_metric == result.corrupt_metric:
        notes.append("the clean and corrupt metrics are equal: the normalized values are undefined (empty)")
    if not wide:
        return Report(data=data, sections=[Section(CELL_COLUMNS, data["cells"])], heading=heading, notes=notes)
    per_head = result.site == "head"
    columns = [Column("layer", "layer", "int")]
    for c in result.columns:
        title = f"h{c}" if per_head else f"{c} {clean.pieces[c]}" + ("*" if c in differ else "")
        columns.append(Column(f"c{c}", title, "float", 2))
    rows = [{"layer": layer, **{f"c{c}": result.value(layer, c) for c in result.columns}} for layer in result.layers]
    if not per_head:
        notes.append("columns: position and CLEAN's token; * = CLEAN and CORRUPT differ there")
    title = "layer x head (each head patched at every position)" if per_head else "layer x position"
    return Report(data=data, sections=[Section(columns, rows, title=title)], heading=heading, notes=notes)
