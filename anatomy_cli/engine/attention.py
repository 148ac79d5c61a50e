"""Attention patterns: eager attention for the one run that needs them, reduced one layer at a time.

transformers' default attention (sdpa) returns no weights. :func:`attention_patterns` switches the
model to the eager implementation for its own forward only (and back in ``finally``), hooks each
requested layer's attention module, which then returns ``(output, weights)``, and hands every
prompt's ``[n_heads, pos, pos]`` pattern to a ``reduce`` callback as soon as that layer has run.
The full ``[batch, n_heads, pos, pos]`` tensor of a layer is dropped when the layer finishes, so
no more than one layer's attention is alive beyond what the callbacks keep. ``output_attentions``
is never requested: transformers would then collect every layer's weights.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from functools import partial

import torch

from anatomy_cli.engine.forwarding import pad_batch
from anatomy_cli.engine.forwarding import run_batch
from anatomy_cli.engine.hooks import RawHookFn
from anatomy_cli.engine.hooks import attach_modules
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.model import Side
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.text.tokenization import Encoded

Reduce = Callable[[int, int, torch.Tensor], torch.Tensor]


@contextmanager
def eager_attention(lm: LoadedModel) -> Iterator[None]:
    """Run ``lm.model`` with eager attention inside the block; the previous implementation is restored on exit.

    Every (sub)model config is restored exactly, also when the block raises. Raises AnatomyError
    when the architecture cannot switch its attention implementation.
    """
    model = lm.model
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")
               and hasattr(m.config, "_attn_implementation_internal")}
    saved = {key: cfg._attn_implementation_internal for key, cfg in configs.items()}
    try:
        if model.config._attn_implementation != "eager":
            if getattr(model, "_can_set_attn_implementation", lambda: True)():
                try:
                    model.set_attn_implementation("eager")
                except (ValueError, ImportError, AttributeError) as exc:
                    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise AnatomyError(f"{lm.name} cannot switch to eager attention, which attention patterns "
                                       f"need: {why}") from None
            else:
                # Models that predate transformers' attention interface (Falcon) refuse the switch, with a
                # warning, but read the config at every forward: set it directly.
                for cfg in configs.values():
                    cfg._attn_implementation_internal = "eager"
        yield
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation_internal = saved[key]


def attention_module(lm: LoadedModel, layer: int) -> torch.nn.Module:
    """The attention module of block ``layer``: the one that returns ``(output, weights)``."""
    block: torch.nn.Module = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer]
    return block.get_submodule(lm.adapter.attn[0])


def attention_patterns(lm: LoadedModel, encoded: list[Encoded], *, layers: Sequence[int] | None = None,
                       reduce: Reduce | None = None, batch_size: int = 8) -> list[torch.Tensor]:
    """Attention weights of ``layers`` (default all) for each prompt, reduced as they are computed.

    For prompt i and layer l, ``reduce(i, l, pattern)`` gets ``pattern``: float32 ``[n_heads,
    pos, pos]``, query position × key position, real tokens only, each row a softmax summing to 1
    (causal models: exactly 0 above the diagonal; padding keys of a batch get weight 0). It
    returns any tensor of the same shape for every layer; the default keeps the whole pattern.
    Returns one tensor per prompt (input order): ``[len(layers), *reduce's shape]``, on CPU.

    Prompts run right-padded in batches of at most ``batch_size`` (:func:`batches`: similar
    lengths together) with an attention mask and explicit position ids, as in
    :func:`~anatomy_cli.engine.running`, so batched patterns equal one-prompt patterns. Raises
    UsageError for an empty prompt or a layer out of range, AnatomyError when the model's
    attention returns no weights.
    """
    layers = list(range(lm.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        if not 0 <= layer < lm.n_layers:
            raise UsageError(f"layer {layer} is out of range: {lm.name} has {lm.n_layers} layers "
                             f"(use 0..{lm.n_layers - 1})")
    for i, enc in enumerate(encoded):
        if len(enc) == 0:
            raise UsageError(f"prompt {i + 1} is empty" if len(encoded) > 1 else "empty prompt")
        if max(enc.ids) >= lm.vocab_size:
            raise AnatomyError(f"token id {max(enc.ids)} is outside {lm.name}'s vocabulary ({lm.vocab_size})")
    keep = reduce or (lambda _i, _layer, pattern: pattern)
    kept: list[dict[int, torch.Tensor]] = [{} for _ in encoded]
    chunk: list[int] = []

    def hook(output: object, layer: int) -> None:
        weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
        if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
            raise AnatomyError(f"{lm.name}'s attention (layer {layer}) returned no attention weights under eager "
                               f"attention; attention patterns are not available for this architecture")
        for row, i in enumerate(chunk):
            n = len(encoded[i])
            kept[i][layer] = keep(i, layer, weights[row, :, :n, :n].float()).detach().to("cpu", copy=True)

    lm.model.eval()
    hooks: list[tuple[torch.nn.Module, Side, RawHookFn]] = [
        (attention_module(lm, layer), "output", partial(hook, layer=layer)) for layer in layers]
    # The attention modules are no hook points: their whole output (raw), weights included, is what is read.
    with attach_modules(hooks, raw=True), eager_attention(lm), torch.inference_mode():
        for batch in batches([len(e) for e in encoded], batch_size):
            chunk[:] = batch
            run_batch(lm, pad_batch(lm, [encoded[i].ids for i in chunk]))
    return [torch.stack([kept[i][layer] for layer in layers]) for i in range(len(encoded))]


def batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Prompt indices in batches of at most ``batch_size``, longest first. A prompt that would be
    padded to more than twice its length starts a new batch: eager attention costs grow with the
    square of the padded width, so a short prompt beside a long one (``heads PROMPT`` with its
    random sequence) costs more padded than in a forward of its own."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if out and len(out[-1]) < max(1, batch_size) and 2 * lengths[i] >= lengths[out[-1][0]]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def ordinary_token_ids(lm: LoadedModel) -> list[int]:
    """Ids of the ordinary vocabulary: every id the model embeds that is not a special or added token."""
    hf = lm.tokenizer.hf
    excluded = set(lm.tokenizer.special_ids) | set(getattr(hf, "added_tokens_decoder", {}) or {})
    return [i for i in range(min(len(lm.tokenizer), lm.vocab_size)) if i not in excluded]


def encode_ids(lm: LoadedModel, ids: Sequence[int], *, text: str = "") -> Encoded:
    """An :class:`Encoded` for token ids that came from no text (e.g. random tokens).

    An encoder gets its [CLS] ... [SEP] around them (the tokenizer's cls/sep tokens), as any prompt does;
    offsets are ``(0, 0)``; ``text`` is what reports show as the prompt.
    """
    tok = lm.tokenizer
    ids = [int(i) for i in ids]
    cls, sep = getattr(tok.hf, "cls_token_id", None), getattr(tok.hf, "sep_token_id", None)
    if tok.add_special_tokens and cls is not None and sep is not None:
        ids = [cls, *ids, sep]
    special = [i in tok.special_ids for i in ids]
    return Encoded(text=text, ids=ids, offsets=[(0, 0)] * len(ids), pieces=[tok.piece(i) for i in ids],
                   special=special, token_bytes=[b"" if s else tok.token_bytes(i) for i, s in zip(ids, special)])
