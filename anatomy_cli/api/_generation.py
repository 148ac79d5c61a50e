"""Generation and steering: generate, steer. Each runs the code its command runs (``cli/commands/generate``'s
option check, ``_generation.one_prompt``; ``_steering``'s pairs, layers, vector and files) and returns the
command's JSON with its result object (:class:`~anatomy_cli.api._results.Result`). No torch at import time."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._model import Model, encode, loaded, resolve_token, texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.errors import UsageError
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]


def generate(model: Model, prompt: str | list[str], *, max_new_tokens: int = 20, sample: bool = False,
             temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, k: int = 5,
             lens: bool = False, steer: str | Path | None = None, coef: float | list[float] | None = None,
             check: bool = False, target: str | None = None, target_id: int | None = None,
             first_token: bool = False, prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy generate`: the continuation token by token through the KV cache. ``steer`` (a vector file of
    ``steer(out=...)`` or a llama.cpp control vector) adds ``coef`` times it at every position; a list of
    coefficients is a sweep. ``result``: Continuation (rows: ``steps``) or, for a sweep, Sweep (rows:
    ``sweep``). ``plot()`` draws the sweep or, with ``lens``, the block x step grid."""
    from anatomy_cli.cli.commands import _generation as gen
    from anatomy_cli.cli.commands import generate as command

    if max_new_tokens < 1 or k < 1:
        raise UsageError("max_new_tokens and k must be at least 1")
    coefs = command.check_options(coef=coef, steer=steer, targeted=target is not None or target_id is not None,
                                  plot=None, lens=lens, sample=sample, temperature=temperature, top_p=top_p,
                                  seed=seed)
    lm = loaded(model)
    if not lm.is_causal or not lm.has_unembed:
        raise UsageError(f"{lm.name} is an encoder ({lm.adapter.name}): `generate` needs a decoder")
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    wanted = resolve_token(lm, target, target_id, first_token=first_token)
    path = None if steer is None else Path(steer)
    vector, settings = gen.prepare(lm, path, sample=sample, temperature=temperature, top_p=top_p, seed=seed,
                                   max_new_tokens=max_new_tokens, k=k, lens=lens)
    sampling = command._sampling(sample, temperature, top_p, seed)
    out = []
    for enc in encoded:
        outcome = gen.one_prompt(lm, enc, settings, coefs, wanted, check,
                                 gen.header(lm, enc, sampling, path, vector, coefs))
        rows_key = "sweep" if len(coefs) > 1 else "steps"
        drawable = len(coefs) > 1 or lens
        args = (outcome.result, gen.caption(lm, enc, outcome.result, vector, coefs)) if drawable else ()
        out.append(Result("generate", outcome.result, outcome.report.data, rows_key, args))
    return out[0] if single else out


def steer(model: Model, positive: list[str] | None = None, negative: list[str] | None = None, *,
          pairs: str | Path | None = None, layer: int | str | list[int], site: str = "resid_post",
          reduce: str = "last", method: str = "mean", out: str | Path | None = None,
          save_control_vector: str | Path | None = None, prompts: PromptOptions = PromptOptions(),
          batch_size: int = 8) -> Result:
    """`anatomy steer`: a steering vector from contrastive prompts at ``layer`` (a block, ``"4-8"``, a list),
    saved to ``out`` (safetensors) and/or ``save_control_vector`` (llama.cpp GGUF). ``result``: Steering
    (``vector``: the SteeringVector, ``directions``: one LayerDirection per layer); rows: ``layers``."""
    from anatomy_cli.cli.commands import _steering

    lm = loaded(model)
    layer_text = ",".join(map(str, layer)) if isinstance(layer, (list, tuple)) else str(layer)
    pos, neg = _steering.check_options(list(positive or []), list(negative or []),
                                       None if pairs is None else Path(pairs), site, reduce, method)
    encoded = encode(lm, pos + neg, prompts)
    layers = _steering.parse_layers(layer_text, lm.n_layers)
    if not lm.is_causal:
        raise UsageError(f"{lm.name} is an encoder: steering vectors here are for decoders that generate")
    result, report = _steering.run(lm, encoded, pos, neg, layers, site, reduce, method, batch_size,
                           None if out is None else Path(out),
                           None if save_control_vector is None else Path(save_control_vector), lm.name)
    return Result("steer", result, report.data, "layers")
