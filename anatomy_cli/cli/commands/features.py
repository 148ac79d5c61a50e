"""`anatomy features DICT --corpus PATH`: readable dictionary features over a corpus, in one streaming pass."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.commands._common import model_given
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import html_plot
from anatomy_cli.cli.options import model_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import features as task
from anatomy_cli.tasks.explain import read_export

PlotOpt = Annotated[Optional[Path], html_plot(
    "features", "Also write a dashboard of the features to FILE.html, an interactive page (opens offline; .html "
    "only): the list (search, sort) and per feature its contexts with every token shaded by its activation, "
    "histogram, logit effects and co-firing features; with --out DIR, the explanations and scores that anatomy "
    "explain wrote to DIR/explanations.json. Results still go to stdout.", in_out=True)]


@command("features", task.FeaturesOptions, inputs=("sae",))
@model_options()
def features_command(
    sae: Annotated[Path, typer.Argument(
        metavar="DICT", show_default=False,
        help="The dictionary: a SAELens folder, a sparsify folder, a Gemma Scope params.npz (an SAE or a "
             "transcoder), as anatomy sae reads it.")],
    opts: task.FeaturesOptions,
    spec: ModelSpec = ModelSpec(),
    plot: PlotOpt = None,
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
    --plot FILE.html writes a dashboard page: the feature list (search, sort) and each feature's contexts with
    every token shaded by its activation, histogram, logit effects and co-firing features; feature ID's panel is
    FILE.html#f-ID. The table lists the --show N most frequent features (JSON: every one). Without --model, the
    model the dictionary's metadata names, when it resolves. sae, circuit and generate --steer-feature read
    labels from --features-dir DIR (DIR/explanations.json, DIR/features.html linked).
    See docs/commands/features.md.

    Examples:

    \b
        anatomy features ./gpt2-res-jb/blocks.6.hook_resid_post --corpus docs/ --model gpt2 --max-tokens 100000
        anatomy features ./sae --corpus data.jsonl --features 0-99 --out feats --format json
        anatomy features ./sae --corpus docs/ --feature 123 --out feats --delphi feats/latents
        anatomy features ./sae --corpus docs/ --features 0-499 --plot features.html
        anatomy features ./sae --corpus docs/ --out feats --plot feats/features.html
        anatomy features ./sae --corpus docs/ --estimate
    """
    view = when_run("output.views.features")
    measure = when_run("tasks._features_run").measure

    if plot is not None and opts.estimate:
        raise UsageError("--estimate runs no pass: it draws no --plot (drop one of the two)")
    check_path = when_run("output.plots").check_path

    plot = check_path(plot, made=opts.out)  # FILE inside a --out DIR not made yet: made by the run
    run = measure(spec, opts, given=model_given(spec))  # no --model: the recorded one
    emit(view.report(run), fmt)
    if plot is not None:
        plots = when_run("output.plots")

        args, kwargs = view.figure(run)
        records = None if opts.out is None else read_export(opts.out, run.sae_file.hook_name, run.plan.features)
        if records:  # explain's explanations in --out: on the page too
            flat = when_run("output.views.explain").flat

            kwargs["explanations"] = flat(records)
        plots.draw("features", plots.make_folder(plot), None, *args, **kwargs)
