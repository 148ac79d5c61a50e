"""Generation: one token at a time through the key/value cache, with hooks that stay on for every step.

:func:`generate` runs the prompt once (:func:`~anatomy_cli.engine.forwarding.forward_cached`, ``use_cache=True``),
then each new token alone against the cache; hooks given to it (``{hook name: fn}``, as
:func:`~anatomy_cli.engine.hooks.attach` takes them: a steering vector's addition) are attached around the whole
loop, so they act on every position of the prompt and of every generated token. ``use_cache=False`` runs a full
forward over the prompt and the tokens so far at every step instead (:func:`~anatomy_cli.engine.forwarding.forward`):
the same numbers to float rounding, the reference ``--check`` compares against. Which token comes next is the
caller's rule (``choose``: greedy, a sampler, or a fixed list to replay a run). ``lens`` also keeps, per step, the
logit lens of every block's output (``resid_post``) at the new position: the chosen token's log-probability
and the lens's top-1 token per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from anatomy_cli.engine.forwarding import forward
from anatomy_cli.engine.forwarding import forward_cached
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.hooks import HookFn
from anatomy_cli.engine.hooks import attach
from anatomy_cli.engine.hooks import capture
from anatomy_cli.engine.hooks import layer_names
from anatomy_cli.engine.lens import unembed
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

Choose = Callable[[torch.Tensor], int]
"""``logits [vocab]`` (float32, soft-capped as the model's own) -> the next token id."""


@dataclass(frozen=True)
class Generation:
    """One prompt's continuation.

    ``tokens``: the generated ids (the stop token included when the model chose it); ``logits``
    ``[steps, vocab]`` float32 on the CPU, the distribution step s chose ``tokens[s]`` from; ``stopped``:
    ``"eos"``, ``"max_new_tokens"`` or ``"context"`` (the model's context is full). With ``lens``:
    ``lens_logprob [steps, n_layers]`` float64, the chosen token's log-probability under the logit lens of
    block l's output, and ``lens_top [steps, n_layers]`` the lens's top-1 id (the last layer's lens is the
    model's own distribution)."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    logits: torch.Tensor
    stopped: str
    lens_logprob: torch.Tensor | None = None
    lens_top: torch.Tensor | None = None


def greedy(logits: torch.Tensor) -> int:
    """The most probable token (the first of equal ones, as ``torch.argmax``): transformers' greedy search."""
    return int(torch.argmax(logits))


def replay(tokens: Sequence[int]) -> Choose:
    """A ``choose`` that returns ``tokens`` in order, whatever the logits: reruns a generation step by step."""
    it = iter(tokens)
    return lambda _logits: next(it)


def stop_ids(lm: LoadedModel) -> tuple[int, ...]:
    """The ids generation stops at: the tokenizer's EOS and the model's generation config's ``eos_token_id``
    (one id or a list; transformers' ``generate`` stops at those)."""
    ids: list[int] = []
    eos = lm.tokenizer.eos_id
    if eos is not None:
        ids.append(int(eos))
    config = getattr(lm.model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None)
    if extra is not None:
        ids += [int(i) for i in (extra if isinstance(extra, (list, tuple)) else [extra])]
    return tuple(dict.fromkeys(ids))


def generate(lm: LoadedModel, prompt: Sequence[int], *, max_new_tokens: int, choose: Choose = greedy,
             stop: Iterable[int] = (), hooks: Mapping[str, HookFn] | None = None, lens: bool = False,
             use_cache: bool = True, progress: Callable[[int, int], None] | None = None,
             lens_map: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Generation:
    """Continue ``prompt`` (token ids) by up to ``max_new_tokens`` tokens; see the module docstring.

    ``lens_map``: with ``lens``, a fitted lens' reading of the block outputs ``[n_layers, d_model]`` before the
    unembed (:meth:`FittedLens.read_blocks`; NaN rows, the blocks it was not fitted at, read NaN with top -1).

    ``progress(done, max_new_tokens)`` is called after each new token (a status line; it may raise to stop).

    Stops after a token in ``stop``, or when the model's context is full. Raises UsageError for a model
    without an LM head or one that is not causal, and for an empty prompt; AnatomyError for an id outside the
    vocabulary.
    """
    if not lm.is_causal or not lm.has_unembed:
        raise UsageError(f"{lm.name} is not a decoder with an LM head: it cannot generate")
    ids = [int(i) for i in prompt]
    if not ids:
        raise UsageError("empty prompt")
    if max(ids) >= lm.vocab_size:
        raise AnatomyError(f"token id {max(ids)} is outside {lm.name}'s vocabulary ({lm.vocab_size})")
    stop_set = set(stop)
    lm.model.eval()
    rows: list[torch.Tensor] = []
    lens_lp: list[torch.Tensor] = []
    lens_top: list[torch.Tensor] = []
    stopped = "max_new_tokens"
    past: Cache | None = None
    with torch.inference_mode(), ExitStack() as stack:
        if hooks:
            stack.enter_context(attach(lm, hooks))
        store = stack.enter_context(capture(lm, layer_names(lm, "resid_post"))) if lens else None
        new = ids
        for _ in range(max_new_tokens):
            if lm.n_ctx is not None and len(ids) >= lm.n_ctx:
                stopped = "context"
                break
            if use_cache:
                hidden, past = forward_cached(lm, torch.tensor([new], device=lm.device), past)
            else:
                hidden = forward(lm, torch.tensor([ids], device=lm.device))
            logits = head_logits(lm, hidden[:, -1])[0].float().cpu()
            token = int(choose(logits))
            rows.append(logits)
            if store is not None:
                lp, top = _lens_step(lm, store, token, lens_map)
                lens_lp.append(lp)
                lens_top.append(top)
            ids.append(token)
            new = [token]
            if progress is not None:
                progress(len(ids) - len(prompt), max_new_tokens)
            if token in stop_set:
                stopped = "eos"
                break
    vocab = lm.vocab_size
    return Generation(prompt=tuple(int(i) for i in prompt), tokens=tuple(ids[len(prompt):]),
                      logits=torch.stack(rows) if rows else torch.zeros((0, vocab)), stopped=stopped,
                      lens_logprob=torch.stack(lens_lp) if lens else None,
                      lens_top=torch.stack(lens_top) if lens else None)


def _lens_step(lm: LoadedModel, store: dict[str, torch.Tensor], token: int,
               lens_map: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lens of each block's output at the newest position (the logit lens, or ``lens_map`` then the
    unembed): ``token``'s log-probability and the top-1 id per layer, ``[n_layers]`` each."""
    resid = torch.stack([store[name][0, -1] for name in layer_names(lm, "resid_post")])  # [n_layers, d_model]
    if lens_map is None:
        logp = torch.log_softmax(unembed(lm, resid).to("cpu", torch.float64), dim=-1)
        return logp[:, token], logp.argmax(dim=-1)
    mapped = lens_map(resid)
    read = torch.isfinite(mapped).all(dim=-1).cpu()
    rows = torch.log_softmax(unembed(lm, mapped[read.to(mapped.device)]).to("cpu", torch.float64), dim=-1)
    logp = torch.full((len(resid), rows.shape[-1]), float("nan"), dtype=torch.float64)
    logp[read] = rows
    top = torch.where(read, torch.nan_to_num(logp, nan=-torch.inf).argmax(dim=-1), -1)
    return logp[:, token], top
