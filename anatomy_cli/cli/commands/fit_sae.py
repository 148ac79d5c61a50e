"""`anatomy fit-sae CORPUS... --layer L|A-B|L,L|all --out DIR [--transcoder]`: train a TopK SAE or transcoder per
block (sparsify's format)."""

from __future__ import annotations

from typing import Annotated

import typer

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import fit_sae as task


@command("fit-sae", task.FitSaeOptions, inputs=("corpus",))
@model_options()
def fit_sae_command(
    corpus: Annotated[list[str], typer.Argument(
        metavar="CORPUS", show_default=False,
        help="Text files, folders of .txt/.md files, .jsonl/.csv/.parquet (as anatomy corpus reads them).")],
    opts: task.FitSaeOptions,
    spec: ModelSpec = ModelSpec(),
    fmt: FormatOpt = None,
) -> None:
    """Train a TopK or JumpReLU sparse autoencoder (or, with --transcoder, an MLP transcoder; with --clt, one
    cross-layer transcoder) for each --layer block of this model on CORPUS and write them in EleutherAI
    sparsify's format, which anatomy sae, generate --steer-feature, circuit --transcoders (a transcoder for
    every block) and sparsify read.

    Activations come from anatomy's hooks (any model anatomy opens, GGUF files too), every block's in one pass
    over the corpus; the training is sparsify's recipe (TopK, FVU loss, Adam, unit-norm decoder rows), one SAE
    per block from the same --seed (a block's files are those a run of that block alone writes), with
    sparsify's own SparseCoder when eai-sparsify is installed (pip install -e '.[train]'). The expected cost
    (tokens; every phase's time, timed on this machine now: the load, collecting, training, the held-out check;
    memory: the activations of every block at once) is printed first; --estimate prints it as the result and
    stops (the weights load for the probes; nothing is trained or written). Each written SAE is read back and spliced
    into a held-out window: its health is its row of the report (and its anatomy-fit.json); one block's
    warnings each on a line, several blocks' in one line naming the blocks too weak to read and those
    warned. See docs/commands/sae.md.

    Examples:

    \b
        anatomy fit-sae docs/ --model smollm2 --layer 15 --out ./my-sae --max-tokens 20000
        anatomy fit-sae corpus.jsonl --model gpt2 --layer 6 --transcoder --out ./tc --d-sae 6144 --k 64
        anatomy fit-sae docs/ --model smollm2 --layer all --transcoder --out ./tc --d-sae 1024 --k 16
        anatomy fit-sae docs/ --model smollm2 --layer all --transcoder --out ./tc --d-sae 1024 --k 16 --estimate
    """
    view = when_run("output.views.fit_sae")

    task.before_open(spec, opts)  # --layer 99, --ctx 100000: refused from a GGUF's header, before the open
    opened = open_model(spec)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    emit(view.report(lm, task.run(lm, opts, plan)), fmt)
