"""`anatomy ablate PROMPT --target TOKEN`: knock out each layer's attention / MLP (or each head) and
see what happens to the target."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands import _attribution
from anatomy_cli.cli.commands._attribution import CheckOpt, Method, MethodOpt
from anatomy_cli.cli.commands._common import (
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
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text import records as text_records
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.positions import check_position


class AblateMode(str, Enum):
    zero = "zero"
    mean = "mean"


COLUMNS = (Column("layer", "layer", "int"), Column("component", "component"), Column("head", "head", "int"),
           Column("metric", "metric", "float", 4), Column("effect", "effect", "float", 4))
RunsPerForwardOpt = Annotated[int, typer.Option(
    "--batch-size", min=1, help="Ablated runs per forward pass (more: faster, more memory).")]


@app.command("ablate")
@model_options()
@prompt_options()
def ablate_command(
    prompt: PromptArg,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    foil: FoilOpt = None,
    foil_id: FoilIdOpt = None,
    first_token: FirstTokenFoilOpt = False,
    position: Annotated[int, typer.Option(
        "--position", "-p", metavar="N", help="Where to read the metric (0-based; negative from the end).")] = -1,
    heads: Annotated[bool, typer.Option(
        "--heads", help="Ablate every attention head separately (its slice of the output projection's input) "
        "instead of whole attention and MLP outputs.")] = False,
    mode: Annotated[AblateMode, typer.Option(
        "--mode", case_sensitive=False, help="zero: replace the output by zeros; mean: by its mean over the "
        "prompt's positions.")] = AblateMode.zero,
    method: MethodOpt = Method.exact,
    check_n: CheckOpt = 0,
    layer: Annotated[Optional[int], typer.Option(
        "--layer", "-l", metavar="L", show_default=False,
        help="Only layer L (0-based; negative from the end).")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: RunsPerForwardOpt = 32,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Knock out each layer's attention output, then its MLP output (or, with --heads, each head), and
    report the target's log-probability at --position, or logit(target) - logit(foil) with --foil,
    and its change from the intact run.

    The knocked-out output is replaced at every position: by zeros (--mode zero) or by its mean
    over the prompt's positions (--mode mean). All ablations of a prompt run in a few batched forwards;
    --method attribution estimates them all from one backward, (a_ablated - a) . dm/da; --check N reruns
    the N largest exactly.

    Examples:

    \b
        anatomy ablate "The capital of Germany is" --target " Berlin" -m SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy ablate "The capital of Germany is" --target " Berlin" --foil " Paris" --mode mean
        anatomy ablate "Thank you very" --target " much" --heads --layer -1 --format json
        anatomy ablate "Thank you very" --target " much" --heads --method attribution --check 8
    """
    from anatomy_cli.text import targets

    wanted = targets.choice(target, target_id, option="--target", first_token=first_token)
    unwanted = targets.choice(foil, foil_id, option="--foil", first_token=first_token)
    targets.check_first_token(first_token, wanted, unwanted, options="--target or --foil")
    _attribution.check_options(method, check_n)
    if wanted is None:
        raise UsageError("--target TEXT or --target-id N is required: the token whose log-probability ablations "
                         "change, e.g. --target ' much'")

    opened, encoded = open_prompts(prompt, spec, prompts)
    _check_decoder(spec.model, opened.adapter.causal)
    if layer is not None and not -opened.info.n_layers <= layer < opened.info.n_layers:
        raise UsageError(f"--layer {layer} is out of range: {spec.model} has layers 0..{opened.info.n_layers - 1}")
    check_position(position, encoded)
    ids = targets.resolve_pair(opened.tokenizer, wanted, unwanted, model=spec.model,
                               vocab_size=opened.info.lm_head_rows)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.engine import interventions
    _check_decoder(lm.name, lm.is_causal and lm.has_unembed)
    layers = None if layer is None else [layer % lm.n_layers]
    plan = interventions.ablation_rows(lm, components=["head"] if heads else ["attn", "mlp"], mode=mode.value,
                                       layers=layers)
    metric = analysis.metric_fn(ids["target"], ids["foil"])
    if method is Method.exact:
        from anatomy_cli.models import cost
        warn_cost(f"ablate: {len(plan) * len(encoded):,} ablated runs", lm,
                  sum((len(plan) + 1) * cost.forward_flops(lm.info, len(e)) for e in encoded))
    reports = []
    for enc in encoded:
        with status("ablate") as line:
            result, extra = run(lm, enc, plan, metric, ids, mode.value, method, position, check_n, batch_size,
                                progress=line.counter("ablate", "ablated runs"))
        reports.append(_attribution.extend(_report(lm, enc, position % len(enc), ids, result), extra))
        if plot:
            from anatomy_cli.output import plots

            what = _metric_name(lm, ids)
            how = "attribution estimate of the " if extra else ""
            cap = plots.Caption.of("ablate", lm, enc.text, f"{how}{result.mode} ablation · position "
                                   f"{position % len(enc)} = {enc.pieces[position % len(enc)]}")
            plots.draw("ablate", plot, len(reports) if prompt == "-" else None, result, lm.n_heads, what, cap)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def run(lm, enc, plan, metric, ids: dict, mode: str, method: Method, position: int, check_n: int | None,
        batch_size: int, progress=None) -> tuple:
    """``(Ablation, attribution extra or None)`` for one prompt: the run `ablate` renders (anatomy_cli.api
    calls it too). ``progress(runs done, runs)``: the ablated runs (not the attribution estimate)."""
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.engine import interventions
    extra = None
    if method is Method.attribution:
        base, edited, extra = _attribution.ablate(lm, enc.ids, plan, metric, position=position, check=check_n,
                                                  batch_size=batch_size)
    else:
        base, edited = interventions.run_edits(lm, enc.ids, [edits for *_, edits in plan], position=position,
                                               batch_size=batch_size, reduce=metric, progress=progress)
        base = float(base[0])
    result = analysis.ablation("logit_diff" if ids["foil"] is not None else "logprob", mode,
                               [key for *key, _ in plan], edited, base)
    return result, extra


def _metric_name(lm, ids: dict) -> str:
    """``log p(·much)`` or ``logit(·much) - logit(·so)``, as in the heading."""
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    return f"logit({target['token']}) - logit({foil['token']})" if foil else f"log p({target['token']})"


def _check_decoder(name: str, ok: bool) -> None:
    if not ok:
        raise UsageError(f"{name} is an encoder, not a next-token predictor; ablate and patch need a decoder-only "
                         "model with an LM head")


def token_record(lm, token_id: int | None) -> dict | None:
    """``{"token_id": 881, "token": "·much", "text": " much"}`` (None for None): the one token record."""
    return None if token_id is None else text_records.token_record(token_id, *describe(lm)(token_id))


def _report(lm, enc, pos: int, ids: dict, result) -> Report:
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos], "target": target,
            "foil": foil, **result.to_dict()}
    what = f"logit({target['token']}) - logit({foil['token']})" if foil else f"log p({target['token']})"
    heading = [f"ablate · {model_label(lm)} · {result.mode} ablation",
               f"{prompt_line(enc)} · metric at position {pos} = {enc.pieces[pos]}",
               f"metric {what}; intact run: {result.clean_metric:.4f}"]
    by = "zeros" if result.mode == "zero" else "its mean over the prompt's positions"
    notes = [(f"each row replaces one component's output at every position by {by}; "
              "effect = metric - intact metric (negative: the component helped the target)")]
    return Report(data=data, sections=[Section(COLUMNS, data["rows"])], heading=heading, notes=notes)
