"""How tokens are shown to people: visible whitespace, bytes for partial characters.

No torch here. Used by `tokens`, the engine's tokenization and every command
that prints a token.
"""

from __future__ import annotations

import unicodedata

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
