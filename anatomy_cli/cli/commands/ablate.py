"""`anatomy ablate PROMPT --target TOKEN`: knock out each layer's attention / MLP (or each head) and
see what happens to the target."""

from __future__ import annotations

from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._attribution import CheckOpt
from anatomy_cli.cli.commands._attribution import MethodOpt
from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_and_emit
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.cli.options import token_pair_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks._attribution import Method
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks.ablate import AblateMode
from anatomy_cli.text.options import PromptOptions

RunsPerForwardOpt = Annotated[int, typer.Option(
    "--batch-size", min=1, help="Ablated runs per forward pass (more: faster, more memory).")]


@app.command("ablate")
@model_options()
@prompt_options()
@output_options()
@token_pair_options()
def ablate_command(
    prompt: PromptArg,
    pair: TokenPair = TokenPair(),
    position: Annotated[int, typer.Option(
        "--position", "-p", metavar="N", help="Where to read the metric (0-based; negative from the end).")] = -1,
    heads: Annotated[bool, typer.Option(
        "--heads", help="Ablate every attention head separately (its slice of the output projection's input) "
        "instead of whole attention and MLP outputs.")] = False,
    experts: Annotated[bool, typer.Option(
        "--experts", help="Knock out each routed expert of each MoE block (with --layer: of that block) "
        "separately, at every position (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; Qwen2-MoE's shared expert has no "
        "index and stays).")] = False,
    mode: Annotated[Optional[AblateMode], typer.Option(
        "--mode", case_sensitive=False, show_default=False, help="zero (default): replace the output by zeros, "
        "with --experts drop the expert's weighted output; mean: by its mean over the prompt's positions; "
        "reroute (--experts, its default): the expert's router logit set to -inf before the top k, the family's "
        "normalisation as usual.")] = None,
    method: MethodOpt = Method.exact,
    check_n: CheckOpt = 0,
    layer: Annotated[Optional[int], typer.Option(
        "--layer", "-l", metavar="L", show_default=False,
        help="Only layer L (0-based; negative from the end); with --experts an MoE block.")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: RunsPerForwardOpt = 32,
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
    from anatomy_cli.tasks import ablate as task

    opts = task.AblateOptions(**vars(pair),
                              position=position, heads=heads, experts=experts, mode=mode, method=method, check=check_n,
                              layer=layer, batch_size=batch_size)
    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts, encoded)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    draw_and_emit("ablate", view, lm, encoded, results, plot, fmt, prompt)
