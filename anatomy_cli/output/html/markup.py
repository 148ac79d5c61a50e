"""What every HTML picture is built of: escaped text (:func:`esc`, :func:`token`), JSON for scripts
(:func:`script_json`), a safe piece of a page (:class:`Part`). Re-exported by :mod:`anatomy_cli.output.html`;
a module of its own so that the page renderer (``_page``) and the package need not import each other."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

UNTRAINED = "untrained (random weights)"


def esc(text: object) -> str:
    """``text`` as HTML text (``<`` ``>`` ``&`` escaped): safe in the page and in plotly labels and hover text.
    Quotes stay as they are (plotly shows ``&quot;`` literally); never put the result in an attribute."""
    return html.escape(str(text), quote=False)


def token(piece: str | None, limit: int | None = None) -> str:
    """A token's display piece exactly as the tables show it (``·much``, ``<e6 88>``, ``↵``: made visible once, by
    :func:`anatomy_cli.text.display.token_display`, when the tokenizer built it), cut to ``limit`` characters,
    escaped. The piece is not made visible a second time (that turned ``<e6 88>`` into ``<e6·88>``)."""
    if piece is None:
        return "–"
    text = piece
    if limit is not None and len(text) > limit:
        text = text[:limit - 1] + "…"
    return esc(text)


def script_json(value: object) -> str:
    """JSON for inside a ``<script>``: ``<``, ``>`` and ``&`` as ``\\u003c`` ..., so no user text ends the script."""
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


@dataclass(frozen=True)
class Part:
    """A piece of a page: ``html`` is already safe (built with :func:`esc`)."""

    html: str
