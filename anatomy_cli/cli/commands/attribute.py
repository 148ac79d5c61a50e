"""`anatomy attribute PROMPT --target TOKEN`: which input tokens drove the prediction (Captum)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import (
    PromptArg,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
)
from anatomy_cli.cli.commands.ablate import _check_decoder, _metric_name, token_record
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
from anatomy_cli.text.options import PromptOptions


class AttributionMethod(str, Enum):
    saliency = "saliency"
    input_x_gradient = "input-x-gradient"
    integrated_gradients = "integrated-gradients"
    occlusion = "occlusion"


class Baseline(str, Enum):
    zero = "zero"
    pad = "pad"
    unk = "unk"
    drop = "drop"


COLUMNS = (Column("position", "position", "int"), Column("token", "token"),
           Column("attribution", "attribution", "number", 4), Column("share", "share", "float", 3),
           Column("magnitude", "", "bar"))
HOW = {"saliency": "the L2 norm of the metric's gradient with respect to the token's embedding (Captum Saliency)",
       "input-x-gradient": "embedding · gradient, summed over the embedding (Captum InputXGradient)",
       "integrated-gradients": "integrated gradients from the baseline to the embedding, summed over the "
                               "embedding (Captum IntegratedGradients)",
       "occlusion": "metric - metric with the token {occluded} (Captum FeatureAblation)"}


@app.command("attribute")
@model_options()
@prompt_options()
def attribute_command(
    prompt: PromptArg,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    foil: FoilOpt = None,
    foil_id: FoilIdOpt = None,
    first_token: FirstTokenFoilOpt = False,
    method: Annotated[AttributionMethod, typer.Option(
        "--method", case_sensitive=False, help="saliency: gradient norm per token; input-x-gradient; "
        "integrated-gradients (--steps, --baseline); occlusion: drop or replace one token at a time, no "
        "gradients.")] = AttributionMethod.integrated_gradients,
    steps: Annotated[int, typer.Option(
        "--steps", min=1, help="Integrated gradients: points on the path (more: smaller completeness error).")] = 32,
    baseline: Annotated[Optional[Baseline], typer.Option(
        "--baseline", case_sensitive=False, show_default=False,
        help="Integrated gradients: zero (default), pad or unk embeddings at every position. Occlusion: drop "
        "(default: the token is removed), or its embedding replaced by zero, pad or unk.")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Integrated-gradient steps or occluded prompts per forward pass.")] = 32,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Token attribution: how much each input token drove the target's log-probability at the last
    position, or logit(target) - logit(foil) with --foil. One row per token: its attribution and its
    share, attribution / sum of |attributions|.

    Integrated gradients also prints its completeness check: the attributions should add up to
    f(prompt) - f(baseline); --steps brings the relative error down.

    Examples:

    \b
        anatomy attribute "The capital of Germany is" --target " Berlin" -m SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy attribute "The Eiffel Tower is in the city of" --target " Paris" --foil " Rome" --steps 64
        anatomy attribute "Thank you very" --target " much" --method occlusion --plot much.png
    """
    from anatomy_cli.analyses import attribute as analysis
    from anatomy_cli.engine import token_attribution
    from anatomy_cli.text import targets

    wanted = targets.choice(target, target_id, option="--target", first_token=first_token)
    unwanted = targets.choice(foil, foil_id, option="--foil", first_token=first_token)
    targets.check_first_token(first_token, wanted, unwanted, options="--target or --foil")
    if wanted is None:
        raise UsageError("--target TEXT or --target-id N is required: the token whose prediction is explained, "
                         "e.g. --target ' much'")
    _check_baseline(method.value, baseline)
    ids: dict[str, int | None] = {}

    opened, encoded = open_prompts(prompt, spec, prompts)
    _check_decoder(spec.model, opened.adapter.causal)
    vocab = opened.info.lm_head_rows
    ids["target"] = targets.resolve(opened.tokenizer, wanted, model=spec.model, vocab_size=vocab)
    ids["foil"] = targets.resolve(opened.tokenizer, unwanted, model=spec.model, vocab_size=vocab) if unwanted else None
    if ids["foil"] == ids["target"]:
        raise UsageError("--foil is the same token as --target: the logit difference would be 0 everywhere")
    lm = load_weights(opened)
    _check_decoder(lm.name, lm.is_causal and lm.has_unembed)
    metric = analysis.metric_fn(ids["target"], ids["foil"])
    reports = []
    for enc in encoded:
        got = token_attribution.attribute_tokens(lm, enc.ids, metric, method.value, steps=steps,
                                                 baseline=baseline.value if baseline else None, batch_size=batch_size)
        result = analysis.token_attribution(
            got.method, "logit_diff" if ids["foil"] is not None else "logprob", enc.ids, enc.pieces, got.scores,
            got.metric, baseline=got.baseline, steps=got.steps, baseline_metric=got.baseline_metric, delta=got.delta)
        reports.append(_report(lm, enc, ids, result))
        if plot:
            from anatomy_cli.output import plots
            from anatomy_cli.output.plots import attribute as picture

            cap = plots.Caption.of("attribute", lm, enc.text, _method_line(result))
            index = len(reports) if prompt == "-" else None
            plots.save(picture.figure(result, _metric_name(lm, ids), cap), plot, index)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _check_baseline(method: str, baseline: Baseline | None) -> None:
    if baseline is None:
        return
    if method in ("saliency", "input-x-gradient"):
        raise UsageError(f"--baseline is for integrated-gradients and occlusion; {method} takes none")
    if method == "integrated-gradients" and baseline is Baseline.drop:
        raise UsageError("--baseline drop is for occlusion: integrated gradients needs a baseline of the same "
                         "length (zero, pad or unk)")


def _method_line(result) -> str:
    if result.method == "integrated-gradients":
        return f"integrated gradients, {result.steps} steps, baseline {result.baseline}"
    if result.method == "occlusion":
        return f"occlusion ({'token dropped' if result.baseline == 'drop' else 'replaced by ' + result.baseline})"
    return result.method


def _report(lm, enc, ids: dict, result) -> Report:
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    data = {**prompt_record(lm, enc), "target": target, "foil": foil, **result.to_dict()}
    what = _metric_name(lm, ids)
    heading = [f"attribute · {model_label(lm)} · {_method_line(result)}",
               f"{prompt_line(enc)} · f = {what} at the last position = {result.value:.4f}"]
    biggest = max((abs(r.attribution) for r in result.rows), default=0.0) or 1.0
    rows = [{**r.to_dict(), "magnitude": abs(r.attribution) / biggest} for r in result.rows]
    occluded = "dropped" if result.baseline == "drop" else f"replaced by {result.baseline}"
    notes = [f"attribution = {HOW[result.method].format(occluded=occluded)}; share = attribution / sum of "
             "|attributions|"]
    c = result.completeness
    if c is not None:
        err = "undefined" if c.relative_error is None else f"{c.relative_error:.2e}"
        notes.append(f"completeness: sum of attributions {c.sum_attributions:.6f} vs f(x) - f(baseline) = "
                     f"{result.value:.6f} - {c.baseline_metric:.6f} = {c.difference:.6f}; delta {c.delta:.2e}, "
                     f"relative error {err} (--steps brings it down)")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="token attribution")], heading=heading,
                  notes=notes)
