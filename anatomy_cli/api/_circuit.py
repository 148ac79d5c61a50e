"""`anatomy.circuit`: the attribution graph (the same task and view as `anatomy circuit`)."""

from __future__ import annotations

from typing import Any

from anatomy_cli.api._model import Model
from anatomy_cli.api._results import Result
from anatomy_cli.api._run import run_prompts
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text.options import PromptOptions


def circuit(model: Model, prompt: str | list[str], *, transcoders: str, max_n_logits: int = 10,
            desired_logit_prob: float = 0.95, target: list[str] | tuple[str, ...] | None = None,
            target_id: list[int] | tuple[int, ...] | None = None, first_token: bool = False,
            batch_size: int = 256, max_feature_nodes: int | None = 7500, update_interval: int = 4,
            node_threshold: float = 0.8, edge_threshold: float = 0.98, out: str | None = None,
            json: str | None = None, labels: str | None = None, check: int = 0, top: int = 10,
            offload: str | None = None, estimate: bool = False,
            prompts: PromptOptions = PromptOptions()) -> Result | list[Result]:
    """`anatomy circuit`: the attribution graph of the next-token prediction over a transcoder replacement model
    (circuit-tracer's algorithm). ``result``: CircuitResult (``.graph``, ``.prune``, ``.json`` — the Neuronpedia
    graph dict —, ``.paths``); rows: ``paths``. ``target`` / ``target_id``: the logit nodes by text (one token
    each; ``first_token``: a longer text's first) and by id, texts first. ``out``: graph.pt; ``json``: the graph
    JSON. ``offload``: ``cpu`` or ``disk``; ``estimate``: the result is the cost (CircuitEstimate: size, bytes,
    seconds) and nothing is computed (a model given by name is opened, not loaded)."""
    from anatomy_cli.output.views import circuit as view
    from anatomy_cli.tasks import circuit as task

    opts = task.CircuitOptions(transcoders=transcoders, max_n_logits=max_n_logits,
                               desired_logit_prob=desired_logit_prob, target=tuple(target or ()),
                               target_id=tuple(target_id or ()), first_token=first_token,
                               batch_size=batch_size, max_feature_nodes=max_feature_nodes,
                               update_interval=update_interval, node_threshold=node_threshold,
                               edge_threshold=edge_threshold, out=out, json=json, labels=labels,
                               check=check, top=top, offload=offload, estimate=estimate)
    if estimate:
        return _estimates(model, prompt, opts, prompts)
    return run_prompts(task, view, model, prompt, opts, prompts)


def _estimates(model: Model, prompt: str | list[str], opts: Any, prompts: PromptOptions) -> Result | list[Result]:
    """``estimate=True``: one Result per prompt whose rows are the estimate's quantities (``view.ESTIMATE_ROWS``);
    a model given by name or spec is opened, not loaded; a loaded one gives its own device."""
    from anatomy_cli.api._model import encode
    from anatomy_cli.api._model import loaded
    from anatomy_cli.output.views import circuit as view
    from anatomy_cli.tasks import circuit as task
    from anatomy_cli.tasks.session import open_texts
    from anatomy_cli.tasks.session import texts_of

    texts, single = texts_of(prompt)
    shown: Any  # the opened model (given by name) or the loaded one
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
