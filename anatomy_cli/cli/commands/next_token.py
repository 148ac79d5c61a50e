"""`anatomy next PROMPT`: the next-token distribution after a prompt, and a target token's rank."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import next_token as task
from anatomy_cli.text.options import PromptOptions


@command("next", task.NextOptions)
@model_options()
@prompt_options()
def next_command(
    prompt: PromptArg,
    opts: task.NextOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
) -> None:
    """The model's next-token distribution after PROMPT: rank, token, id, probability, log-probability.

    Probabilities are a float64 softmax over the whole vocabulary at the last position.
    Needs a decoder-only model with an LM head (encoders such as BERT are refused).

    Examples:

    \b
        anatomy next "Thank you very"
        anatomy next "Thank you very" --target " much" --top 5
        anatomy next "Thank you very" --target-id 881
        anatomy next "Thank you very" --init random --format json
        printf 'Thank you very\\nThe capital of France is\\n' | anatomy next - --format jsonl
    """
    from anatomy_cli.output.views import next as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    emit_prompts([view.report(lm, enc, r) for enc, r in zip(encoded, results)], fmt, from_stdin=prompt == "-")
