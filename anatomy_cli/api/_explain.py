"""`anatomy explain` as a function: explanations of a `features` run's features, written and scored by chat
models. Runs the command's task (:func:`anatomy_cli.tasks._explain_run.measure`) with the same
:class:`~anatomy_cli.tasks.explain.ExplainOptions` and returns its view's JSON. No torch at import time."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._declared import command
from anatomy_cli.api._results import Result
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.views import explain as view
from anatomy_cli.tasks import explain as task
from anatomy_cli.tasks._explain_run import measure


@command(task.ExplainOptions, inputs=("features_dir",))
def explain(features_dir: str | Path, opts: task.ExplainOptions, *, device: str = "auto", dtype: str = "fp32",
            trust_remote_code: bool = False) -> Result:
    """`anatomy explain FEATURES_DIR --explainer MODEL`: ``features_dir`` what ``anatomy.features(...,
    out=DIR, delphi=DIR/latents)`` wrote; ``explainer`` (and ``scorer``) chat models by name, path or .gguf,
    loaded on ``device`` in ``dtype`` (``trust_remote_code`` as ``--trust-remote-code``). Per feature its
    explanation (delphi's explainer prompt), delphi's detection and fuzzing scores (balanced accuracy, F1) and
    the control (the same scorer on another feature's explanation); writes ``explanations.json`` (a Neuronpedia
    explanations export). ``result``: the run (``records``: the export); rows: ``features``."""
    run = measure(ModelSpec("explainer", device=device, dtype=dtype, trust_remote_code=trust_remote_code), opts)
    return Result(task.COMMAND, run, view.report(run).data, view.ROWS)
