"""Documents -> token windows -> shards, streamed.

Documents are tokenized one at a time (special-token text is plain text unless ``allow_special``)
and joined into one token stream; a document read in pieces (a large text file) is tokenized as one
text (:func:`token_stream`), and each document followed by the tokenizer's EOS token when it has
one (the usual separator of packed pre-training data). The stream is cut into windows of ``ctx``
tokens; with ``bos`` each window is the BOS token followed by ``ctx - 1`` stream tokens. The last
window may be shorter (at least 2 tokens, else it is dropped). ``max_tokens`` bounds the tokens in
all windows (BOS included): the window that reaches it is cut there. Shards are ``shard_windows``
consecutive windows; shard i always holds the same windows for the same source and settings, so
shards can be skipped on resume and computed anywhere.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from anatomy_cli.text.protocol import HFTokenizer


@dataclass(frozen=True)
class Shard:
    """Shard ``index``: ``windows`` (token id lists, in order); ``first_window`` its first window's global index."""

    index: int
    first_window: int
    windows: tuple[tuple[int, ...], ...]

    @property
    def tokens(self) -> int:
        return sum(len(w) for w in self.windows)


HOLD_CHARS = 1024     # the tail of a piece whose tokens wait for the next piece (a merge may cross the seam)
CONTEXT_CHARS = 1024  # text already turned into ids, tokenized again in front of the next piece


def token_stream(pieces: Iterable[tuple[str, bool]], hf: HFTokenizer, *, allow_special: bool = False,
                 eos: int | None = None) -> Iterator[list[int]]:
    """Token ids of each document (no specials added), ``eos`` (when given) after each; a document that
    comes in pieces is tokenized as one text.

    Seams: of a piece that does not end its document, the tokens ending in its last :data:`HOLD_CHARS`
    characters are held back, and their text is tokenized again with the next piece; in front of it goes
    the :data:`CONTEXT_CHARS` of text before the cut (already ids, dropped again), so the tokenizer sees
    the middle of a text, not a start (no SentencePiece dummy prefix ``▁``). The cut and the start of the
    new ids are token boundaries (checked on the character offsets). A slow tokenizer (no offsets)
    tokenizes each piece on its own."""
    carry, left = "", ""
    for text, last in pieces:
        ids, carry, left = _seam(hf, left, carry + text, last, allow_special)
        if last and eos is not None:
            ids = [*ids, eos]
        yield ids


def _seam(hf: HFTokenizer, left: str, text: str, last: bool, allow_special: bool) -> tuple[list[int], str, str]:
    """``(ids, carry, left)``: the ids of ``text`` (read after the context ``left``) that are final, the
    text still to tokenize and its context."""
    def encode(s: str, offsets: bool) -> Mapping[str, Any]:
        return hf(s, add_special_tokens=False, split_special_tokens=not allow_special,
                  return_attention_mask=False, return_offsets_mapping=offsets)

    if not getattr(hf, "is_fast", False):
        return list(encode(text, False)["input_ids"]), "", ""
    full = left + text
    enc = encode(full, True)
    ids, spans = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    start = bisect.bisect_left([s for s, _ in spans], len(left))
    if not _clean(spans, start, len(left)):  # the context changed the tokens across the seam: the text alone
        full, left = text, ""
        enc = encode(full, True)
        ids, spans, start = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]], 0
    if last:
        return ids[start:], "", ""
    ends = [e for _, e in spans]
    end = bisect.bisect_right(ends, len(full) - HOLD_CHARS)
    while end > start and not _clean(spans, end, spans[end - 1][1]):
        end -= 1
    cut = spans[end - 1][1] if end > start else len(left)
    j = bisect.bisect_left([s for s, _ in spans], cut - CONTEXT_CHARS)
    while j < len(spans) and spans[j][0] < cut and not _clean(spans, j, spans[j][0]):
        j += 1
    context = spans[j][0] if j < len(spans) and spans[j][0] < cut else cut
    return ids[start:end], full[cut:], full[context:cut]


def _clean(spans: list[tuple[int, int]], k: int, at: int) -> bool:
    """Whether a cut at character ``at`` before token ``k`` splits no token: every token before ``k`` ends
    at or before ``at`` and token ``k`` starts at or after it."""
    return (k == 0 or spans[k - 1][1] <= at) and (k == len(spans) or spans[k][0] >= at)


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


def batches(shard: Shard, batch_size: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of consecutive windows of one length, ``batch_size`` at a time (only the corpus' last
    window is shorter)."""
    group, start = shard.windows, 0
    while start < len(group):
        end = start + 1
        while end < len(group) and end - start < batch_size and len(group[end]) == len(group[start]):
            end += 1
        yield start, end
        start = end
