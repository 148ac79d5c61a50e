"""How prompts become token ids: one frozen :class:`PromptOptions`, built once from a command's options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from anatomy_cli.errors import UsageError


@dataclass(frozen=True)
class PromptOptions:
    """``bos``: None follows the model's own convention (its tokenizer's ``add_bos_token``; GGUF:
    ``tokenizer.ggml.add_bos_token``), True prepends the tokenizer's BOS token (a text that already
    starts with it keeps one), False adds none.
    ``allow_special``: read special-token text such as ``<|endoftext|>`` as that token (else plain text).
    ``truncate``: ``"left"`` keeps the last tokens of a text longer than the context; None refuses it.
    ``chat``: wrap each text in the model's chat template first (:mod:`anatomy_cli.text.chat`)."""

    bos: bool | None = None
    allow_special: bool = False
    truncate: str | None = None
    chat: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.truncate, Enum):  # typer's choice: its value
            object.__setattr__(self, "truncate", self.truncate.value)
        if self.truncate not in (None, "left"):

            raise UsageError(f"unknown truncation '{self.truncate}'; use 'left'")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)
