"""`anatomy dla PROMPT --target TOKEN`: direct logit attribution to the embedding, layers and heads."""

from __future__ import annotations

from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import BatchSizeOpt
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
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks.dla import By
from anatomy_cli.tasks.dla import Sort
from anatomy_cli.text.options import PromptOptions


@app.command("dla")
@model_options()
@prompt_options()
@output_options()
@token_pair_options()
def dla_command(
    prompt: PromptArg,
    pair: TokenPair = TokenPair(),
    position: Annotated[Optional[int], typer.Option(
        "--position", "-p", metavar="N", show_default=False,
        help="The position whose logit is decomposed (0-based; negative counts from the end). "
        "Default: the last.")] = None,
    by: Annotated[By, typer.Option("--by", case_sensitive=False,
                                   help="'head': one row per attention head (plus the output projection's "
                                   "bias) instead of one per attention layer; 'expert' (MoE models): one row "
                                   "per chosen expert (and the shared expert) of each MoE block instead of "
                                   "its MLP row.")] = By.layer,
    top: Annotated[Optional[int], typer.Option(
        "--top", "-k", min=1, metavar="N", show_default=False,
        help="Keep the N rows of largest |contribution|; the rest are summed into one 'other' row, so the "
        "rows still add up to the logit. Default: every row.")] = None,
    sort: Annotated[Sort, typer.Option(
        "--sort", case_sensitive=False,
        help="Row order: 'model' (embedding, blocks in order, bias), 'abs' (largest |contribution| first) or "
        "'value' (most positive first).")] = Sort.model,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
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
    from anatomy_cli.tasks import dla as task

    opts = task.DlaOptions(**vars(pair),
                           position=position, by=by, top=top, sort=sort, batch_size=batch_size)
    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts, encoded)
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    draw_and_emit("dla", view, lm, encoded, results, plot, fmt, prompt)
