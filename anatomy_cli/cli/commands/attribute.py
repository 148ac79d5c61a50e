"""`anatomy attribute PROMPT --target TOKEN`: which input tokens drove the prediction (Captum)."""

from __future__ import annotations

from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.cli.options import token_pair_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks.attribute import AttributionMethod
from anatomy_cli.tasks.attribute import Baseline
from anatomy_cli.tasks.attribute import Site
from anatomy_cli.text.options import PromptOptions


@app.command("attribute")
@model_options()
@prompt_options()
@output_options()
@token_pair_options()
def attribute_command(
    prompt: PromptArg,
    pair: TokenPair = TokenPair(),
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
    out: Output = Output(),
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
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output.views import attribute as view
    from anatomy_cli.tasks import attribute as task

    opts = task.AttributeOptions(
        **vars(pair), method=method,
        steps=steps, baseline=baseline, max_rel_error=max_rel_error, max_steps=max_steps,
        allow_unconverged=allow_unconverged, vary_first=vary_first, check=check, layer=layer, site=site,
        batch_size=batch_size)
    opened, encoded = open_prompts(prompt, spec, prompts)
    ids = task.check(opened, opts)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, ids)
    if plot:
        from anatomy_cli.output import plots
        from anatomy_cli.output.plots import attribute as picture  # one picture for every format (no html page)

        for i, (enc, result) in enumerate(zip(encoded, results), start=1):
            args, kwargs = view.figure(lm, enc, result, ids)
            plots.save(picture.figure(*args, **kwargs), plot, i if prompt == "-" else None)
    emit_prompts([view.report(lm, enc, r, ids) for enc, r in zip(encoded, results)], fmt, from_stdin=prompt == "-")
