"""`anatomy dla PROMPT --target TOKEN`: direct logit attribution to the embedding, layers and heads."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_and_emit
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import dla as task
from anatomy_cli.text.options import PromptOptions


@command("dla", task.DlaOptions)
@model_options()
@prompt_options()
@output_options()
def dla_command(
    prompt: PromptArg,
    opts: task.DlaOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """Direct logit attribution: how much each component wrote the target's logit at one position.

    One row per contribution: the embedding (and position embedding), each layer's attention and
    MLP output (--by head: each head, plus the attention output projection's bias), and a final
    'bias' row. With --foil the rows explain logit(target) - logit(foil). The final norm's scale is
    frozen at its value for the final residual; the rows add up to the model's own logit (JSON
    'total' and 'logit'). Soft-capped models (Gemma 2) are decomposed before the soft-capping.

    Examples:

    \b
        anatomy dla "The capital of Germany is" --target " Berlin"
        anatomy dla "The capital of Germany is" --target " Berlin" --foil " Paris" --by head
        anatomy dla "Thank you very" --target-id 881 --format json
        anatomy dla "The capital of Germany is" --target " Berlin" --by head --top 10 --sort abs
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output.views import dla as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts, encoded)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    draw_and_emit("dla", view, lm, encoded, results, plot, fmt, prompt)
