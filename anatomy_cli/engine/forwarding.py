"""The one forward primitive and the one place a batch of prompts is padded.

Every model call of the engine goes through :func:`forward`: the base model (no LM head; the head is applied
to the rows a caller keeps, :func:`head_logits`), with ``use_cache=False`` for causal models (no key/value
cache is built for a single pass) and nothing added for encoders. Generation is the one explicit exception:
:func:`forward_cached` runs the same call with ``use_cache=True`` and the cache of the steps before, and gives
the cache back (``engine/generate.py``). :func:`pad_batch` right-pads token id lists
with the pad token (EOS for GPT-2, padding only) and gives the attention mask and explicit position ids, so
each prompt's results equal a one-prompt run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch

from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.tensors import first_tensor
from anatomy_cli.engine.tensors import rowwise

if TYPE_CHECKING:
    from transformers.cache_utils import Cache


def forward(lm: LoadedModel, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
            inputs_embeds: torch.Tensor | None = None, **kw: object) -> torch.Tensor:
    """One forward of ``lm``'s base model; returns its final hidden state ``[batch, pos, d_model]``.

    ``input_ids`` ``[batch, pos]`` (or ``inputs_embeds`` ``[batch, pos, d_model]``), ``attention_mask``
    ``[batch, pos]`` and any other keyword (``position_ids``) are passed as given; an argument left None is
    not passed. Causal models run with ``use_cache=False``. Hooks attached around the call see every module.
    """
    return first_tensor(_call(lm, input_ids, attention_mask, inputs_embeds, **kw))


def forward_cached(lm: LoadedModel, input_ids: torch.Tensor, past: Cache | None = None
                   ) -> tuple[torch.Tensor, Cache]:
    """The generation path of :func:`forward`: ``input_ids`` ``[1, new]`` after the tokens ``past`` (the key/value
    cache a previous call returned; None at the prompt) holds, with ``use_cache=True``. Returns the final hidden
    state of the new positions ``[1, new, d_model]`` and the cache to pass to the next call. Positions continue
    from the cache's length (the model's own rule). Causal models only."""
    if not lm.is_causal:
        raise ValueError(f"{lm.name} is not causal: it has no key/value cache to generate with")
    key = _cache_keyword(type(lm.model.base_model))
    out = _call(lm, input_ids, None, None, use_cache=True, **{key: past})
    return first_tensor(out), getattr(out, key)


_CACHE_KEYWORD: dict[type, str] = {}


def _cache_keyword(cls: type[torch.nn.Module]) -> str:
    """``cache`` (transformers >= 5.2x: ``past_key_values`` is deprecated there) or ``past_key_values``: what the
    model's forward and its output call the key/value cache."""
    if cls not in _CACHE_KEYWORD:
        params = inspect.signature(cls.forward).parameters
        _CACHE_KEYWORD[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KEYWORD[cls]


def _call(lm: LoadedModel, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
          inputs_embeds: torch.Tensor | None, **kw: object) -> object:
    """The one model call: the base model, with the one ``use_cache`` rule (off for causal models unless the
    caller is :func:`forward_cached`)."""
    args = {k: v for k, v in (("input_ids", input_ids), ("attention_mask", attention_mask),
                              ("inputs_embeds", inputs_embeds)) if v is not None}
    if lm.is_causal:
        kw.setdefault("use_cache", False)
    return lm.model.base_model(**args, **kw)


def head_logits(lm: LoadedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on rows of the final hidden state, ``[..., d_model] -> [..., vocab]`` on ``lm.device``,
    soft-capped as the model's own logits (Gemma 2; ``lm.cap_logits``). What the LM-head model computes, for
    the kept rows only. Needs ``lm.has_unembed``."""
    return lm.cap_logits(rowwise(lm.points["logits"][0], hidden)).to(lm.device)


def metric_logits(lm: LoadedModel, hidden: torch.Tensor,
                  metric: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``metric(head_logits(lm, hidden))`` for rows ``hidden [n, d_model]``, computing only the logit columns the
    metric reads when it names them (``metric.token_ids``, e.g. ``analyses.patch.logit_metric``) and the head is
    a plain linear layer: the other columns are left 0, and the metric must not read them. A logit difference
    needs 2 of the vocabulary's rows (SmolLM2's head is a fifth of its weights, read again by a backward)."""
    ids = getattr(metric, "token_ids", None)
    head = lm.points["logits"][0]
    if ids is None or type(head) is not torch.nn.Linear:
        return metric(head_logits(lm, hidden))
    cols = torch.tensor(list(ids), dtype=torch.long, device=head.weight.device)
    weight, bias = head.weight[cols], None if head.bias is None else head.bias[cols]
    part = lm.cap_logits(rowwise(partial(torch.nn.functional.linear, weight=weight, bias=bias), hidden))
    logits = part.new_zeros(*part.shape[:-1], head.weight.shape[0]).index_copy(-1, cols, part)
    return metric(logits.to(lm.device))


@dataclass(frozen=True)
class Batch:
    """Prompts right-padded to one width, on ``lm.device``: ``ids`` ``[batch, width]`` (the pad token after each
    prompt), ``mask`` ``[batch, width]`` (1 on real tokens), ``positions`` ``[batch, width]`` (``arange`` plus
    ``lm.position_offset``: RoBERTa's positions start after its padding index) and each prompt's length."""

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    lengths: tuple[int, ...]


def pad_batch(lm: LoadedModel, rows: Sequence[Sequence[int]]) -> Batch:
    """``rows`` (token id lists, at least one token each) as one right-padded :class:`Batch`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), lm.tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, r in enumerate(rows):
        ids[row, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[row, :len(r)] = 1
    # Given explicitly, position ids are not shifted by the model, so RoBERTa's offset is added here.
    pos = (torch.arange(width) + lm.position_offset).expand(len(rows), -1)
    return Batch(ids.to(lm.device), mask.to(lm.device), pos.to(lm.device), tuple(len(r) for r in rows))


def run_batch(lm: LoadedModel, batch: Batch, **kw: torch.Tensor | None) -> torch.Tensor:
    """:func:`forward` of a padded :class:`Batch` (its ids, mask and position ids)."""
    return forward(lm, batch.ids, batch.mask, position_ids=batch.positions, **kw)
