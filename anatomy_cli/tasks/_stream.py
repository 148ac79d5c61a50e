"""`generate`'s tokens as they come: the token rules record what they choose, and the status line shows the end
of the continuation so far after the token count (on a terminal; stdout, piped or not, is unchanged)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from anatomy_cli.engine import LoadedModel


def decode(lm: LoadedModel, tokens: tuple[int, ...]) -> str:
    """The continuation's text: its tokens' bytes joined, decoded as UTF-8 (a cut character: U+FFFD)."""
    return b"".join(lm.tokenizer.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


def recording(factory: Callable[[], Callable[[torch.Tensor], int]],
              chosen: list[int]) -> Callable[[], Callable[[torch.Tensor], int]]:
    """``factory`` whose token rules also append each token they choose to ``chosen`` (emptied at each new
    rule: one generation's tokens), for the status line's :func:`streamed` text."""
    def make() -> Callable[[torch.Tensor], int]:
        choose = factory()
        chosen.clear()

        def pick(logits: torch.Tensor) -> int:
            token = int(choose(logits))
            chosen.append(token)
            return token

        return pick

    return make


STREAMED = 64  # tokens of the continuation the status line decodes (the line shows what fits of their end)


def streamed(lm: LoadedModel, chosen: list[int]) -> str:
    """The end of the continuation so far, for the status line: on a terminal, `generate` streams its tokens
    there as they come, after the count (stdout, piped or not, is unchanged)."""
    return decode(lm, tuple(chosen[-STREAMED:])).lstrip("\ufffd")
