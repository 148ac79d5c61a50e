"""`anatomy fit-sae CORPUS... --layer L|A-B|L,L|all --out DIR [--transcoder]`: train a TopK SAE or transcoder per
block (sparsify's format)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.models.spec import ModelSpec


@app.command("fit-sae")
@model_options()
def fit_sae_command(
    corpus: Annotated[list[str], typer.Argument(
        metavar="CORPUS...", show_default=False,
        help="Text files, folders of .txt/.md files, .jsonl/.csv/.parquet (as anatomy corpus reads them).")],
    layer: Annotated[list[str], typer.Option(
        "--layer", metavar="L|A-B|L,L|all", show_default=False,
        help="The block(s), one SAE each, their activations collected in one pass: a block (negative counts from "
        "the end), a range, a list, all; repeat the option for more.")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", show_default=False,
                                      help="The folder written: DIR/layers.N per block (DIR/layers.N.mlp for a "
                                      "transcoder).")],
    transcoder: Annotated[bool, typer.Option(
        "--transcoder", help="An MLP transcoder (the MLP's input -> its output) instead of an SAE on the "
        "block's output.")] = False,
    d_sae: Annotated[Optional[int], typer.Option("--d-sae", min=1, metavar="N", show_default=False,
                                                 help="Latents (default 8 x d_model).")] = None,
    k: Annotated[int, typer.Option("--k", min=1, metavar="N", help="Active latents per token (TopK).")] = 32,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=4, metavar="N",
                                            help="Tokens read from the corpus (the last window is held out).")
                          ] = 20000,
    ctx: Annotated[int, typer.Option("--ctx", min=2, metavar="N", help="Tokens per window.")] = 256,
    epochs: Annotated[int, typer.Option("--epochs", min=1, metavar="N", help="Passes over the tokens.")] = 8,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, metavar="N",
                                            help="Rows per step.")] = 256,
    lr: Annotated[Optional[float], typer.Option(
        "--lr", metavar="X", show_default=False,
        help="Adam's learning rate (default sparsify's, 2e-4/sqrt(d_sae/2^14)).")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Initialization and shuffling.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Write into a folder that is not empty.")] = False,
    spec: ModelSpec = ModelSpec(),
    fmt: FormatOpt = None,
) -> None:
    """Train a TopK sparse autoencoder (or, with --transcoder, an MLP transcoder) for each --layer block of this
    model on CORPUS and write them in EleutherAI sparsify's format, which anatomy sae, generate --steer-feature,
    circuit --transcoders (a transcoder for every block) and sparsify read.

    Activations come from anatomy's hooks (any model anatomy opens, GGUF files too), every block's in one pass
    over the corpus; the training is sparsify's recipe (TopK, FVU loss, Adam, unit-norm decoder rows), one SAE
    per block from the same --seed (a block's files are those a run of that block alone writes), with
    sparsify's own SparseCoder when eai-sparsify is installed (pip install -e '.[train]'). The expected cost
    (tokens, FLOPs, seconds at a rate measured now, memory: the activations of every block at once) is printed
    first. Each written SAE is read back and spliced into a held-out window: its health is its row of the
    report, with a warning when it does not fit. See docs/commands/sae.md.

    Examples:

    \b
        anatomy fit-sae docs/ --model smollm2 --layer 15 --out ./my-sae --max-tokens 20000
        anatomy fit-sae corpus.jsonl --model gpt2 --layer 6 --transcoder --out ./tc --d-sae 6144 --k 64
        anatomy fit-sae docs/ --model smollm2 --layer all --transcoder --out ./tc --d-sae 1024 --k 16
    """
    from anatomy_cli.output.render import emit
    from anatomy_cli.output.views import fit_sae as view
    from anatomy_cli.tasks import fit_sae as task

    opts = task.FitSaeOptions(corpus=tuple(corpus), layer=tuple(layer), transcoder=transcoder, out=out, d_sae=d_sae,
                              k=k, max_tokens=max_tokens, ctx=ctx, epochs=epochs, batch_size=batch_size, lr=lr,
                              seed=seed, overwrite=overwrite)
    opened = open_model(spec)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    emit(view.report(lm, task.run(lm, opts, plan)), fmt)
