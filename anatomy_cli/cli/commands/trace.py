"""`anatomy trace PROMPT`: the residual stream at one position, row by row (embed, then blocks), and the lens."""

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
from anatomy_cli.tasks import trace as task
from anatomy_cli.text.options import PromptOptions


@command("trace", task.TraceOptions)
@model_options()
@prompt_options()
@output_options()
def trace_command(
    prompt: PromptArg,
    opts: task.TraceOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """Follow one token position through every layer: how much of the embedding survives, what each
    layer adds, and what the model would predict if it stopped there (the logit lens).

    One row for the embedding (embed), then one per block's output (0..L-1): cosine to the embedding
    and to the previous row, the residual norm, the norms of what that block's attention and MLP
    added, and the logit lens's top token and probability.
    Then the model's own top-k next tokens. Encoders (BERT) have no next token: for them the lens
    and top-k read the masked-LM head at the position, or are omitted when there is no head.

    Examples:

    \b
        anatomy trace "Thank you very"
        anatomy trace "Thank you very" --position 1 --top 10
        anatomy trace "Thank you very" --init random --format json
        printf 'Thank you very\\nThe capital of France is\\n' | anatomy trace - --format jsonl
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output import plots
    from anatomy_cli.output.views import trace as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts, encoded)
    lm = load_weights(opened)
    reports = []
    for enc, traced in zip(encoded, task.run(lm, encoded, opts, plan)):
        reports.append(view.report(lm, enc, traced))
        if plot:
            args, kwargs = view.figure(lm, enc, traced)
            plots.draw("trace", plot, len(reports) if prompt == "-" else None, *args, **kwargs)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")
