"""`anatomy corpus SOURCE`: per-layer (and per-head) statistics over a whole corpus, resumable, on Ray if asked."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Annotated
from typing import TypeVar

import typer

from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import PlotOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import corpus as task

F = TypeVar("F", bound=Callable[..., object])


def _place(name: str, after: str) -> Callable[[F], F]:
    """The registered command's parameter ``name`` shown in ``--help`` right after ``after`` (``--no-lens``, no
    field of the options, stands after ``--lens-every`` among them). Typer reads the signature when the click
    command is built, after registration."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name != name]
        at = [p.name for p in params].index(after) + 1
        fn.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*params[:at], sig.parameters[name], *params[at:]])
        return fn

    return decorate


@_place("no_lens", after="lens_every")
@command("corpus", task.CorpusOptions)
@model_options()
def corpus_command(
    context: typer.Context,
    source: Annotated[str, typer.Argument(
        metavar="SOURCE", show_default=False,
        help="A text file, a directory of .txt/.md files, '-' (stdin), a .jsonl/.csv/.parquet file (--column), "
             "or a datasets save_to_disk directory.")],
    opts: task.CorpusOptions,
    no_lens: Annotated[bool, typer.Option("--no-lens", help="Skip every lens (KL, top-1, CE, entropy).")] = False,
    spec: ModelSpec = ModelSpec(),
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Lens quality (logit, tuned, Jacobian), residual stream, massive activations per layer (and heads) over a corpus.

    Documents are packed into windows of --ctx tokens; every position of every window is measured and
    summed in float64 (mean ± standard error over windows). With --out DIR each shard of windows is saved
    as Parquet, and running the same command again skips finished shards. See docs/corpus.md.

    Examples:

    \b
        anatomy corpus docs/ --model model.gguf --max-tokens 20000
        anatomy corpus data.jsonl --column body --heads --out run1
        anatomy corpus docs/ --lens-every 4 --ray --workers 2 --format json
        anatomy corpus docs/ --lens logit --lens jacobian:lens.pt --lens tuned:tuned/
        anatomy corpus docs/ --model ./my-moe --experts --out run2
    """
    view = when_run("output.views.corpus")

    if no_lens:
        if context.params.get("lens"):  # as typed: the options hold the lenses it stands for
            raise UsageError("--no-lens skips every lens: give it or --lens, not both")
        opts = dataclasses.replace(opts, lens=False)
    run = task.measure(source, spec, opts)
    emit(view.report(run), fmt)
    if plot:
        plots = when_run("output.plots")
        from anatomy_cli.output.plots import corpus as picture

        args, kwargs = view.figure(run)
        plots.save(picture.figure(*args, **kwargs), plot)  # .html: the picture embedded in a page
