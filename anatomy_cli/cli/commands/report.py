"""`anatomy report PROMPT -o report.html`: the anatomy of one prompt on one model as one interactive page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from anatomy_cli.cli.app import status
from anatomy_cli.cli.app import wrote
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import model_label
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import report as task
from anatomy_cli.text.options import PromptOptions


def _output(value: Path) -> Path:
    if str(value) == "-":
        return value
    if value.suffix.lower() != ".html":
        raise UsageError(f"-o {str(value)!r}: the report is an HTML page; give a file name ending in .html, or '-'")
    check_path = when_run("output.plots").check_path

    return check_path(value, "-o")


@command("report", task.ReportOptions)
@model_options()
@prompt_options()
def report_command(
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", show_default=False, help="The prompt text.")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE.html", callback=_output,
                                         help="Where to write the page ('-': stdout).")],
    opts: task.ReportOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
) -> None:
    """The anatomy of one prompt as one interactive HTML page, in the order of the GPT-2 article.

    A header (model, parameter table, dtype, BOS convention, quantization), then: the tokens; the
    embedding; the residual stream layer by layer with the logit lens grid; attention (a layer/head
    picker) with the head scores; the direct logit attribution of the top prediction; the next-token
    distribution. Each section has a paragraph saying what it shows. One forward with hooks serves
    everything but attention, which needs one eager-attention forward. plotly.js is inside the page:
    it opens from disk with no network.

    Examples:

    \b
        anatomy report "The capital of Germany is" --model model.Q4_1.gguf -o report.html
        anatomy report "Thank you very" --sections tokens,lens,next -o small.html
    """
    from anatomy_cli.output.html import attn as attn_html
    from anatomy_cli.output.html import report as page

    chosen = opts.chosen
    opened, (enc,) = open_texts([prompt], spec, prompts)
    lm = load_weights(opened)
    with status("running the analyses"):
        an = task.analyse(lm, enc, set(chosen), model=spec.model, k=opts.k,
                          pooling=(attn_html.block_factor, attn_html.pool))
    html = page.page(an, chosen, title=f"anatomy · {model_label(lm)}", facts=page.facts(lm, enc),
                     params_note="parameter table unavailable for this model").render()
    if str(output) == "-":
        sys.stdout.write(html)
        return
    try:
        output.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise AnatomyError(f"cannot write {str(output)!r}: {exc.strerror or exc}") from None
    wrote(output, f"{len(html.encode()) / 1e6:.1f} MB, {an.forwards} forward passes")
