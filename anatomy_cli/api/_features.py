"""`anatomy features` as a function: a dictionary's features over a corpus. Runs the command's task
(:func:`anatomy_cli.tasks._features_run.measure`) with the same :class:`~anatomy_cli.tasks.features.FeaturesOptions`
and returns its view's JSON. No torch at import time."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import left_out
from anatomy_cli.api._results import Result
from anatomy_cli.engine.loader import GivenLoader as _Given
from anatomy_cli.engine.loader import using_loader
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.views import features as view
from anatomy_cli.tasks import features as task
from anatomy_cli.tasks._features_run import measure


@command(task.FeaturesOptions, inputs=("sae",))
def features(model: Model | None, sae: str | Path, opts: task.FeaturesOptions) -> Result:
    """`anatomy features DICT --corpus PATH`: ``sae`` the dictionary (as ``anatomy sae`` reads it), ``corpus`` the
    text; per followed feature (``feature``: ids, ``features``: ranges such as ``"0-99"``; none: all) its firing
    frequency, mean and max activation, histogram, top contexts, contexts sampled from its activation intervals,
    co-firing features and logit effects. ``out``: a directory for the Parquet tables and the resumable shards;
    ``delphi``: delphi's latent cache. ``model``: a LoadedModel, a ModelSpec or a name; None: the model the
    dictionary's metadata names (``model_name``, as fit-sae writes it) where it resolves, else the default model.
    ``result``: the run (``rows``, ``contexts``, ``logits``); rows: ``features``."""
    if model is None:
        run = measure(left_out(), opts, given=False)
    elif isinstance(model, (ModelSpec, str)):
        run = measure(model if isinstance(model, ModelSpec) else ModelSpec(model), opts)
    else:
        with using_loader(_Given(model)):
            run = measure(ModelSpec(model.name), opts)
    return Result(task.COMMAND, run, view.report(run).data, view.ROWS)
