"""`anatomy corpus` as a function: per-layer (and per-head) statistics over a whole corpus. Runs the command's
task (:func:`anatomy_cli.tasks.corpus.measure`) with the same :class:`~anatomy_cli.tasks.corpus.CorpusOptions`
and returns its view's JSON with the runner's result (``stats``: the
:class:`~anatomy_cli.corpus.summary.CorpusStats` the command renders). No torch at import time."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._results import Result
from anatomy_cli.engine.loader import GivenLoader as _Given
from anatomy_cli.engine.loader import using_loader
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.views import corpus as view
from anatomy_cli.tasks import corpus as task


@command(task.CorpusOptions)
def corpus_stats(model: Model, source: str | Path, opts: task.CorpusOptions) -> Result:
    """`anatomy corpus SOURCE` (not named ``corpus``: ``anatomy_cli.corpus`` is a subpackage, which would shadow
    it): SOURCE a text file, a directory of .txt/.md files, a .jsonl/.csv/.parquet file with ``column``, a
    datasets directory: windows of ``ctx`` tokens measured at every position, means ± standard
    errors over windows; ``out`` a directory to write shards to and resume from; ``lens``: the lenses
    measured, ``"logit"``, ``"tuned:DIR"``, ``"jacobian:FILE"`` or a list of them (``--lens``, repeatable; None
    or True: the logit lens alone, the default; False: ``--no-lens``), per lens in ``to_dict()["lenses"]``; the other
    keywords as the command's options. ``model``: a LoadedModel (used as it is; the run's manifest keys it by its
    name), a ModelSpec or a name (opened and loaded; with ``ray`` the workers load it). ``result``: the runner's
    Result (``stats``, ``shards``, ``resumed``); rows: ``layers`` (L + 1, ``layer`` ``"embed"`` then the blocks
    0..L−1); ``to_dict()["heads"]`` with ``heads``; ``to_dict()["experts"]``, ``["expert_blocks"]`` and
    ``["expert_pairs"]`` with ``experts`` (an MoE model's routing counts)."""
    if isinstance(model, (ModelSpec, str)):
        run = task.measure(str(source), model if isinstance(model, ModelSpec) else ModelSpec(model), opts)
    else:
        with using_loader(_Given(model)):
            run = task.measure(str(source), ModelSpec(model.name), opts)
    args, kwargs = view.figure(run)
    return Result(task.COMMAND, run.result, view.report(run).data, view.ROWS, args, kwargs)
