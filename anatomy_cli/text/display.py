"""How tokens are shown to people: visible whitespace, bytes for partial characters.

No torch here. Used by `tokens`, the engine's tokenization and every command
that prints a token.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "\\r"}
# Characters that print as nothing or as a blank: controls (Cc), format characters such as the
# zero-width joiner U+200D (Cf), spaces other than " " (Zs, Zl, Zp), and variation selectors
# (U+FE0E/U+FE0F pick text or emoji style; they are combining marks, Mn).
_INVISIBLE_CATEGORIES = ("Cc", "Cf", "Zs", "Zl", "Zp")


def _invisible(ch: str) -> bool:
    code = ord(ch)
    return (unicodedata.category(ch) in _INVISIBLE_CATEGORIES or 0xFE00 <= code <= 0xFE0F
            or 0xE0100 <= code <= 0xE01EF or code == 0x180E)


def visible(text: str) -> str:
    """``" much"`` -> ``"·much"``; newline -> ``↵``, tab -> ``→``; a character that would print
    as nothing (U+FE0F, the zero-width joiner, a no-break space) -> ``<U+FE0F>``; others unchanged."""
    return "".join(_VISIBLE.get(ch) or (f"<U+{ord(ch):04X}>" if _invisible(ch) else ch) for ch in text)


def token_display(piece: bytes) -> str:
    """Display string for one token's bytes.

    Whole UTF-8 text is shown with visible whitespace; a piece that is not valid
    UTF-8 on its own (part of a multi-byte character) is shown as hex bytes,
    e.g. ``<e4 bd>``.
    """
    try:
        return visible(piece.decode("utf-8"))
    except UnicodeDecodeError:
        return "<" + " ".join(f"{b:02x}" for b in piece) + ">"


def _char_length(lead: int) -> int:
    """The bytes of a UTF-8 character starting with ``lead`` (1-4), 0 for a byte no character starts with."""
    return 1 if lead < 0x80 else 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else \
        4 if 0xF0 <= lead <= 0xF4 else 0


def _units(data: bytes, owner: list[int]) -> list[tuple[str | bytes, set[int]]]:
    """``data`` as whole characters (str) and the bytes between them that make none (bytes, one run per token),
    each with the tokens (``owner[i]``: byte i's) it holds bytes of."""
    units: list[tuple[str | bytes, set[int]]] = []
    i = 0
    while i < len(data):
        n = _char_length(data[i])
        try:
            char = data[i:i + n].decode("utf-8") if n and i + n <= len(data) else None
        except UnicodeDecodeError:
            char = None
        if char is not None:
            units.append((char, set(owner[i:i + n])))
            i += n
            continue
        last = units[-1] if units else None
        if last is not None and isinstance(last[0], bytes) and last[1] == {owner[i]}:
            units[-1] = (last[0] + data[i:i + 1], last[1])
        else:
            units.append((data[i:i + 1], {owner[i]}))
        i += 1
    return units


def joined(pieces: Sequence[bytes | str], at: int | None = None) -> str:
    """Tokens as the text they make, for a context line: their bytes joined, so a character split over several
    tokens (byte-level BPE's pieces of ``語``, an emoji) shows once, whole; bytes that make no character within
    ``pieces`` (a window's edge cutting one) as :func:`token_display` shows them (``<e8 aa>``); a ``str`` piece (a
    special token, an unknown id) as it is. Token ``at`` in brackets, widened to the whole character where it holds
    part of one (``本[語]の``)."""
    out: list[str] = []
    opened = closed = False
    run: list[tuple[bytes, int]] = []

    def flush() -> None:
        nonlocal opened, closed
        data = b"".join(b for b, _ in run)
        owner = [t for b, t in run for _ in b]
        for unit, tokens in _units(data, owner):
            text = unit if isinstance(unit, str) else token_display(unit)
            if at in tokens and not opened:
                out.append("[")
                opened = True
            elif opened and not closed and at not in tokens:
                out.append("]")
                closed = True
            out.append(text)
        run.clear()

    for i, piece in enumerate(pieces):
        if isinstance(piece, bytes) and (piece or i != at):
            run.append((piece, i))
            continue
        flush()
        piece = piece if isinstance(piece, str) else ""  # the marked token holds no byte: its brackets alone
        if i == at:
            out.append(f"[{piece}]")
            opened = closed = True
            continue
        if opened and not closed:
            out.append("]")
            closed = True
        out.append(piece)
    flush()
    if opened and not closed:
        out.append("]")
    return "".join(out)


def is_partial(piece: bytes) -> bool:
    """True when ``piece`` is not valid UTF-8 by itself (a byte piece of a character)."""
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def shorten(text: str, width: int = 60) -> str:
    """One line of at most ``width`` characters, cut in the middle (the same rule as the table headings);
    newlines and tabs shown as ``↵`` and ``→``."""
    text = text.replace("\n", "↵").replace("\t", "→").replace("\r", "\\r")
    if len(text) <= width:
        return text
    return text[:width // 2 - 1] + " … " + text[-(width // 2 - 2):]
