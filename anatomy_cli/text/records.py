"""A token in JSON: the one record every command writes for a token (a target, a foil, a top-k entry, a cell's
top token). No torch here.

``{"token_id": 881, "token": "·much", "text": " much"}``: ``token`` is the display piece (visible whitespace,
``<e6 88>`` for a piece that is part of a character: :func:`anatomy_cli.text.display.token_display`), ``text``
the decoded string, null when the token's bytes are not whole UTF-8 characters or the id has no token.
Other keys of an entry (``rank``, ``probability``, ``position``) go before or after these three.
"""

from __future__ import annotations


def token_record(token_id: int, token: str, text: str | None) -> dict[str, object]:
    """``{"token_id": int, "token": display piece, "text": decoded text or None}``."""
    return {"token_id": int(token_id), "token": token, "text": text}
