"""`anatomy ablate PROMPT --target TOKEN`: knock out each layer's attention / MLP (or each head) and
see what happens to the target."""

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
from anatomy_cli.tasks import ablate as task
from anatomy_cli.text.options import PromptOptions


@command("ablate", task.AblateOptions)
@model_options()
@prompt_options()
@output_options()
def ablate_command(
    prompt: PromptArg,
    opts: task.AblateOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """Knock out each layer's attention output, then its MLP output (or, with --heads, each head; with
    --experts, each routed expert of each MoE block), and
    report the target's log-probability at --position, or logit(target) - logit(foil) with --foil,
    and its change from the intact run.

    The knocked-out output is replaced at every position: by zeros (--mode zero) or by its mean
    over the prompt's positions (--mode mean); a routed expert (--experts) is removed from the router's
    candidates before the top k (--mode reroute, its default) or its weighted output dropped (--mode zero).
    All ablations of a prompt run in a few batched forwards;
    --method attribution estimates them all from one backward, (a_ablated - a) . dm/da; --check N reruns
    the N largest exactly.

    Examples:

    \b
        anatomy ablate "The capital of Germany is" --target " Berlin" -m SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy ablate "The capital of Germany is" --target " Berlin" --foil " Paris" --mode mean
        anatomy ablate "Thank you very" --target " much" --heads --layer -1 --format json
        anatomy ablate "Thank you very" --target " much" --heads --method attribution --check 8
        anatomy ablate "Thank you very" --target " much" --experts --layer 3 -m allenai/OLMoE-1B-7B-0924
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output.views import ablate as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts, encoded)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    draw_and_emit("ablate", view, lm, encoded, results, plot, fmt, prompt)
