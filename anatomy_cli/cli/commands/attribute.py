"""`anatomy attribute PROMPT --target TOKEN`: which input tokens drove the prediction (Captum)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import (
    PromptArg,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
    warn_cost,
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
from anatomy_cli.errors import AnatomyError, UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text.options import PromptOptions


class AttributionMethod(str, Enum):
    saliency = "saliency"
    input_x_gradient = "input-x-gradient"
    integrated_gradients = "integrated-gradients"
    occlusion = "occlusion"


class Baseline(str, Enum):
    pad = "pad"
    unk = "unk"
    mean = "mean"
    zero = "zero"
    drop = "drop"


class Site(str, Enum):
    resid_pre = "resid_pre"
    attn_out = "attn_out"
    mlp_out = "mlp_out"


COLUMNS = (Column("position", "position", "int"), Column("token", "token"),
           Column("attribution", "attribution", "number", 4), Column("share", "share", "float", 3),
           Column("bar", "", "signed_bar"))
CONVERGED = Column("converged", "converged")
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
        "--steps", min=1, help="Integrated gradients: points on the path to start with (Gauss-Legendre); doubled "
        "until --max-rel-error is met.")] = 32,
    baseline: Annotated[Optional[Baseline], typer.Option(
        "--baseline", case_sensitive=False, show_default=False,
        help="Integrated gradients: pad (default), unk, mean (the mean embedding) or zero at every position but "
        "the first (see --vary-first). zero converges badly on pre-norm models: their first norm divides the "
        "embedding's scale out, so f changes almost only in a sliver of the path next to 0 that the steps miss. "
        "Occlusion: drop (default: the token is removed), or its embedding replaced by pad, unk, mean or "
        "zero.")] = None,
    max_rel_error: Annotated[float, typer.Option(
        "--max-rel-error", min=0.0, help="Integrated gradients: the completeness bound, |sum of attributions - "
        "(f(x) - f(baseline))| / |f(x) - f(baseline)|; missed: the steps are doubled up to --max-steps, then "
        "exit 1.")] = 0.05,
    max_steps: Annotated[int, typer.Option(
        "--max-steps", min=1, help="Integrated gradients: the most steps the doubling goes to.")] = 256,
    allow_unconverged: Annotated[bool, typer.Option(
        "--allow-unconverged", help="Print integrated gradients that missed --max-rel-error (marked "
        "unconverged) instead of exit 1.")] = False,
    vary_first: Annotated[bool, typer.Option(
        "--vary-first", help="Integrated gradients: the baseline replaces the first position too. By default it "
        "keeps its own embedding (attribution 0): the first position is the attention sink, and moving it "
        "makes f jump along the path.")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Run occlusion too (replacing by the same baseline) and report Spearman's rank "
        "correlation between the two per-token rankings.")] = False,
    layer: Annotated[Optional[int], typer.Option(
        "--layer", min=0, show_default=False, help="Integrated gradients at block L's --site activation (Captum "
        "LayerIntegratedGradients): one row per position of that activation.")] = None,
    site: Annotated[Site, typer.Option(
        "--site", case_sensitive=False, help="With --layer: resid_pre (block input), attn_out or mlp_out (what "
        "attention / the MLP adds).")] = Site.resid_pre,
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

    Integrated gradients must pass its completeness check: the attributions add up to f(prompt) -
    f(baseline) within --max-rel-error, the steps doubled from --steps up to --max-steps, else exit 1
    (--allow-unconverged prints the result marked unconverged).

    Examples:

    \b
        anatomy attribute "The capital of Germany is" --target " Berlin" -m SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy attribute "The Eiffel Tower is in the city of" --target " Paris" --foil " Rome" --check
        anatomy attribute "The capital of France is" --target " Paris" --layer 10 --site mlp_out
        anatomy attribute "Thank you very" --target " much" --method occlusion --plot much.png
    """
    from anatomy_cli.text import targets

    wanted = targets.choice(target, target_id, option="--target", first_token=first_token)
    unwanted = targets.choice(foil, foil_id, option="--foil", first_token=first_token)
    targets.check_first_token(first_token, wanted, unwanted, options="--target or --foil")
    if wanted is None:
        raise UsageError("--target TEXT or --target-id N is required: the token whose prediction is explained, "
                         "e.g. --target ' much'")
    _check_baseline(method.value, baseline)
    _check_ig_options(method.value, check, layer)

    opened, encoded = open_prompts(prompt, spec, prompts)
    _check_decoder(spec.model, opened.adapter.causal)
    ids = targets.resolve_pair(opened.tokenizer, wanted, unwanted, model=spec.model,
                               vocab_size=opened.info.lm_head_rows)
    lm = load_weights(opened)
    _check_decoder(lm.name, lm.is_causal and lm.has_unembed)
    from anatomy_cli.models import cost
    # A forward and a backward (about twice a forward) per integrated-gradients step; occlusion one forward per token.
    passes = {"integrated-gradients": 3 * steps, "occlusion": max((len(e) for e in encoded), default=0)}
    warn_cost(f"attribute: {method.value}", lm,
              sum(passes.get(method.value, 3) * cost.forward_flops(lm.info, len(e)) for e in encoded))
    reports = []
    for enc in encoded:
        with status(f"attribute: {method.value}") as line:
            result = run(lm, enc, ids, method.value, steps=steps, baseline=baseline.value if baseline else None,
                         batch_size=batch_size, max_steps=max_steps, max_rel_error=max_rel_error,
                         vary_first=vary_first, layer=layer, site=site.value, check=check,
                         allow_unconverged=allow_unconverged, progress=line.counter("attribute", "steps"))
        reports.append(_report(lm, enc, ids, result))
        if plot:
            from anatomy_cli.output import plots
            from anatomy_cli.output.plots import attribute as picture

            cap = plots.Caption.of("attribute", lm, enc.text, _method_line(result))
            index = len(reports) if prompt == "-" else None
            plots.save(picture.figure(result, _metric_name(lm, ids), cap), plot, index)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def run(lm, enc, ids: dict, method: str, *, steps: int = 32, baseline: str | None = None, batch_size: int = 32,
        max_steps: int = 256, max_rel_error: float = 0.05, vary_first: bool = False, layer: int | None = None,
        site: str = "resid_pre", check: bool = False, allow_unconverged: bool = False, progress=None):
    """The attribution of one prompt as the command computes it (the command and the Python API call this):
    Captum's ``method`` (integrated gradients doubled up to ``max_steps`` until within ``max_rel_error``),
    ``check``: occlusion's agreement. Raises AnatomyError when integrated gradients stays unconverged and not
    ``allow_unconverged``. ``progress(steps done, steps planned)``: integrated gradients' steps."""
    from anatomy_cli.analyses import attribute as analysis
    from anatomy_cli.engine import token_attribution

    metric = analysis.metric_fn(ids["target"], ids["foil"])
    got = token_attribution.attribute_tokens(
        lm, enc.ids, metric, method, steps=steps, baseline=baseline, batch_size=batch_size, max_steps=max_steps,
        max_rel_error=max_rel_error, keep_first=not vary_first, layer=layer, site=site, progress=progress)
    result = analysis.token_attribution(
        got.method, "logit_diff" if ids["foil"] is not None else "logprob", enc.ids, enc.pieces, got.scores,
        got.metric, baseline=got.baseline, steps=got.steps, baseline_metric=got.baseline_metric, delta=got.delta,
        max_rel_error=max_rel_error if got.converged is not None else None, tries=got.tries,
        kept_first=got.kept_first, layer=got.layer, site=got.site)
    if result.converged is False and not allow_unconverged:
        raise AnatomyError(_unconverged(result))
    return _with_check(lm, enc.ids, metric, result, batch_size) if check else result


