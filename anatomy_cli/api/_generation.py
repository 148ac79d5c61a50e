"""Generation and steering: generate, steer. Each builds its command's options object from its keywords and runs
the command's task (:mod:`anatomy_cli.tasks.generate`, :mod:`anatomy_cli.tasks.steer`) and view, returning the
command's JSON with its result object (:class:`~anatomy_cli.api._results.Result`). No torch at import time."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import loaded
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]


def generate(model: Model, prompt: str | list[str], *, max_new_tokens: int = 20, sample: bool = False,
             temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, k: int = 5,
             lens: bool | str | None = False, steer: str | Path | None = None, coef: float | list[float] | None = None,
             steer_feature: int | None = None, sae: str | Path | None = None, check: bool = False,
             target: str | None = None, target_id: int | None = None, first_token: bool = False,
             prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy generate`: the continuation token by token through the KV cache. ``steer`` (a vector file of
    ``steer(out=...)`` or a llama.cpp control vector), or ``steer_feature`` with ``sae`` (an SAE feature's
    decoder row), adds ``coef`` times it at every position; a list of coefficients is a sweep. ``result``:
    Continuation (rows: ``steps``) or, for a sweep, Sweep (rows: ``sweep``). ``lens``: True (the logit lens),
    ``"tuned:DIR"`` or ``"jacobian:FILE"``. ``plot()`` draws the sweep or, with ``lens``, the block x step grid."""
    from anatomy_cli.output.views import generate as view
    from anatomy_cli.tasks import generate as task

    opts = task.GenerateOptions(
        max_new_tokens=max_new_tokens, k=k, lens=lens, check=check, target=target, target_id=target_id,
        first_token=first_token,
        sampling=task.SamplingOptions(sample=sample, temperature=temperature, top_p=top_p, seed=seed),
        steering=task.SteeringOptions(steer=steer, coef=coef, steer_feature=steer_feature, sae=sae))
    lm = loaded(model)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    plan = task.check(lm, opts)
    out = []
    for enc, done in zip(encoded, task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, done, opts, plan) if view.drawable(opts) else ((), {})
        out.append(Result(task.COMMAND, done.result, view.report(lm, enc, done, opts, plan).data,
                          view.rows_key(opts), args, kwargs))
    return out[0] if single else out


def steer(model: Model, positive: str | list[str] | None = None, negative: str | list[str] | None = None, *,
          pairs: str | Path | None = None, layer: int | str | list[int], site: str = "resid_post",
          reduce: str = "last", method: str = "mean", out: str | Path | None = None,
          save_control_vector: str | Path | None = None, prompts: PromptOptions = PromptOptions(),
          batch_size: int = 8) -> Result:
    """`anatomy steer`: a steering vector from contrastive prompts (a str is one prompt) at ``layer`` (a block,
    ``"4-8"``, a list), saved to ``out`` (safetensors) and/or ``save_control_vector`` (llama.cpp GGUF).
    ``result``: Steering (``vector``: the SteeringVector, ``directions``: one LayerDirection per layer); rows:
    ``layers``."""
    from anatomy_cli.output.views import steer as view
    from anatomy_cli.tasks import steer as task

    opts = task.SteerOptions(positive=positive, negative=negative, pairs=pairs, layer=layer, site=site,
                             reduce=reduce, method=method, out=out, save_control_vector=save_control_vector,
                             batch_size=batch_size)
    lm = loaded(model)
    encoded = encode(lm, task.texts(opts), prompts)
    plan = task.check(lm, opts)
    result = task.run(lm, encoded, opts, plan)
    return Result(task.COMMAND, result, view.report(lm, result, opts).data, view.ROWS)
