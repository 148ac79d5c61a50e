"""`--position`: the one check and the one message for a position outside a prompt. No torch here."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Sized

from anatomy_cli.errors import UsageError
from anatomy_cli.units import counted


def check_position(position: int | None, encoded: Sequence[Sized], option: str = "--position") -> None:
    """Raise UsageError when ``position`` (0-based, or negative from the end) is outside any of the prompts
    ``encoded`` (anything with a length: :class:`~anatomy_cli.text.tokenization.Encoded`); None passes.

    ``--position 5 is out of range: the prompt has 3 tokens (use 0..2, or -3..-1 from the end)``; with several
    prompts the first one too short is named (``prompt 2``).
    """
    if position is None:
        return
    for i, enc in enumerate(encoded, start=1):
        n = len(enc)
        if not -n <= position < n:
            which = f"prompt {i}" if len(encoded) > 1 else "the prompt"
            raise UsageError(f"{option} {position} is out of range: {which} has {counted(n, 'token')} "
                             f"(use 0..{n - 1}, or -{n}..-1 from the end)")
