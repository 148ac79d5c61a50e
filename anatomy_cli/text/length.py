"""The context-length check on tokenized prompts. No torch: it runs before the model loads."""

from __future__ import annotations

from typing import Protocol

from anatomy_cli.errors import PromptTooLong
from anatomy_cli.errors import UsageError
from anatomy_cli.text.tokenization import Encoded
from anatomy_cli.units import counted


class HasContext(Protocol):
    """What the check reads of a model: its context length (None: unlimited) and its name (messages)."""

    @property
    def n_ctx(self) -> int | None: ...

    @property
    def name(self) -> str: ...


def check_length(lm: HasContext, encoded: list[Encoded], *, truncate: str | None = None,
                 what: str = "prompt", truncate_hint: bool = True) -> list[Encoded]:
    """Check every prompt fits ``lm.n_ctx`` (``lm``: a LoadedModel, or anything with ``n_ctx`` and ``name``).

    ``truncate="left"`` keeps the last ``n_ctx`` tokens (see ``Encoded.dropped``; the caller
    says so on stderr). Raises PromptTooLong "<what> [i] is N tokens; <model> takes at most M",
    followed by a pointer to ``--truncate left`` when ``truncate_hint`` (commands without
    that option pass False).
    """
    if truncate not in (None, "left"):
        raise UsageError(f"unknown truncation '{truncate}'; use 'left'")
    limit = lm.n_ctx
    out = []
    for i, enc in enumerate(encoded):
        if limit is None or len(enc) <= limit:
            out.append(enc)
        elif truncate == "left":
            out.append(enc.keep_last(limit))
        else:
            which = f"{what} {i + 1}" if len(encoded) > 1 else what
            hint = f" (--truncate left keeps the last {limit:,})" if truncate_hint else ""
            raise PromptTooLong(f"{which} is {counted(len(enc), 'token')}; {lm.name} takes at most {limit:,}{hint}")
    return out
