"""Text in pictures: fonts, and tokens written as the tables write them.

``drawable`` is the one gate for text that came from the user or the model (tokens, prompts, model
names): characters no installed font can draw become ``<U+4E2D>``, ``$`` stays a dollar sign.
"""

from __future__ import annotations

import re
from functools import lru_cache

from matplotlib import font_manager
from matplotlib.ft2font import FT2Font

from anatomy_cli.text.display import shorten  # noqa: F401  (used by the picture modules from here)

BASE_FONT = "DejaVu Sans"  # ships with matplotlib: Latin, Greek, Cyrillic, arrows (· ↵ →)
# Families that carry CJK glyphs on common systems; the installed ones become fallbacks.
_CJK_FONTS = re.compile(r"CJK|Source Han|WenQuanYi|Droid Sans Fallback|Noto Sans (SC|TC|JP|KR|HK)|"
                        r"IPA(ex)?Gothic|Takao|Hiragino|PingFang|Microsoft YaHei|SimHei|Malgun|Unifont", re.IGNORECASE)
_PARTIAL_ESCAPE = re.compile(r"(<(U(\+[0-9A-F]{0,5})?)?)?$")
TOKEN_CHARS = 8  # longest token shown in full in a label; longer ones end in "…"


@lru_cache(maxsize=1)
def fonts() -> tuple[tuple[str, ...], frozenset[int]]:
    """The font family list (DejaVu Sans, then any installed CJK fonts) and the code points they cover."""
    families = [BASE_FONT]
    files: list[str] = [font_manager.findfont(BASE_FONT, fallback_to_default=True)]
    for entry in sorted(font_manager.fontManager.ttflist, key=lambda f: (f.name, f.fname)):
        if _CJK_FONTS.search(entry.name) and entry.name not in families:
            families.append(entry.name)
            files.append(entry.fname)
    covered: set[int] = set()
    for path in files:
        try:
            covered.update(FT2Font(path).get_charmap())
        except (OSError, RuntimeError, ValueError):
            continue
    return tuple(families), frozenset(covered)


def drawable(text: str) -> str:
    """``text`` with each character no installed font can draw written as ``<U+4E2D>`` (the tables' form
    for invisible characters), and control characters likewise, instead of an empty box; ``$`` is escaped
    so that matplotlib draws a dollar sign instead of reading mathtext."""
    _, covered = fonts()
    out = []
    for ch in text:
        cp = ord(ch)
        if ch == "$":
            out.append(r"\$")
        elif cp in covered and (cp >= 0x20 and not 0x7F <= cp < 0xA0):
            out.append(ch)
        else:
            out.append(f"<U+{cp:04X}>")
    return "".join(out)


def token_label(piece: str | None, limit: int = TOKEN_CHARS) -> str:
    """A token's display string, exactly as the tables show it (:func:`anatomy_cli.text.display.token_display`:
    ``·much``, ``↵``, byte pieces ``<e6 88>``), fit for a label: undrawable characters escaped, long ones cut
    with ``…``. The piece is not made visible a second time (that turned ``<e6 88>`` into ``<e6·88>``)."""
    if piece is None:
        return "–"
    text = drawable(piece)
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    partial = _PARTIAL_ESCAPE.search(cut)
    assert partial is not None  # the pattern matches the empty string at the end
    return cut[:partial.start()] + "…"  # never half an escape


