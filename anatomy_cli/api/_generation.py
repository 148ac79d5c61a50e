"""Generation and steering: generate, steer. Each builds its command's options object from its keywords and runs
the command's task (:mod:`anatomy_cli.tasks.generate`, :mod:`anatomy_cli.tasks.steer`) and view, returning the
command's JSON with its result object (:class:`~anatomy_cli.api._results.Result`). No torch at import time."""

from __future__ import annotations

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.output.views import generate as generate_view
from anatomy_cli.output.views import steer as view
from anatomy_cli.tasks import generate as generate_task
from anatomy_cli.tasks import steer as steer_task
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]


@command(generate_task.GenerateOptions)
def generate(model: Model, prompt: str | list[str], opts: generate_task.GenerateOptions, *,
             prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy generate`: the continuation token by token through the KV cache. ``steer`` (a vector file of
    ``steer(out=...)`` or a llama.cpp control vector), or ``steer_feature`` with ``sae`` (an SAE feature's
    decoder row), adds ``coef`` times it at every position; a list of coefficients is a sweep. ``result``:
    Continuation (rows: ``steps``) or, for a sweep, Sweep (rows: ``sweep``). ``lens``: True (the logit lens),
    ``"tuned:DIR"`` or ``"jacobian:FILE"``. ``plot()`` draws the sweep or, with ``lens``, the block x step grid."""
    texts, single = texts_of(prompt)
    first = opened(model)
    encoded = encode(first, texts, prompts)
    plan = generate_task.check(first, opts)
    lm = weights(first)
    out = []
    for enc, done in zip(encoded, generate_task.run(lm, encoded, opts, plan)):
        args, kwargs = generate_view.figure(lm, enc, done, opts, plan) if generate_view.drawable(opts) else ((), {})
        out.append(Result(generate_task.COMMAND, done.result, generate_view.report(lm, enc, done, opts, plan).data,
                          generate_view.rows_key(opts), args, kwargs))
    return out[0] if single else out


@command(steer_task.SteerOptions)
def steer(model: Model, opts: steer_task.SteerOptions, *, prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy steer`: a steering vector from contrastive prompts (a str is one prompt) at ``layer`` (a block,
    ``"4-8"``, a list), saved to ``out`` (safetensors) and/or ``save_control_vector`` (llama.cpp GGUF).
    ``result``: Steering (``vector``: the SteeringVector, ``directions``: one LayerDirection per layer); rows:
    ``layers``."""
    first = opened(model)
    encoded = encode(first, steer_task.texts(opts), prompts)
    plan = steer_task.check(first, opts)
    lm = weights(first)
    result = steer_task.run(lm, encoded, opts, plan)
    return Result(steer_task.COMMAND, result, view.report(lm, result, opts).data, view.ROWS)
