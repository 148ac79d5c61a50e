"""`anatomy.circuit`: the attribution graph (the same task and view as `anatomy circuit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import left_out
from anatomy_cli.api._model import loaded
from anatomy_cli.api._results import Result
from anatomy_cli.api._run import run_prompts
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.views import circuit as view
from anatomy_cli.tasks import circuit as circuit_task
from anatomy_cli.tasks import circuit as task
from anatomy_cli.tasks.recorded_model import for_transcoders
from anatomy_cli.tasks.session import open_texts
from anatomy_cli.tasks.session import texts_of
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.opening import OpenedModel
    from anatomy_cli.tasks.circuit import CircuitOptions


@command(circuit_task.CircuitOptions)
def circuit(model: Model | None, prompt: str | list[str], opts: circuit_task.CircuitOptions, *,
            prompts: PromptOptions = PromptOptions()) -> Result | list[Result]:
    """`anatomy circuit`: the attribution graph of the next-token prediction over a transcoder replacement model
    (circuit-tracer's algorithm). ``result``: CircuitResult (``.graph``, ``.prune``, ``.json`` — the Neuronpedia
    graph dict —, ``.paths``); rows: ``paths``. ``target`` / ``target_id``: the logit nodes by text (one token
    each; ``first_token``: a longer text's first) and by id, texts first. ``out``: graph.pt; ``json``: the graph
    JSON (a list of prompts: one file per prompt, ``graph-1.json``, ...); ``ids``: its node ids (``current``, or
    ``ct-0.5``: circuit-tracer 0.5.0's, refused where two nodes would share one). ``offload``: ``cpu`` or
    ``disk``; ``estimate``: the result is the cost (CircuitEstimate: size, bytes, seconds) and nothing is computed
    (a model given by name is opened, not loaded). ``model=None``: the model the transcoders' metadata names
    (``model_name``, as fit-sae writes it) where it resolves, else the default model."""
    if model is None:
        model = for_transcoders(left_out(), False, opts.transcoders)
    if opts.estimate:
        return _estimates(model, prompt, opts, prompts)
    return run_prompts(circuit_task, view, model, {"prompt": prompt}, opts, prompts)


def _estimates(model: Model, prompt: str | list[str], opts: CircuitOptions,
               prompts: PromptOptions) -> Result | list[Result]:
    """``estimate=True``: one Result per prompt whose rows are the estimate's quantities (``view.ESTIMATE_ROWS``);
    a model given by name or spec is opened, not loaded; a loaded one gives its own device."""
    texts, single = texts_of(prompt)
    shown: OpenedModel | LoadedModel
    if isinstance(model, (str, ModelSpec)):
        spec = model if isinstance(model, ModelSpec) else ModelSpec(model)
        opened, encoded = open_texts(texts, spec, prompts)
        shown, device = opened, spec.device
    else:
        lm = loaded(model)
        encoded, shown, device = encode(lm, texts, prompts), lm, str(lm.device)
    plan = task.check(shown, opts)
    results = [Result(task.COMMAND, e, view.report(shown, enc, e).data, view.ESTIMATE_ROWS)
               for enc, e in zip(encoded, task.estimate(shown.info, encoded, opts, plan, device))]
    return results[0] if single else results
