"""Finding a word in a prompt: its whole-word character spans, and the tokens that cover one.

Whole word: a match must not continue a word on either side ("bank" is not in "banks"), except in scripts
written without spaces between words (Chinese, Japanese kana, Thai, ...), where a word's characters match
wherever they occur. A word's tokens are every non-special token whose character span overlaps it. Pure
functions of the text and the tokens' offsets; no torch.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

# Scripts written without spaces between words: there a word has no boundary to match, so its
# characters are matched wherever they occur (unicodedata names start with these).
_UNSPACED = ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA", "KATAKANA", "HALFWIDTH KATAKANA",
             "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN")


def unspaced(ch: str) -> bool:
    """True for a character of a script written without spaces between words (Chinese, Japanese kana, Thai, ...)."""
    return unicodedata.name(ch, "").startswith(_UNSPACED)


def matched_as_characters(word: str) -> bool:
    """True when ``word`` begins or ends in such a script: it is matched as characters, not as a whole word."""
    return bool(word) and (unspaced(word[0]) or unspaced(word[-1]))


def has_case(word: str) -> bool:
    """True when some character of ``word`` has an upper and a lower case (``--ignore-case`` can matter)."""
    return word.lower() != word.upper()


def word_spans(text: str, word: str, *, ignore_case: bool = False) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every whole-word occurrence of ``word`` in ``text``.

    Whole word: when the word begins (ends) with a letter, digit or underscore, the
    character before (after) the match must not be one, so "bank" is not found in
    "banks" or "embankment" but is found in "bank's" and "(bank)". Scripts written
    without spaces (Chinese, Japanese, Thai: :func:`unspaced`) have no such boundary:
    there the characters match wherever they are ("银行" in "我去银行取钱。"), and a
    neighbour from such a script is no boundary for a spaced word either. Case-sensitive
    unless ``ignore_case``. Occurrences do not overlap. Raises UsageError for an empty or
    blank word.
    """
    if not word.strip():
        raise UsageError("empty word: give the word to follow, e.g. 'anatomy drift bank'")
    flags = re.IGNORECASE if ignore_case else 0
    spans: list[tuple[int, int]] = []
    for m in re.finditer(f"(?=({re.escape(word)}))", text, flags):
        start, end = m.span(1)
        if spans and start < spans[-1][1]:
            continue
        if _joined(text[start - 1:start], text[start]) or _joined(text[end - 1], text[end:end + 1]):
            continue
        spans.append((start, end))
    return spans


def _joined(left: str, right: str) -> bool:
    """True when ``left`` and ``right`` (one character each, or empty at the text's ends) belong to one word."""
    if not left or not right:
        return False
    word_chars = re.match(r"\w", left) and re.match(r"\w", right)
    return bool(word_chars) and not (unspaced(left) or unspaced(right))


def tokens_in_span(offsets: Sequence[tuple[int, int]], span: tuple[int, int],
                   special: Sequence[bool] | None = None) -> list[int]:
    """Indices of the tokens whose character span overlaps ``span`` (half-open).

    Special tokens and zero-width offsets (``(0, 0)`` for ``[CLS]`` and the like)
    never count. Returns a sorted list, possibly empty.
    """
    start, end = span
    return [i for i, (s, e) in enumerate(offsets)
            if e > s and s < end and e > start and not (special is not None and special[i])]


def _shown_tokens(pieces: Sequence[str], limit: int = 40) -> str:
    shown = "|".join(pieces[:limit])
    return shown + ("|…" if len(pieces) > limit else "")



def find_word(text: str, word: str, offsets: Sequence[tuple[int, int]], *,
              special: Sequence[bool] | None = None, pieces: Sequence[str] = (), occurrence: int = 1,
              ignore_case: bool = False, where: str = "the prompt") -> tuple[tuple[int, int], list[int]]:
    """Occurrence ``occurrence`` (1-based) of ``word`` in a tokenized ``text``: its character span
    ``[start, end)`` and the positions of the tokens that cover it (:func:`tokens_in_span`).

    ``offsets``, ``special`` and ``pieces`` are per token, as the engine's ``encode`` returns them;
    ``where`` names the text in messages (``context 2``). Raises UsageError (exit 2) when the word is absent
    (the message shows how the text tokenized) or occurs fewer than ``occurrence`` times; AnatomyError when
    the word is present but no token covers it (e.g. cut off by truncation).
    """
    if occurrence < 1:
        raise UsageError(f"--occurrence must be 1 or more, got {occurrence}")
    spans = word_spans(text, word, ignore_case=ignore_case)
    if not spans:
        hint = "" if ignore_case or not has_case(word) else " (matching is case-sensitive; try --ignore-case)"
        how = "" if matched_as_characters(word) else " as a whole word"
        raise UsageError(f"{word!r} does not occur{how} in {where} {text!r}{hint}; "
                         f"it tokenized as: {_shown_tokens(pieces)}")
    if occurrence > len(spans):
        times = "once" if len(spans) == 1 else f"{len(spans)} times"
        raise UsageError(f"{word!r} occurs only {times} in {where} {text!r}; "
                         f"--occurrence {occurrence} needs at least {occurrence}")
    span = spans[occurrence - 1]
    positions = tokens_in_span(offsets, span, special)
    if not positions:
        raise AnatomyError(f"{word!r} occurs in {where} at characters {span[0]}-{span[1]} "
                           f"but no token covers it; it tokenized as: {_shown_tokens(pieces)}")
    return span, positions
