"""`anatomy generate PROMPT`: the continuation, token by token through the KV cache, with a per-step trace;
optionally steered by a vector (`anatomy steer`), with a coefficient sweep and a cache check."""

from __future__ import annotations

from anatomy_cli.cli.app import LensValueOptional
from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import PlotOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import emit_jsonl
from anatomy_cli.output.render import resolve_format
from anatomy_cli.tasks import generate as task
from anatomy_cli.text.options import PromptOptions


@command("generate", task.GenerateOptions, cls=LensValueOptional, before={"plot": "target"})
@model_options()
@prompt_options()
def generate_command(
    prompt: PromptArg,
    opts: task.GenerateOptions,
    plot: PlotOpt = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
) -> None:
    """Continue PROMPT token by token (greedy unless --sample), printing each step's token, probability, rank
    and top tokens. Stops at the model's EOS or after --max-new-tokens.

    With --steer FILE --coef C, C times the vector is added at its site on every position of the prompt and
    of every generated token (through the KV cache). A list of coefficients prints a sweep: each
    continuation, the KL of the first next-token distribution from coefficient 0, and --target's
    log-probability shift. --format jsonl prints one object per step (per coefficient for a sweep).

    Examples:

    \b
        anatomy generate "The capital of France is" --max-new-tokens 8
        anatomy generate "Once upon a time" --sample --temperature 0.8 --top-p 0.95 --seed 1
        anatomy generate "The capital of France is" --max-new-tokens 4 --lens --format jsonl
        anatomy generate "I think that" --steer happy.safetensors --coef 4 --check
        anatomy generate "I think that" --steer happy.safetensors --coef -8,-4,0,4,8 --target " love"
        anatomy generate "I think that" --steer happy.safetensors --coef -2,-1,0,1,2 --plot sweep.png
        anatomy generate "I think that" --steer-feature 123 --sae sae_dir/ --coef 4
    """
    view = when_run("output.views.generate")

    if plot:
        task.check_plot(opts)
    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    outs = task.run(lm, encoded, opts, plan)
    reports = [view.report(lm, enc, out, opts, plan) for enc, out in zip(encoded, outs)]
    if plot:
        plots = when_run("output.plots")

        for index, (enc, out) in enumerate(zip(encoded, outs), start=1):
            args, kwargs = view.figure(lm, enc, out, opts, plan)
            plots.draw("generate", plot, index if prompt == "-" else None, *args, **kwargs)
    if resolve_format(fmt) is Format.jsonl:
        emit_jsonl([row for enc, r in zip(encoded, reports) for row in view.jsonl_rows(enc, r.data, opts)])
    else:
        emit_prompts(reports, fmt, from_stdin=prompt == "-")
