"""`anatomy route PROMPT`: per MoE block and position, the experts chosen, their weights, entropy and margin."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_and_emit
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import PlotOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import route as task
from anatomy_cli.text.options import PromptOptions


@command("route", task.RouteOptions)
@model_options()
@prompt_options()
def route_command(
    prompt: PromptArg,
    opts: task.RouteOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Which experts each token is routed to in each mixture-of-experts block, and how close to a flip.

    One row per MoE block and position: the chosen experts, heaviest first, with the weights the block
    applies (softmax over the experts, top k, the family's normalisation), the router's entropy (nats) and
    the margin between the k-th and the (k+1)-th router probability; a margin below 0.01 is a near tie.
    Needs an MoE model (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE); a dense model is refused.

    Examples:

    \b
        anatomy route "Thank you very" --model ./tiny-mixtral
        anatomy route "Thank you very" --model ./tiny-mixtral --block 0 --top 1 --format json
        anatomy route "Thank you very" --model ./tiny-mixtral --plot route.html
        printf 'Hello\\nThe capital of France is\\n' | anatomy route - --model ./tiny-olmoe --format jsonl
    """
    from anatomy_cli.output.views import route as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    draw_and_emit("route", view, lm, encoded, results, plot, fmt, prompt)
