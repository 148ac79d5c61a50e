"""`anatomy features DICT --corpus PATH`: readable dictionary features over a corpus, in one streaming pass."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import features as task


@command("features", task.FeaturesOptions, inputs=("sae",))
@model_options()
def features_command(
    sae: Annotated[Path, typer.Argument(
        metavar="DICT", show_default=False,
        help="The dictionary: a SAELens folder, a sparsify folder, a Gemma Scope params.npz (an SAE or a "
             "transcoder), as anatomy sae reads it.")],
    opts: task.FeaturesOptions,
    spec: ModelSpec = ModelSpec(),
    fmt: FormatOpt = None,
) -> None:
    """Per feature of a dictionary, over a corpus: how often it fires, its mean and max activation, a histogram
    of its activations, its top-activating contexts and contexts sampled from its activation intervals (every
    token's activation kept), the features firing with it most often, the tokens its decoder direction promotes
    and suppresses; dead and always-on features named as such.

    One streaming pass over the corpus' windows (as anatomy corpus cuts them), in shards: with --out DIR each
    shard is saved and running the same command again resumes; --ray runs the shards on Ray workers (the merged
    result is the one process's). The expected cost is printed before the pass, progress during it. --out DIR
    writes features.parquet, contexts.parquet and logit_effects.parquet; --delphi DIR delphi's latent cache.
    See docs/commands/features.md.

    Examples:

    \b
        anatomy features ./gpt2-res-jb/blocks.6.hook_resid_post --corpus docs/ --model gpt2 --max-tokens 100000
        anatomy features ./sae --corpus data.jsonl --features 0-99 --out feats --format json
        anatomy features ./sae --corpus docs/ --feature 123 --out feats --delphi feats/latents
        anatomy features ./sae --corpus docs/ --estimate
    """
    from anatomy_cli.output.render import emit
    from anatomy_cli.output.views import features as view
    from anatomy_cli.tasks._features_run import measure

    emit(view.report(measure(spec, opts)), fmt)
