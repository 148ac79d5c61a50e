"""A `tokenizers` library tokenizer dressed as the part of a transformers fast tokenizer that
:class:`anatomy_cli.text.tokenization.Tokenizer` uses, so prompts can be tokenized before torch is imported.

transformers' tokenizer classes import torch (through ``transformers.configuration_utils``); the
``tokenizers`` library does not. :class:`BackendTokenizer` runs the same Rust tokenizer from the same
``tokenizer.json`` (no truncation, no padding, special-token text split unless allowed), so ids and
offsets are those of the transformers tokenizer; its special tokens are the named ones of
``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...), as transformers' ``all_special_ids``.
``tests/test_preflight.py`` compares the two on several tokenizers. No torch, no transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import overload

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class BackendTokenizer:
    """``backend``: a ``tokenizers.Tokenizer``; ``special``: tokenizer_config.json's entries (``bos_token``
    ..., ``additional_special_tokens`` / ``extra_special_tokens``)."""

    is_fast = True

    def __init__(self, backend: Tokenizer, special: dict[str, Any]):
        backend.no_truncation()
        backend.no_padding()
        self.backend_tokenizer = backend
        self._tokens = {key: _content(special.get(key)) for key in SPECIAL_KEYS}
        extra = special.get("additional_special_tokens") or special.get("extra_special_tokens") or []
        named = [t for t in self._tokens.values() if t is not None]
        extra = [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        ids = [backend.token_to_id(t) for t in [*named, *extra] if t is not None]
        self.all_special_ids = list(dict.fromkeys(i for i in ids if i is not None))

    def _id(self, key: str) -> int | None:
        token = self._tokens[key]
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad_token")

    @property
    def vocab_size(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @overload
    def convert_ids_to_tokens(self, ids: int) -> str | None: ...

    @overload
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]: ...

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | None | list[str | None]:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def __call__(self, text: str | list[str], *, add_special_tokens: bool = False, split_special_tokens: bool = True,
                 **_: object) -> dict[str, list[Any]]:
        """``{"input_ids": [[id, ...], ...], "offset_mapping": [[(start, end), ...], ...]}`` per text; for one
        text (a ``str``) the two lists of that text, as transformers answers."""
        backend = self.backend_tokenizer
        backend.encode_special_tokens = split_special_tokens
        found = backend.encode_batch([text] if isinstance(text, str) else list(text),
                                     add_special_tokens=add_special_tokens)
        if isinstance(text, str):
            return {"input_ids": found[0].ids, "offset_mapping": found[0].offsets}
        return {"input_ids": [e.ids for e in found], "offset_mapping": [e.offsets for e in found]}
