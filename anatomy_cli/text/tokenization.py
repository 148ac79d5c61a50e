"""Tokenization for the engine: ids, character offsets, token bytes and display pieces.

Wraps a Hugging Face fast tokenizer. No rich, no typer, no torch at import time.

Token bytes depend on the tokenizer family (found from its decoder):

* byte-level BPE (GPT-2, Qwen2, Llama 3): the token string mapped back through the
  inverse of GPT-2's ``bytes_to_unicode``; a multi-byte character may be split into
  byte pieces (shown as ``<e4 bd>``). Concatenating all tokens' bytes gives back
  the exact input (for tokenizers without a normalizer).
* SentencePiece-style BPE (Llama 2, Mistral): ``▁`` is a space and ``<0xNN>`` a byte; the bare
  ``▁`` the tokenizer prepends itself covers no character (:func:`own_span`).
* anything else (BERT's WordPiece): the input text the token covers (WordPiece drops
  whitespace and may lower-case, so pieces show the vocabulary string, e.g. ``##ing``).

Special tokens: ``special`` is True for the tokenizer's special ids. Tokens the tokenizer
inserted itself (``[CLS]``, ``[SEP]``, a requested BOS) have offsets ``(0, 0)`` and empty
bytes; a special token written in the text (e.g. ``<|endoftext|>``) covers its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING
from typing import TypeVar
from typing import cast

from anatomy_cli.errors import AnatomyError
from anatomy_cli.text.display import joined
from anatomy_cli.text.display import token_display

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from anatomy_cli.text.protocol import HFTokenizer

_T = TypeVar("_T")


@dataclass(frozen=True)
class Encoded:
    """One tokenized prompt; all lists have one entry per token.

    ``offsets[i]`` is the character span ``text[start:end]`` of token i ((0, 0) for
    inserted special tokens; both byte pieces of one character share its span).
    ``pieces[i]`` is the display string (``·much``, ``<e4 bd>``); ``token_bytes[i]`` the
    raw bytes. ``dropped`` counts tokens cut from the left by ``check_length(truncate="left")``;
    ``text`` is then still the full input and offsets still index into it.
    ``bos``: the sequence starts with the BOS token (decoders; None for encoders, whose tokenizer adds
    its own specials); ``bos_source`` says who decided: ``model default`` (the tokenizer's own
    convention, :attr:`Tokenizer.add_bos`), ``--bos`` or ``--no-bos``.
    """

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    pieces: list[str]
    special: list[bool]
    token_bytes: list[bytes]
    dropped: int = 0
    bos: bool | None = None
    bos_source: str | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def keep_last(self, n: int) -> Encoded:
        """Keep the last ``n`` tokens (inserted specials at either end are kept too)."""
        lead = 0
        while lead < len(self) and self._inserted(lead):
            lead += 1
        trail = 0
        while trail < len(self) - lead and self._inserted(len(self) - 1 - trail):
            trail += 1
        body = n - lead - trail
        if body < 1:
            raise AnatomyError(f"cannot keep {n} tokens: {lead + trail} are special tokens")
        keep = list(range(lead)) + list(range(len(self) - trail - body, len(self)))

        def pick(xs: list[_T]) -> list[_T]:
            return [xs[i] for i in keep]

        return replace(self, ids=pick(self.ids), offsets=pick(self.offsets), pieces=pick(self.pieces),
                       special=pick(self.special), token_bytes=pick(self.token_bytes),
                       dropped=self.dropped + len(self) - len(keep))

    def _inserted(self, i: int) -> bool:
        return self.special[i] and self.offsets[i] == (0, 0) and self.token_bytes[i] == b""


def _bytes_decoder() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode`` (written out: transformers' module costs 1.5 s to import):
    printable Latin-1 bytes stand for themselves, the other 68 for ``chr(256 + n)`` in byte order."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in set(printable))})
    return table


def _decoder_kind(hf: HFTokenizer) -> str:
    """'byte_level', 'sentencepiece' or 'text', from the fast tokenizer's decoder."""
    decoder = hf.backend_tokenizer.decoder
    if decoder is None:
        return "text"
    state = json.loads(decoder.__getstate__())
    parts = state.get("decoders", [state]) if state.get("type") == "Sequence" else [state]
    types = {p.get("type") for p in parts}
    if "ByteLevel" in types:
        return "byte_level"
    if types & {"ByteFallback", "Metaspace"} or any(
            p.get("type") == "Replace" and p.get("pattern", {}).get("String") == "▁" for p in parts):
        return "sentencepiece"
    return "text"


