"""`anatomy diff A B [PROMPT]`: two models side by side, weights tensor by tensor or activations layer by layer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import model_label
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import diff as task
from anatomy_cli.text.inputs import read_prompts
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.output.render import Format

ModelArg = Annotated[str, typer.Argument(metavar="A", show_default=False,
                                         help="The first model: .gguf file, directory, preset or Hugging Face id.")]
OtherArg = Annotated[str, typer.Argument(metavar="B", show_default=False, help="The second model, as A.")]
OptionalPrompt = Annotated[Optional[str], typer.Argument(
    metavar="[PROMPT]", show_default=False,
    help="Compare activations on this prompt ('-': one prompt per stdin line). Without it: the weights.")]


@command("diff", task.DiffOptions)
@model_options(fields=("device", "dtype", "trust_remote_code"))
@prompt_options()
@output_options()
def diff_command(
    a: ModelArg,
    b: OtherArg,
    prompt: OptionalPrompt = None,
    opts: task.DiffOptions = task.DiffOptions(),
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """Compare two models of one shape: a quantized file against its source, a fine-tune against its base.

    Weights (no PROMPT, or --weights): per block and component (the `params` rows), the relative change
    ‖W_B − W_A‖/‖W_A‖, the cosine and max |Δ|, read one tensor pair at a time (never a whole model in
    memory); for a GGUF B, the quantization types of B's tensors.

    Activations (a PROMPT): per layer, the cosine of h_A and h_B at the position and its mean over
    positions, ‖h_A − h_B‖/‖h_A‖, KL(lens_A ‖ lens_B) and whether the lenses agree on the top token; then
    both next-token distributions, their KL and the rank of A's top token in B. A runs first and only
    its activations are kept; B loads after A is freed.

    Examples:

    \b
        anatomy diff model.Q4_1.gguf model.Q8_0.gguf
        anatomy diff ./base ./finetuned --format json
        anatomy diff model.Q4_1.gguf ./source "The capital of Germany is" --target " Berlin"
    """
    plot, fmt = out.plot, out.fmt
    for name in (a, b):
        check_path(name)  # a path that does not exist fails before torch loads
    opts.check_mode(prompt is not None)
    if prompt is None:
        return _weights(a, b, spec.trust_remote_code, opts, plot, fmt)
    _activations(spec.replace(model=a), spec.replace(model=b), prompt, prompts, opts, plot, fmt)


def _weights(a: str, b: str, trust_remote_code: bool, opts: task.DiffOptions, plot: Path | None,
             fmt: Format | None) -> None:
    plots = when_run("output.plots")
    view = when_run("output.views.diff")

    result = task.run_weights(a, b, trust_remote_code)
    if plot:
        from anatomy_cli.output.plots import diff as picture

        args, kwargs = view.weights_figure(result, a, b)
        plots.save(picture.weights_figure(*args, **kwargs), plot)
    emit_prompts([view.weights_report(result)], fmt, from_stdin=False)


def _activations(spec_a: ModelSpec, spec_b: ModelSpec, prompt: str, options: PromptOptions,
                 opts: task.DiffOptions, plot: Path | None, fmt: Format | None) -> None:
    plots = when_run("output.plots")
    view = when_run("output.views.diff")

    # Before either model's weights: the shape of the question, and B reads the prompts as A does.
    opened_a, opened_b, encoded, encoded_b = task.open_pair(spec_a, spec_b, read_prompts(prompt), options)
    plan = task.check(opened_a, opened_b, encoded, encoded_b, opts)
    label_a, lm, results = task.run_activations(opened_a, opened_b, encoded, opts, plan)
    reports = []
    for i, (enc, result) in enumerate(zip(encoded, results), start=1):
        reports.append(view.activations_report(label_a, model_label(lm), enc, result))
        if plot:
            from anatomy_cli.output.plots import diff as picture

            args, kwargs = view.activations_figure(spec_a.model, spec_b.model, enc, result)
            plots.save(picture.activations_figure(*args, **kwargs), plot, i if prompt == "-" else None)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")
