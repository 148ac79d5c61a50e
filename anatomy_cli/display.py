"""How tokens are shown to people: visible whitespace, bytes for partial characters.

No torch here. Used by `tokens`, the engine's tokenization and every command
that prints a token.
"""

from __future__ import annotations

_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "\\r"}


def visible(text: str) -> str:
    """``" much"`` -> ``"·much"``; newline -> ``↵``, tab -> ``→``; other characters unchanged."""
    return "".join(_VISIBLE.get(ch, ch) for ch in text)


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