def own_span(token: str | None, text: str, span: tuple[int, int]) -> tuple[int, int]:
    """A SentencePiece token's own character span: ``span`` (the tokenizer's offsets), except for
    a bare ``▁`` whose offsets cover a character that is not a space.

    That ``▁`` is the space the tokenizer prepends itself (Llama 2, Mistral), which HF maps onto
    the next character, e.g. the emoji a byte-fallback run spells; it covers no character of
    ``text``: ``(start, start)``.
    """
    start, end = span
    if token == "▁" and end > start and not text[start:end].isspace():
        return (start, start)
    return span


def adds_bos(hf: HFTokenizer) -> bool:
    """True when the tokenizer's own convention is to prepend its BOS token.

    Its ``add_bos_token`` (from tokenizer_config.json, or ``tokenizer.ggml.add_bos_token`` when
    transformers built it from a GGUF file), or its post-processor putting the BOS first when asked
    for its special tokens (Llama 3's template has no ``add_bos_token``). GPT-2 and SmolLM2: False;
    Llama 2/3, Mistral, Gemma: True.
    """
    bos_id = getattr(hf, "bos_token_id", None)
    if bos_id is None:
        return False
    if getattr(hf, "add_bos_token", None) is True:
        return True
    try:
        ids = hf("a", add_special_tokens=True)["input_ids"]
    except Exception:  # a tokenizer that cannot say: no BOS, as before
        return False
    return list(ids[:1]) == [bos_id]


