"""Documents -> token windows -> shards, streamed.

Documents are tokenized one at a time (special-token text is plain text unless ``allow_special``)
and joined into one token stream, each document followed by the tokenizer's EOS token when it has
one (the usual separator of packed pre-training data). The stream is cut into windows of ``ctx``
tokens; with ``bos`` each window is the BOS token followed by ``ctx - 1`` stream tokens. The last
window may be shorter (at least 2 tokens, else it is dropped). ``max_tokens`` bounds the tokens in
all windows (BOS included): the window that reaches it is cut there. Shards are ``shard_windows``
consecutive windows; shard i always holds the same windows for the same source and settings, so
shards can be skipped on resume and computed anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shard:
    """Shard ``index``: ``windows`` (token id lists, in order); ``first_window`` its first window's global index."""

    index: int
    first_window: int
    windows: tuple[tuple[int, ...], ...]

    @property
    def tokens(self) -> int:
        return sum(len(w) for w in self.windows)


def token_stream(pieces: Iterable[tuple[str, bool]], hf: Any, *, allow_special: bool = False,
                 eos: int | None = None) -> Iterator[list[int]]:
    """Token ids of each piece of text (no specials added); ``eos`` (when given) after a piece that ends a document."""
    for text, last in pieces:
        ids = hf(text, add_special_tokens=False, split_special_tokens=not allow_special,
                 return_attention_mask=False)["input_ids"]
        if last and eos is not None:
            ids = [*ids, eos]
        yield list(ids)


def windows(stream: Iterable[list[int]], *, ctx: int, bos: int | None = None,
            max_tokens: int | None = None) -> Iterator[tuple[int, ...]]:
    """Windows of ``ctx`` token ids (see the module docstring); ``bos``: the id that starts each window, or None."""
    head = (bos,) if bos is not None else ()
    body = ctx - len(head)
    budget = max_tokens if max_tokens is not None else 1 << 62
    buf: list[int] = []
    for ids in stream:
        buf.extend(ids)
        start = 0
        while len(buf) - start >= body:
            take = min(body, budget - len(head))
            if take < 1 or len(head) + take < 2:
                return
            window = (*head, *buf[start:start + take])
            start += body
            budget -= len(window)
            yield window
            if take < body:
                return
        del buf[:start]
    take = min(len(buf), budget - len(head))
    if take >= 1 and len(head) + take >= 2:
        yield (*head, *buf[:take])


def shards(windows_iter: Iterable[tuple[int, ...]], shard_windows: int) -> Iterator[Shard]:
    """Consecutive groups of ``shard_windows`` windows."""
    group: list[tuple[int, ...]] = []
    index = first = 0
    for n, window in enumerate(windows_iter):
        if not group:
            first = n
        group.append(window)
        if len(group) == shard_windows:
            yield Shard(index, first, tuple(group))
            index, group = index + 1, []
    if group:
        yield Shard(index, first, tuple(group))