def _check_baseline(method: str, baseline: Baseline | None) -> None:
    if baseline is None:
        return
    if method in ("saliency", "input-x-gradient"):
        raise UsageError(f"--baseline is for integrated-gradients and occlusion; {method} takes none")
    if method == "integrated-gradients" and baseline is Baseline.drop:
        raise UsageError("--baseline drop is for occlusion: integrated gradients needs a baseline of the same "
                         "length (zero, pad or unk)")


def _check_ig_options(method: str, check: bool, layer: int | None) -> None:
    if layer is not None and method != "integrated-gradients":
        raise UsageError(f"--layer is for integrated-gradients; {method} attributes to the input tokens only")
    if check and method == "occlusion":
        raise UsageError("--check compares with occlusion: use it with another --method")
    if check and layer is not None:
        raise UsageError("--check compares per-token rankings; with --layer the rows are a layer's positions")


def _with_check(lm, token_ids, metric, result, batch_size: int):
    """``result`` with the agreement check: occlusion by the same baseline (drop when the method has none)."""
    import dataclasses

    from anatomy_cli.analyses import attribute as analysis
    from anatomy_cli.engine import token_attribution

    baseline = result.baseline or "drop"
    if baseline == "drop" and len(token_ids) < 2:
        raise UsageError("--check: occlusion by dropping needs at least 2 tokens")
    occ = token_attribution.attribute_tokens(lm, token_ids, metric, "occlusion", baseline=baseline,
                                             batch_size=batch_size)
    return dataclasses.replace(result, check=analysis.agreement(result, "occlusion", baseline, occ.scores))


