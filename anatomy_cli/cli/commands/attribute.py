"""`anatomy attribute PROMPT --target TOKEN`: which input tokens drove the prediction (Captum)."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import attribute as task
from anatomy_cli.text.options import PromptOptions


@command("attribute", task.AttributeOptions)
@model_options()
@prompt_options()
@output_options()
def attribute_command(
    prompt: PromptArg,
    opts: task.AttributeOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
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
