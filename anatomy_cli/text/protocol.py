"""What :class:`anatomy_cli.text.tokenization.Tokenizer` needs of the tokenizer it wraps.

Both a transformers fast tokenizer (``PreTrainedTokenizerBase`` with a Rust backend) and
:class:`anatomy_cli.text.fast.BackendTokenizer` (the ``tokenizers`` library alone, before torch) have it.
Types only: nothing here runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol
from typing import overload

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer


class HFTokenizer(Protocol):
    """A fast tokenizer: special token ids, its ``tokenizers`` backend, ids -> token strings, and a call that
    tokenizes a text (flat lists) or a list of texts (one list per text) into ``input_ids`` and, when asked,
    ``offset_mapping``."""

    @property
    def backend_tokenizer(self) -> RustTokenizer: ...

    @property
    def all_special_ids(self) -> list[int]: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    def __len__(self) -> int: ...

    @overload
    def convert_ids_to_tokens(self, ids: int) -> str | None: ...

    @overload
    def convert_ids_to_tokens(self, ids: list[int]) -> Sequence[str | None]: ...

    def __call__(self, text: str | list[str], **kwargs: Any) -> Mapping[str, Any]: ...
