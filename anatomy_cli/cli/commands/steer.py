"""`anatomy steer`: a steering vector from contrastive prompts, saved for `generate --steer` and for llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, info
from anatomy_cli.cli.commands._common import BatchSizeOpt, load_weights, open_texts
from anatomy_cli.cli.commands._steering import SITES
from anatomy_cli.cli.options import FormatOpt, model_options, prompt_options
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
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
    from anatomy_cli.cli.commands import _steering

    pos, neg = _steering.check_options(positive or [], negative or [], pairs, site, reduce, method)
    if out is None and gguf_out is None:
        info("no --out or --save-control-vector: the vector is shown, not saved")
    opened, encoded = open_texts(pos + neg, spec, prompts)
    layers = _steering.parse_layers(layer, opened.info.n_layers)
    if not opened.info.is_causal:
        raise UsageError(f"{spec.model} is an encoder: steering vectors here are for decoders that generate")
    lm = load_weights(opened)
    _, report = _steering.run(lm, encoded, pos, neg, layers, site, reduce, method, batch_size, out, gguf_out,
                              spec.model)
    emit(report, fmt)
