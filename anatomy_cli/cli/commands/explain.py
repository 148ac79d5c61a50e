"""`anatomy explain FEATURES_DIR --explainer MODEL`: explanations of a `features` run's features, written by a
chat model and scored with delphi's detection and fuzzing scorers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import html_plot
from anatomy_cli.cli.options import model_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.feature_labels import DASHBOARD
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import explain as task

PlotOpt = Annotated[Optional[Path], html_plot(
    "explain", "Write the features dashboard (as features --plot draws it, from FEATURES_DIR's tables) with the "
    "explanations and their scores to FILE.html. Default: FEATURES_DIR/features.html is rewritten so where it "
    "exists (and --out is not given).", in_out=True)]


@command("explain", task.ExplainOptions, inputs=("features_dir",))
@model_options(fields=("device", "dtype", "trust_remote_code"))
def explain_command(
    features_dir: Annotated[Path, typer.Argument(
        metavar="FEATURES_DIR", show_default=False,
        help="What anatomy features --out DIR wrote, with delphi's latent cache (--delphi) inside it or named "
             "with --delphi.")],
    opts: task.ExplainOptions,
    spec: ModelSpec = ModelSpec(),
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Explanations of a dictionary's features, written by a chat model from the features' top-activating
    contexts with delphi's explainer prompt (the activating tokens marked <<so>>, each with its activation on a
    0-10 scale), through anatomy's own generation (greedy by default). Each is scored as delphi scores it:
    detection (held-out activating contexts against random ones where the feature does not fire) and fuzzing
    (the activating tokens marked, against wrongly marked ones), as balanced accuracy and F1, by --scorer (default
    the explainer); and, as a control, the same scorer on another feature's explanation.

    Writes FEATURES_DIR/explanations.json (or --out DIR), a Neuronpedia explanations export that sae --labels and
    circuit --labels read. It is rewritten after every feature: an interrupted run keeps what it wrote, and the
    same command again continues. The cost, from the first generation's measured rates, is printed on stderr,
    progress during the run. The features dashboard (features --plot FEATURES_DIR/features.html, where it exists;
    or --plot FILE.html) is written again with each feature's explanation and scores in its panel, the list
    sortable by score and searched in the explanations. See docs/commands/explain.md.

    Examples:

    \b
        anatomy features ./sae --corpus docs/ --model smollm2 --features 0-99 --out feats --delphi feats/latents
        anatomy explain feats --explainer smollm2 --max-features 8
        anatomy explain feats --explainer ./big-instruct --scorer ./other-instruct --format json
        anatomy sae "The capital of France is" --sae ./sae --model smollm2 --labels feats/explanations.json
    """
    plots = when_run("output.plots")
    view = when_run("output.views.explain")
    measure = when_run("tasks._explain_run").measure

    plot = plots.check_path(plot, made=opts.target)  # FILE inside a --out DIR not made yet: made by the run
    run = measure(spec, opts)
    emit(view.report(run), fmt)
    page = plot if plot is not None else _dashboard(opts)
    if page is not None:
        args, kwargs = view.dashboard(run, Path(opts.features_dir))
        plots.draw("features", plots.make_folder(page), None, *args, **kwargs)


def _dashboard(opts: task.ExplainOptions) -> Path | None:
    """FEATURES_DIR's dashboard page (feature_labels.py's DASHBOARD name), when it exists and the explanations
    were written beside it (no --out)."""
    page = Path(opts.features_dir) / DASHBOARD
    return page if opts.out is None and page.is_file() else None
