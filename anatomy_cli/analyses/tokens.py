"""Tokenization as a table: ids, pieces, bytes and character spans. No torch.

Two tokenizers produce the same :class:`Tokenization`:

- :func:`tokenize_tiktoken` — a tiktoken encoding (``gpt2`` by default, built from the
  BPE files inside the package; others from tiktoken's cache, see :mod:`anatomy_cli.text.encodings`).
- :func:`tokenize_hf` — a Hugging Face tokenizer (``AutoTokenizer``: local
  directory or HF cache). Imports transformers, which imports torch; only called
  for ``--model``.

Character spans count Python characters (Unicode code points), end exclusive.
A token's span is the smallest range of characters that contains all of its
bytes, so the byte pieces of one character (GPT-2 splits most CJK characters and
emoji into 2-3 tokens) each report that character's span, e.g. ``(0, 1)`` twice.
This is also what Hugging Face byte-level tokenizers report as offsets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import adapters
from anatomy_cli.models.model_files import load_tokenizer
from anatomy_cli.models.resolve import in_cache
from anatomy_cli.models.resolve import resolve
from anatomy_cli.text.display import is_partial
from anatomy_cli.text.display import token_display
from anatomy_cli.text.encodings import encoding_names  # noqa: F401  (re-exported)
from anatomy_cli.text.encodings import load_encoding
from anatomy_cli.text.records import token_record
from anatomy_cli.text.tokenization import _decoder_kind
from anatomy_cli.text.tokenization import adds_bos
from anatomy_cli.text.tokenization import own_span

if TYPE_CHECKING:

    from anatomy_cli.models.resolve import Source


@dataclass(frozen=True)
class Token:
    """One token: position, id, its bytes and the characters of the input it covers."""

    index: int  # 0-based position in the sequence
    token_id: int
    piece: bytes  # the token's own bytes (for a special token: its name in UTF-8)
    start: int  # first character (code point) of the input it covers
    end: int  # one past the last character it covers
    special: bool = False  # encoded as a special token (only with allow_special)

    @property
    def partial(self) -> bool:
        """True when the piece is not whole UTF-8 characters (a byte piece of a character)."""
        return is_partial(self.piece)

    def to_dict(self) -> dict[str, Any]:
        partial = self.partial
        return {
            "index": self.index,
            **token_record(self.token_id, token_display(self.piece), None if partial else self.piece.decode("utf-8")),
            "bytes": self.piece.hex(" ") if partial else None,
            "start": self.start,
            "end": self.end,
            "special": self.special,
        }


@dataclass(frozen=True)
class Tokenization:
    """The tokens of one text and its size in characters and UTF-8 bytes."""

    tokenizer: str  # "tiktoken:gpt2" or "hf:<model>"
    text: str
    tokens: tuple[Token, ...]
    bos: bool | None = None  # a decoder's tokens start with its BOS (None: tiktoken, encoders)
    bos_source: str | None = None  # "model default", "--bos" or "--no-bos"

    @property
    def n_characters(self) -> int:
        return len(self.text)

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokenizer": self.tokenizer,
            "n_tokens": len(self.tokens),
            "n_characters": self.n_characters,
            "n_bytes": self.n_bytes,
            "bos": self.bos,
            "bos_source": self.bos_source,
            "tokens": [t.to_dict() for t in self.tokens],
        }


def byte_spans(text: str, pieces: Sequence[bytes]) -> list[tuple[int, int]]:
    """Character span ``(start, end)`` of each piece, where ``b"".join(pieces) == text.encode()``.

    Characters are counted by their UTF-8 lead bytes (every byte that is not
    ``10xxxxxx``); a piece that starts inside a character starts at that character.
    Raises ValueError if the pieces do not spell the text.
    """
    data = text.encode("utf-8")
    if b"".join(pieces) != data:
        raise ValueError("token pieces do not concatenate to the text's UTF-8 bytes")
    # leads[i] = number of characters that start in data[:i]
    leads = [0]
    for byte in data:
        leads.append(leads[-1] + (not 0x80 <= byte < 0xC0))
    spans, pos = [], 0
    for piece in pieces:
        start = leads[pos + 1] - 1 if piece else leads[pos]
        pos += len(piece)
        spans.append((start, leads[pos]))
    return spans


def _require_text(text: str) -> None:
    # Same rule as prompts everywhere in anatomy: an empty input is a usage error.
    if text == "":
        raise UsageError("empty text: give some text to tokenize (or '-' to read it from stdin)")


def tokenize_tiktoken(text: str, encoding: str = "gpt2", *, allow_special: bool = False) -> Tokenization:
    """Tokenize ``text`` with a tiktoken encoding.

    ``<|endoftext|>`` and other special-token names in the text are ordinary text
    (several tokens) unless ``allow_special``, which encodes them as their special
    ids (50256 in gpt2). Raises UsageError for empty text or an unknown encoding,
    OfflineError when the encoding's files are not cached.
    """
    _require_text(text)
    enc = load_encoding(encoding)
    if allow_special:
        ids = enc.encode(text, allowed_special="all")
    else:
        ids = enc.encode(text, disallowed_special=())
    pieces = enc.decode_tokens_bytes(ids)
    specials = {enc.encode_single_token(s) for s in enc.special_tokens_set} if allow_special else set()
    spans = byte_spans(text, pieces)
    tokens = tuple(Token(i, tid, piece, s, e, tid in specials)
                   for i, (tid, piece, (s, e)) in enumerate(zip(ids, pieces, spans)))
    return Tokenization(f"tiktoken:{encoding}", text, tokens)


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def load_hf_tokenizer(model: str):
    """The Hugging Face tokenizer of ``model``, with one-line errors.

    ``model`` is resolved by :func:`anatomy_cli.models.resolve.resolve` (``need="tokenizer"``) and loaded
    by :func:`anatomy_cli.models.model_files.load_tokenizer`, the engine's own path: a ``.gguf`` file
    (the tokenizer stored in it, through transformers' GGUF support; the header is checked first),
    a local directory, a GPT-2 preset (its BPE files ship with anatomy), or a Hub id found in the
    HF cache (downloads only when online and HF_HUB_OFFLINE is unset). Raises ModelNotFound,
    OfflineError, CheckpointError, UnsupportedArchitecture (a GGUF architecture transformers
    cannot read).
    """
    return _load_hf(model)[0]


def _load_hf(model: str) -> tuple[Any, bool, bool | None]:
    """``(tokenizer, decoder, add_bos)``: the tokenizer of ``model``, whether the model is a decoder (its
    config.json's model_type; a GGUF file, a preset or a tokenizer without a config: yes), and the BOS
    convention a GGUF file's metadata states (``tokenizer.ggml.add_bos_token``; else None: the tokenizer's)."""
    source = resolve(model, need="tokenizer")
    add_bos = None
    if source.kind == "gguf":
        from anatomy_cli.engine import load_gguf

        add_bos = load_gguf.check_header(source).fields.get("tokenizer.ggml.add_bos_token")
    return load_tokenizer(source), _is_decoder(source), add_bos


def _is_decoder(source: Source) -> bool:

    if source.kind not in ("dir", "hub"):
        return True
    path = Path(source.ref) / "config.json" if source.kind == "dir" else in_cache(source.ref)
    if path is None:  # not in the cache: as a decoder
        return True
    try:
        return adapters.for_model_type(json.loads(Path(path).read_text(encoding="utf-8"))["model_type"]).causal
    except Exception:  # no or an unreadable config.json, an unknown architecture: as a decoder
        return True


def tokenize_hf(text: str, model: str, *, allow_special: bool = False, bos: bool | None = None,
                tokenizer=None) -> Tokenization:
    """Tokenize ``text`` with a Hugging Face tokenizer: the ids the other commands run.

    A decoder's BOS as its tokenizer's convention says (``bos=None``; see
    :func:`anatomy_cli.text.tokenization.adds_bos`), or as ``bos`` says (no second one when the
    text starts with it); no EOS, [CLS]/[SEP] or other added special tokens.

    Pieces: byte-level tokenizers map token strings back to bytes (``Ġmuch`` ->
    ``b" much"``); SentencePiece tokens are their own text (``▁`` is a space, so the bare
    ``▁`` piece shows as ``·``) and byte-fallback tokens (``<0xE4>``) that byte; other
    tokens (WordPiece) are the input characters their offsets cover. Spans are the
    tokenizer's offsets, except that the space a SentencePiece tokenizer prepends itself
    covers no character (``(0, 0)``; see ``tokenization.own_span``). Special-token names in the
    text are plain text unless ``allow_special``. Raises UsageError for empty text and the errors of
    :func:`load_hf_tokenizer`.
    """

    _require_text(text)
    tok, decoder, add_bos = (tokenizer, True, None) if tokenizer is not None else _load_hf(model)
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True,
                  split_special_tokens=not allow_special)
    except NotImplementedError as exc:  # slow (Python) tokenizers have no offsets
        raise AnatomyError(f"the tokenizer of '{model}' gives no character offsets (not a fast tokenizer)") from exc
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    strings = tok.convert_ids_to_tokens(ids)
    specials = set(tok.added_tokens_decoder) if allow_special else set()
    kind = _decoder_kind(tok) if getattr(tok, "backend_tokenizer", None) is not None else "text"
    byte_decoder = None
    if kind == "byte_level":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        byte_decoder = {ch: b for b, ch in bytes_to_unicode().items()}
    tokens = []
    for i, (tid, string, (start, end)) in enumerate(zip(ids, strings, offsets)):
        special = tid in specials
        fallback = _BYTE_FALLBACK.fullmatch(string)
        if special:
            piece = string.encode("utf-8")
        elif byte_decoder is not None and all(ch in byte_decoder for ch in string):
            piece = bytes(byte_decoder[ch] for ch in string)
        elif fallback:
            piece = bytes([int(fallback.group(1), 16)])
        elif kind == "sentencepiece":
            piece = string.replace("▁", " ").encode("utf-8")
            start, end = own_span(string, text, (start, end))
        else:
            piece = text[start:end].encode("utf-8")
        tokens.append(Token(i, tid, piece, start, end, special))
    if not decoder:
        return Tokenization(f"hf:{model}", text, tuple(tokens))
    bos_id = getattr(tok, "bos_token_id", None)
    want = (adds_bos(tok) if add_bos is None else bool(add_bos)) if bos is None else bos
    applied = want and bos_id is not None
    if applied and bos_id is not None and ids[:1] != [bos_id]:
        first = Token(0, bos_id, str(tok.convert_ids_to_tokens(bos_id)).encode("utf-8"), 0, 0, True)
        tokens = [first] + [replace(t, index=t.index + 1) for t in tokens]
    source = "model default" if bos is None else "--bos" if bos else "--no-bos"
    return Tokenization(f"hf:{model}", text, tuple(tokens), bos=bool(applied), bos_source=source)
