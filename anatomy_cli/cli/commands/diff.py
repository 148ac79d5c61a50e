"""`anatomy diff A B [PROMPT]`: two models side by side, weights tensor by tensor or activations layer by layer."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import (
    BatchSizeOpt,
    describe,
    emit_prompts,
    load_weights,
    model_label,
    open_model,
    open_texts,
)
from anatomy_cli.cli.options import (
    FormatOpt,
    PlotOpt,
    TargetIdOpt,
    TargetOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.positions import check_position

ModelArg = Annotated[str, typer.Argument(metavar="A", show_default=False,
                                         help="The first model: .gguf file, directory, preset or Hugging Face id.")]
OtherArg = Annotated[str, typer.Argument(metavar="B", show_default=False, help="The second model, as A.")]
OptionalPrompt = Annotated[Optional[str], typer.Argument(
    metavar="[PROMPT]", show_default=False,
    help="Compare activations on this prompt ('-': one prompt per stdin line). Without it: the weights.")]


@app.command("diff")
@model_options(fields=("device", "dtype", "trust_remote_code"))
@prompt_options()
def diff_command(
    a: ModelArg,
    b: OtherArg,
    prompt: OptionalPrompt = None,
    weights: Annotated[bool, typer.Option("--weights", help="Compare the weights (the default without a PROMPT).")]
    = False,
    position: Annotated[int, typer.Option("--position", "-p", metavar="N", help="Token position whose lens and "
                                          "residual are compared (negative counts from the end).")] = -1,
    k: Annotated[int, typer.Option("--top", "-k", "--k", min=1, metavar="N",
                                  help="How many next tokens of each model to list.")] = 5,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
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
    from anatomy_cli.models.resolve import check_path

    for name in (a, b):
        check_path(name)  # a path that does not exist fails before torch loads
    if prompt is not None and weights:
        raise UsageError("--weights compares the files and takes no PROMPT; drop one of them")
    if prompt is None:
        if target is not None or target_id is not None:
            raise UsageError("--target needs a PROMPT (it compares next-token probabilities)")
        return _weights(a, b, spec.trust_remote_code, plot, fmt)
    _activations(spec.replace(model=a), spec.replace(model=b), prompt, prompts, targets.choice(target, target_id),
                 position, k, batch_size, plot, fmt)


def _weights(a: str, b: str, trust_remote_code: bool, plot: Path | None, fmt: Any) -> None:
    from anatomy_cli.analyses import diff as analysis
    from anatomy_cli.cli.commands import _diff_render as render
    from anatomy_cli.output import plots

    with status(f"reading the headers of {a} and {b}"):
        header_a = analysis.read_header(a, trust_remote_code=trust_remote_code)
        header_b = analysis.read_header(b, trust_remote_code=trust_remote_code)
        analysis.check_headers(header_a, header_b)  # two families or shapes: said before any tensor is listed
    with status(f"reading {a}"):
        reader_a = analysis.open_weights(a, header=header_a)
    with status(f"reading {b}"):
        reader_b = analysis.open_weights(b, header=header_b)
    with reader_a, reader_b, status("comparing weights") as line:
        result = analysis.diff_weights(reader_a, reader_b, progress=line.counter("comparing weights", "tensor pairs"))
    if plot:
        from anatomy_cli.output.plots import diff as picture

        plots.save(picture.weights_figure(result, plots.Caption("diff", _pair(a, b), detail="weights")), plot)
    emit_prompts([render.weights_report(result)], fmt, from_stdin=False)


def _activations(spec_a: ModelSpec, spec_b: ModelSpec, prompt: str, options: PromptOptions, wanted: Any,
                 position: int, k: int, batch_size: int, plot: Path | None, fmt: Any) -> None:
    from anatomy_cli.analyses import diff as analysis
    from anatomy_cli.cli.commands import _diff_render as render
    from anatomy_cli.output import plots
    from anatomy_cli.text import chat
    from anatomy_cli.text.inputs import read_prompts

    texts = read_prompts(prompt)
    # Before either model's weights: the shape of the question, and B reads the prompts as A does.
    opened_a, encoded = open_texts(texts, spec_a, options)
    render.check_decoder(spec_a.model, opened_a.adapter)
    check_position(position, encoded)
    target_id = None if wanted is None else targets.resolve(opened_a.tokenizer, wanted, model=spec_a.model,
                                                             vocab_size=opened_a.info.lm_head_rows)
    opened_b = open_model(spec_b) if spec_b != spec_a else opened_a
    render.check_same_tokens(encoded, chat.encode(opened_b.tokenizer, texts, options, opened_b.name),
                             spec_a.model, spec_b.model)
    render.check_same_shape(opened_a.info, opened_b.info, spec_a.model, spec_b.model)
    lm = load_weights(opened_a)
    with status(f"running {spec_a.model}"):
        kept_a = analysis.keep(lm, encoded, position, batch_size=batch_size)
    label_a = model_label(lm)
    if spec_b != spec_a:
        del lm  # A's weights go before B's load: the two models are never in memory together
        gc.collect()
        lm = load_weights(opened_b)
    with status(f"running {spec_b.model}"):
        kept_b = analysis.keep(lm, encoded, position, batch_size=batch_size)
    name_token = describe(lm)
    reports = []
    for i, (enc, ka, kb) in enumerate(zip(encoded, kept_a, kept_b), start=1):
        result = analysis.compare(ka, kb, name_token, k=k, target_id=target_id)
        reports.append(render.activations_report(label_a, model_label(lm), enc, result))
        if plot:
            from anatomy_cli.output.plots import diff as picture

            cap = plots.Caption("diff", _pair(spec_a.model, spec_b.model), enc.text,
                                f"position {result.position} = {enc.pieces[result.position]}")
            plots.save(picture.activations_figure(result, cap), plot, i if prompt == "-" else None)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _pair(a: str, b: str) -> str:
    """``A vs B`` for a picture's title: each model's one short name (models.resolve.label)."""
    from anatomy_cli.models.resolve import short_name

    return f"{short_name(a)} vs {short_name(b)}"
