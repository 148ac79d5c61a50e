"""`anatomy steer`: a steering vector from contrastive prompts, saved for `generate --steer` and for llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import BatchSizeOpt
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks.steer import SITES
from anatomy_cli.text.options import PromptOptions


@app.command("steer")
@model_options()
@prompt_options()
def steer_command(
    positive: Annotated[Optional[list[str]], typer.Option("--positive", metavar="TEXT", show_default=False,
                                                          help="A prompt of the side to steer towards "
                                                          "(repeat the option for more).")] = None,
    negative: Annotated[Optional[list[str]], typer.Option("--negative", metavar="TEXT", show_default=False,
                                                          help="A prompt of the side to steer away from.")] = None,
    pairs: Annotated[Optional[Path], typer.Option("--pairs", metavar="FILE", show_default=False,
                                                  help="Prompt pairs, one per line: POSITIVE<TAB>NEGATIVE, or "
                                                  "JSON lines {\"positive\": ..., \"negative\": ...}.")] = None,
    layer: Annotated[str, typer.Option("--layer", "-l", metavar="L|A-B|L,L",
                                       help="Block(s) whose site gets a direction.")] = "",
    site: Annotated[str, typer.Option("--site", help=f"Hook point kind: {', '.join(SITES)}.")] = "resid_post",
    reduce: Annotated[str, typer.Option("--reduce", help="'last': the last token's activation; 'mean': the mean "
                                        "over the prompt's tokens.")] = "last",
    method: Annotated[str, typer.Option("--method", help="'mean': mean(positive) - mean(negative) (ActAdd/CAA); "
                                        "'pca': repeng's first principal component of the pair differences "
                                        "(unit norm).")] = "mean",
    out: Annotated[Optional[Path], typer.Option("--out", metavar="FILE", show_default=False,
                                                help="Save the vector (safetensors + JSON metadata).")] = None,
    gguf_out: Annotated[Optional[Path], typer.Option("--save-control-vector", metavar="FILE.gguf",
                                                     show_default=False,
                                                     help="Also write llama.cpp's control-vector GGUF.")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    fmt: FormatOpt = None,
) -> None:
    """A steering vector from contrastive prompts: per layer, the direction from the negative prompts'
    activations to the positive ones' at --site (default resid_post, block L's output, where llama.cpp adds a
    control vector), with its norm and how many pairs it separates.

    Examples:

    \b
        anatomy steer --positive "I love this" --positive "What a joy" --negative "I hate this" \\
            --negative "What a pain" --layer 6 --out joy.safetensors
        anatomy steer --pairs pairs.tsv --layer 4-8 --method pca --out joy.safetensors
        anatomy steer --pairs pairs.tsv --layer 6 --save-control-vector joy.gguf
    """
    from anatomy_cli.output.views import steer as view
    from anatomy_cli.tasks import steer as task

    opts = task.SteerOptions(positive=positive, negative=negative, pairs=pairs, layer=layer, site=site,
                             reduce=reduce, method=method, out=out, save_control_vector=gguf_out,
                             batch_size=batch_size)  # fails before anything opens
    opened, encoded = open_texts(task.texts(opts), spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    emit(view.report(lm, task.run(lm, encoded, opts, plan), opts), fmt)