def _unconverged(result) -> str:
    c = result.completeness
    tries = ", ".join(f"{n} steps {e:.3g}" for n, e in c.tries)
    return (f"integrated gradients did not converge: relative error {c.relative_error:.3g} > --max-rel-error "
            f"{c.max_rel_error:g} (sum of attributions {c.sum_attributions:.4f} vs f(x) - f(baseline) "
            f"{c.difference:.4f}; tried {tries}); raise --max-steps, try another --baseline, or pass "
            "--allow-unconverged")


def _method_line(result) -> str:
    if result.method == "integrated-gradients":
        where = "" if result.layer is None else f" at blocks.{result.layer}.hook_{result.site}"
        first = ", first position kept" if result.kept_first else ""
        return f"integrated gradients{where}, {result.steps} steps, baseline {result.baseline}{first}"
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
    mark = {} if result.converged is None else {"converged": result.converged}
    rows = [{**r.to_dict(), "bar": r.attribution / biggest, **mark} for r in result.rows]
    occluded = "dropped" if result.baseline == "drop" else f"replaced by {result.baseline}"
    notes = [f"attribution = {HOW[result.method].format(occluded=occluded)}; share = attribution / sum of "
             "|attributions|"]
    c = result.completeness
    if c is not None:
        err = "undefined" if c.relative_error is None else f"{c.relative_error:.2e}"
        verdict = "converged" if c.converged else "UNCONVERGED"
        notes.append(f"completeness: sum of attributions {c.sum_attributions:.6f} vs f(x) - f(baseline) = "
                     f"{result.value:.6f} - {c.baseline_metric:.6f} = {c.difference:.6f}; delta {c.delta:.2e}, "
                     f"relative error {err}: {verdict} (bound {c.max_rel_error:g}; steps tried "
                     f"{', '.join(str(n) for n, _ in c.tries)})")
    if result.kept_first:
        notes.append("position 0 keeps its own embedding in the baseline (the attention sink): attribution 0 by "
                     "construction; --vary-first moves it too")
    if result.check is not None:
        rho = result.check.rank_correlation
        notes.append(f"check: Spearman rank correlation with occlusion ({result.check.baseline}) over positions "
                     f"{list(result.check.positions)}: {'undefined' if rho is None else f'{rho:.3f}'}")
    columns = COLUMNS + ((CONVERGED,) if mark else ())
    return Report(data=data, sections=[Section(columns, rows, title="token attribution")], heading=heading,
                  notes=notes)