class Tokenizer:
    """A fast Hugging Face tokenizer plus the rules above.

    ``add_special_tokens``: keep the tokenizer's own specials ([CLS]/[SEP] for encoders,
    which were trained with them). Decoders get no special token but the BOS, and that one as the
    model's own convention says (:attr:`add_bos`) unless ``encode(bos=...)`` overrides it.
    ``add_bos``: that convention when the caller knows it (a GGUF file's ``tokenizer.ggml.add_bos_token``);
    None: read it from the tokenizer (:func:`adds_bos`).
    """

    def __init__(self, hf: HFTokenizer | PreTrainedTokenizerBase, *, add_special_tokens: bool = False,
                 add_bos: bool | None = None):
        if not getattr(hf, "is_fast", False):
            raise AnatomyError(f"{type(hf).__name__} is not a fast tokenizer; character offsets need one")
        # A fast tokenizer (the check above) has a Rust backend: what HFTokenizer describes.
        self.hf = cast("HFTokenizer", hf)
        self.add_special_tokens = add_special_tokens
        self.kind = _decoder_kind(self.hf)
        self.special_ids = frozenset(self.hf.all_special_ids)
        self._add_bos = add_bos

    @cached_property
    def add_bos(self) -> bool:
        """The model's own BOS convention for decoders (False for encoders and without a BOS token)."""
        if self.add_special_tokens or self.bos_id is None:
            return False
        return bool(self._add_bos) if self._add_bos is not None else adds_bos(self.hf)

    @cached_property
    def _byte_map(self) -> dict[str, int]:
        return _bytes_decoder()

    def __len__(self) -> int:
        return len(self.hf)

    @property
    def bos_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def pad_id(self) -> int:
        """The pad id for batches: the pad token, else EOS (only ever as padding), else 0."""
        for tid in (self.hf.pad_token_id, self.hf.eos_token_id):
            if tid is not None:
                return tid
        return 0

    def known(self, token_id: int) -> bool:
        """False for an id the tokenizer has no token for: a padded LM head has more rows than the
        tokenizer has tokens (Pythia: 50,304 rows, 50,277 tokens), and the model still scores those rows."""
        return self.hf.convert_ids_to_tokens(int(token_id)) is not None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (specials: their literal string; an id past the
        tokenizer, see :meth:`known`: none)."""
        token = self.hf.convert_ids_to_tokens(int(token_id))
        if token is None:
            return b""
        if token_id in self.special_ids:
            return token.encode("utf-8")
        if self.kind == "byte_level":
            try:
                return bytes(self._byte_map[ch] for ch in token)
            except KeyError:  # an added token stored as plain text
                return token.encode("utf-8")
        if self.kind == "sentencepiece":
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                return bytes([int(token[3:5], 16)])
            return token.replace("▁", " ").encode("utf-8")
        return token.encode("utf-8")

    def text_bytes(self) -> list[int]:
        """Per token id ``0 .. len(self) - 1``, how many UTF-8 bytes of text it covers: :meth:`token_bytes`'
        length, 0 for a special token (BOS, EOS: separators, no text) and an id without a token."""
        out = []
        for token_id in range(len(self)):
            out.append(0 if token_id in self.special_ids else len(self.token_bytes(token_id)))
        return out

    def line(self, token_ids: Sequence[int], at: int | None = None) -> str:
        """The text ``token_ids`` make, token ``at`` in brackets (:func:`anatomy_cli.text.display.joined`: a
        character split over tokens shown whole, bytes that make none as :meth:`piece` shows them); a special token
        or an unknown id as :meth:`piece` names it."""
        return joined([self.piece(t) if t in self.special_ids or not self.known(t) else self.token_bytes(t)
                       for t in token_ids], at)

    def piece(self, token_id: int) -> str:
        """Display string of one token id: ``·much``, ``<e4 bd>``, ``<|endoftext|>``, ``##ing``; an id the
        tokenizer has no token for (a padded LM head's extra rows): ``<unused id 50290>``."""
        if not self.known(token_id):
            return f"<unused id {int(token_id)}>"
        if token_id in self.special_ids:
            return self.hf.convert_ids_to_tokens(int(token_id)) or ""  # known: never None
        return token_display(self.token_bytes(token_id))

    def encode(self, texts: list[str], *, bos: bool | None = None, allow_special: bool = False) -> list[Encoded]:
        """Tokenize each text; see the module docstring for bytes, pieces and specials.

        Special-token text in the input (``<|endoftext|>``, ``<s>``) is plain text, split like
        any other text, unless ``allow_special``: then it becomes the special id (one rule for
        every command, as tiktoken's ``disallowed_special=()``). ``bos``: None follows the
        model's convention (:attr:`add_bos`), True prepends the BOS token, False does not
        (decoders; no-op when the tokenizer already adds its specials or has no BOS, and no
        second one when the text already starts with the BOS token: see :func:`starts_with_bos`).
        Returns one :class:`Encoded` per text (``bos``, ``bos_source`` say what applied).
        """
        want = self.add_bos if bos is None else bos
        decoder = not self.add_special_tokens
        applied = bool(want) and decoder and self.bos_id is not None
        source = None if not decoder else "model default" if bos is None else "--bos" if bos else "--no-bos"
        batch = self.hf(list(texts), add_special_tokens=self.add_special_tokens,
                        return_offsets_mapping=True, return_attention_mask=False,
                        return_token_type_ids=False, split_special_tokens=not allow_special)
        out = []
        for text, ids, offsets in zip(texts, batch["input_ids"], batch["offset_mapping"]):
            ids, offsets = list(ids), [tuple(o) for o in offsets]
            if self.kind == "sentencepiece":
                offsets = [own_span(t, text, o) for t, o in zip(self.hf.convert_ids_to_tokens(ids), offsets)]
            if applied and ids[:1] != [self.bos_id]:
                ids, offsets = [self.bos_id] + ids, [(0, 0)] + offsets
            special = [i in self.special_ids for i in ids]
            raw, pieces = [], []
            for tid, (start, end), is_special in zip(ids, offsets, special):
                if is_special:
                    raw.append(text[start:end].encode("utf-8"))
                    pieces.append(self.hf.convert_ids_to_tokens(tid))
                elif self.kind == "text":
                    raw.append(text[start:end].encode("utf-8"))
                    pieces.append(token_display(self.hf.convert_ids_to_tokens(tid).encode("utf-8")))
                else:
                    raw.append(self.token_bytes(tid))
                    pieces.append(token_display(raw[-1]))
            out.append(Encoded(text=text, ids=ids, offsets=offsets, pieces=pieces, special=special,
                               token_bytes=raw, bos=applied if decoder else None, bos_source=source))
        return out


def starts_with_bos(enc: Encoded, bos_id: int | None) -> bool:
    """True when the prompt's TEXT begins with the BOS token (written in it, ``--allow-special``).

    ``encode(bos=True)`` then adds no second one; the command says so on stderr.
    """
    return bos_id is not None and enc.ids[:1] == [bos_id] and enc.offsets[0] != (0, 0)
