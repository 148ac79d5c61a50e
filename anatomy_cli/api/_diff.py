"""`anatomy diff` as a function: :func:`diff`. Runs the command's task (:mod:`anatomy_cli.tasks.diff`) with the
same :class:`~anatomy_cli.tasks.diff.DiffOptions` and its view. No torch at import time."""

from __future__ import annotations

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.views import diff as view
from anatomy_cli.tasks import diff as task
from anatomy_cli.tasks.session import model_label
from anatomy_cli.text.options import PromptOptions


@command(task.DiffOptions)
def diff(a: str | ModelSpec, b: str | ModelSpec, prompt: str | list[str] | None = None,
         opts: task.DiffOptions = task.DiffOptions(), *,
         prompts: PromptOptions = PromptOptions()) -> Result | list[Result]:
    """`anatomy diff A B [PROMPT]`: two models of one shape. Without ``prompt`` (or ``weights``): the weights,
    tensor by tensor (``result``: WeightsDiff; rows: ``rows``). With a prompt: the residual streams and lenses
    (``result``: ActivationDiff; rows: ``layers``, named ``embed`` then the blocks 0..L−1), one Result per prompt
    for a list. ``a``, ``b``: names or ModelSpecs (opened here: A runs and is freed before B loads)."""
    spec_a = a if isinstance(a, ModelSpec) else ModelSpec(a)
    spec_b = b if isinstance(b, ModelSpec) else ModelSpec(b)
    opts.check_mode(prompt is not None)
    if prompt is None:
        result = task.run_weights(spec_a.model, spec_b.model, spec_a.trust_remote_code)
        return Result(task.COMMAND, result, view.weights_report(result).data, "rows")
    texts, single = texts_of(prompt)
    opened_a, opened_b, encoded, encoded_b = task.open_pair(spec_a, spec_b, texts, prompts)
    plan = task.check(opened_a, opened_b, encoded, encoded_b, opts)
    label_a, lm, results = task.run_activations(opened_a, opened_b, encoded, opts, plan)
    out = []
    for enc, r in zip(encoded, results):  # no .plot() yet: plots/diff.py has two figures, Result.plot calls `figure`
        out.append(Result(task.COMMAND, r, view.activations_report(label_a, model_label(lm), enc, r).data, "layers"))
    return out[0] if single else out
