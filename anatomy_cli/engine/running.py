"""Tokenize, check the context length, and run prompts in padded batches with hooks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from anatomy_cli.engine.cache import Cache
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.forwarding import pad_batch
from anatomy_cli.engine.forwarding import run_batch
from anatomy_cli.engine.hooks import capture
from anatomy_cli.engine.hooks import check_names
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.text.length import check_length as check_length  # engine.check_length
from anatomy_cli.text.tokenization import Encoded
from anatomy_cli.text.tokenization import Tokenizer

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from anatomy_cli.text.protocol import HFTokenizer


def encode(lm_or_tokenizer: LoadedModel | Tokenizer | HFTokenizer | PreTrainedTokenizerBase, texts: list[str], *,
           bos: bool | None = None, allow_special: bool = False) -> list[Encoded]:
    """Tokenize ``texts`` (see :mod:`anatomy_cli.text.tokenization`).

    Decoders get a BOS as their tokenizer's convention says (``bos=None``: Gemma, Llama and Mistral
    yes, GPT-2 and SmolLM2 no), or as ``bos=True/False`` says; encoders (BERT) keep their [CLS]/[SEP].
    Special-token text (``<|endoftext|>``) is plain text unless ``allow_special``.
    Accepts a LoadedModel, a :class:`Tokenizer` or a raw HF fast tokenizer.
    """
    tok = lm_or_tokenizer.tokenizer if isinstance(lm_or_tokenizer, LoadedModel) else lm_or_tokenizer
    if not isinstance(tok, Tokenizer):
        tok = Tokenizer(tok)
    return tok.encode([texts] if isinstance(texts, str) else list(texts), bos=bos, allow_special=allow_special)


def _positions(enc: Encoded, wanted: list[int] | None) -> list[int]:
    n = len(enc)
    if wanted is None:
        return list(range(n))
    out = []
    for p in wanted:
        q = p + n if p < 0 else p
        if not 0 <= q < n:
            raise UsageError(f"position {p} is out of range for a prompt of {n} tokens")
        out.append(q)
    return out


def run(lm: LoadedModel, encoded: list[Encoded], names: Iterable[str], *,
        positions: list[list[int]] | None = None, batch_size: int = 8) -> list[Cache]:
    """Run the prompts and keep the requested hook points; one :class:`Cache` per prompt, input order.

    Prompts are batched (``batch_size``), right-padded with the pad token (EOS for GPT-2,
    padding only), with an attention mask and explicit position ids, so each prompt's
    results equal a one-prompt run. ``positions[i]`` lists the token positions to keep for
    prompt i (negative counts from the end); default all real tokens. ``logits`` are
    computed for kept positions only. Raises UsageError for an empty prompt, a position out
    of range or an unknown name.
    """
    names = check_names(lm, names)
    want_logits = "logits" in names
    hooked = [n for n in names if n != "logits"]
    if positions is not None and len(positions) != len(encoded):
        raise UsageError(f"{len(positions)} position lists for {len(encoded)} prompts")
    kept = []
    for i, enc in enumerate(encoded):
        if len(enc) == 0:
            raise UsageError(f"prompt {i + 1} is empty" if len(encoded) > 1 else "empty prompt")
        if max(enc.ids) >= lm.vocab_size:
            raise AnatomyError(f"token id {max(enc.ids)} is outside {lm.name}'s vocabulary ({lm.vocab_size})")
        kept.append(_positions(enc, None if positions is None else positions[i]))

    lm.model.eval()
    results: dict[int, Cache] = {}
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    for start in range(0, len(order), max(1, batch_size)):
        chunk = order[start:start + max(1, batch_size)]
        batch = pad_batch(lm, [encoded[i].ids for i in chunk])
        index = None
        if positions is not None:
            k = max(1, max(len(kept[i]) for i in chunk))
            index = torch.tensor([kept[i] + [0] * (k - len(kept[i])) for i in chunk], dtype=torch.long,
                                 device=lm.device)
        logits = {}
        with torch.inference_mode(), capture(lm, hooked, positions=index) as store:
            last = run_batch(lm, batch)                                       # [batch, width, d_model]
            if want_logits:
                # The head on the kept rows only: what the LM-head model computes, without
                # a [batch, pos, vocab] tensor for every position. One call for the whole batch:
                # a call per prompt reads the [vocab, d_model] weights once per prompt (3x slower).
                rows = torch.cat([last[row, torch.tensor(kept[i], dtype=torch.long, device=last.device)]
                                  for row, i in enumerate(chunk)])
                flat = head_logits(lm, rows)                                  # Gemma 2's final soft-capping
                logits = dict(zip(chunk, torch.split(flat, [len(kept[i]) for i in chunk])))
        # Cloned outside inference mode: inference tensors cannot meet parameters that require
        # grad (e.g. F.layer_norm(h, w) in an analysis); the clone also frees the batch tensor.
        for row, i in enumerate(chunk):
            n_keep = len(kept[i]) if positions is not None else len(encoded[i])
            tensors = {name: _prompt_rows(name, store[name][row if store[name].shape[0] > 1 else 0], n_keep,
                                          len(encoded[i])).clone() for name in hooked}
            if want_logits:
                tensors["logits"] = logits[i].clone()
            results[i] = Cache(tensors, encoded=encoded[i], positions=kept[i], n_layers=lm.n_layers)
        del store, last, logits
    return [results[i] for i in range(len(encoded))]


def _prompt_rows(name: str, t: torch.Tensor, n_keep: int, n_tokens: int) -> torch.Tensor:
    """One prompt's rows of a batch row ``t``: its first ``n_keep`` positions (a pattern's ``[head, query, key]``:
    its first ``n_keep`` queries over its ``n_tokens`` keys, the padding cut)."""
    if sites.position_axis(name) == 2:
        return t[:, :n_keep, :n_tokens]
    return t[:n_keep]
