"""Target and foil tokens: the one place that turns ``--target TEXT`` into a token id.

Used by ``next``, ``trace``, ``lens``, ``dla``, ``ablate`` and ``patch``. No torch at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel


def token_id(lm: LoadedModel, text: str, *, option: str = "--target") -> int:
    """The id of ``text`` if it is exactly one token of ``lm``'s tokenizer.

    Raises UsageError (naming ``option``) for empty text, or for text that is not one
    token, showing how it splits: ``--target 'much' is 2 tokens for gpt2: ...``.
    """
    from anatomy_cli import engine

    if text == "":
        raise UsageError(f"{option} is empty: give the text of one token, e.g. ' much'")
    enc = engine.encode(lm, [text])[0]
    if len(enc) != 1:
        split = " + ".join(enc.pieces) or "nothing"
        raise UsageError(f"{option} {text!r} is {len(enc)} tokens for {lm.name}: {split} (ids "
                         f"{', '.join(map(str, enc.ids))}); give exactly one token, e.g. ' much' with its space")
    return enc.ids[0]
