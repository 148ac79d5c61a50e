"""Tokenization as a table: ids, pieces, bytes and character spans. No torch.

Two tokenizers produce the same :class:`Tokenization`:

- :func:`tokenize_tiktoken` — a tiktoken encoding (``gpt2`` by default). Needs only
  tiktoken and its cached BPE files (``TIKTOKEN_CACHE_DIR``).
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

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from anatomy_cli import hub
from anatomy_cli.display import is_partial, token_display
from anatomy_cli.errors import AnatomyError, CheckpointError, ModelNotFound, OfflineError, UsageError


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
            "token_id": self.token_id,
            "token": token_display(self.piece),
            "text": None if partial else self.piece.decode("utf-8"),
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


def encoding_names() -> list[str]:
    """Names of the tiktoken encodings installed (``gpt2``, ``cl100k_base``, ...)."""
    import tiktoken

    return tiktoken.list_encoding_names()


def load_encoding(name: str):
    """The tiktoken ``Encoding`` called ``name``.

    Raises UsageError for an unknown name (listing the available ones) and
    OfflineError when its BPE files are neither in ``TIKTOKEN_CACHE_DIR`` nor
    downloadable.
    """
    import tiktoken

    names = encoding_names()
    if name not in names:
        raise UsageError(f"unknown tiktoken encoding '{name}'; available: {', '.join(names)}")
    if name == "gpt2":
        fast = _gpt2_as_r50k()
        if fast is not None:
            return fast
    try:
        return tiktoken.get_encoding(name)
    except OSError as exc:  # requests' ConnectionError/HTTPError are OSErrors; so are cache-dir errors
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or "unset"
        raise OfflineError(
            f"tiktoken encoding '{name}' is not cached and could not be downloaded "
            f"({type(exc).__name__}); put its files in TIKTOKEN_CACHE_DIR (now: {cache}) or go online"
        ) from exc
    except ValueError as exc:  # tiktoken's hash check on a downloaded file
        raise AnatomyError(f"tiktoken encoding '{name}' could not be loaded: {str(exc).splitlines()[0]}") from exc


_GPT2_URLS = ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
              "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json")
_R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
_R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def _gpt2_as_r50k():
    """tiktoken's gpt2 encoding, loaded as r50k_base: the same ranks, pattern and special token.

    tiktoken builds gpt2 from its data-gym files in pure Python (0.2 s, most of `anatomy
    tokens`) but reads r50k_base's .tiktoken file in 0.03 s. When only gpt2's files are
    cached, r50k_base's file is written from them once: byte for byte the published file
    (its sha256 is checked here and by tiktoken). None when neither is cached or the cache
    cannot be written; the caller then takes tiktoken's own gpt2 path.
    """
    import base64
    import hashlib
    import tempfile
    from pathlib import Path

    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    cache = Path(os.path.join(tempfile.gettempdir(), "data-gym-cache") if cache is None else cache)
    if str(cache) in ("", "."):  # an empty TIKTOKEN_CACHE_DIR switches tiktoken's cache off
        return None
    key = lambda url: cache / hashlib.sha1(url.encode()).hexdigest()  # noqa: E731  (tiktoken's cache key)
    target = key(_R50K_URL)
    try:
        if not target.is_file():
            if not all(key(url).is_file() for url in _GPT2_URLS):
                return None
            # Reads the cached files (tiktoken checks their hashes); no network.
            ranks = data_gym_to_mergeable_bpe_ranks(
                vocab_bpe_file=_GPT2_URLS[0], encoder_json_file=_GPT2_URLS[1],
                vocab_bpe_hash="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
                encoder_json_hash="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783")
            data = b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                            for token, rank in sorted(ranks.items(), key=lambda item: item[1]))
            if hashlib.sha256(data).hexdigest() != _R50K_SHA256:
                return None
            partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            partial.write_bytes(data)
            os.replace(partial, target)
        elif hashlib.sha256(target.read_bytes()).hexdigest() != _R50K_SHA256:
            return None  # tiktoken would delete it and download again
        return tiktoken.get_encoding("r50k_base")
    except (OSError, ValueError):
        return None


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
    """``AutoTokenizer.from_pretrained(model)`` with one-line errors.

    ``model`` is a local directory or a Hub id found in the HF cache (downloads
    only when online and HF_HUB_OFFLINE is unset). Raises ModelNotFound,
    OfflineError or CheckpointError.
    """
    from transformers import AutoTokenizer

    if _looks_like_path(model) and not os.path.isdir(os.path.expanduser(model)):
        raise ModelNotFound(f"no such directory: {model}")
    path = os.path.expanduser(model)
    # The cache first: an online lookup re-checks the Hub, with slow retries when it is unreachable.
    offline = hub.offline()
    local_only = (True,) if offline or os.path.isdir(path) else (True, False)
    for local in local_only:
        try:
            return AutoTokenizer.from_pretrained(path, local_files_only=local)
        except OSError as exc:
            error = exc
        except ValueError as exc:  # files present but no tokenizer can be built from them
            raise CheckpointError(f"'{model}' has no usable tokenizer files (tokenizer.json, vocab and "
                                  f"merges, or a SentencePiece model): {_first_line(exc)}") from exc
    if os.path.isdir(path):
        raise CheckpointError(f"'{model}' has no tokenizer files: {_first_line(error)}") from error
    if offline or "connect" in str(error).lower():
        raise OfflineError(f"no tokenizer for '{model}' in the Hugging Face cache and the Hub cannot be "
                           "reached (offline); pass a local directory") from error
    raise ModelNotFound(f"no tokenizer for '{model}': {_first_line(error)}") from error


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # transformers' messages often end their first line with ':' and list files after it.
    return " ".join(text.split()).rstrip(":").rstrip() if text else type(exc).__name__


def _looks_like_path(model: str) -> bool:
    # "org/name" is a Hub id; "./x", "/x", "~/x" can only be directories.
    return model.startswith((".", "/", "~"))


def _byte_level(tokenizer) -> bool:
    """True when the backend decodes with ByteLevel (GPT-2, LLaMA 3, ...): token strings encode bytes."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return '"ByteLevel"' in json.dumps(json.loads(backend.to_str()).get("decoder"))


def tokenize_hf(text: str, model: str, *, allow_special: bool = False, tokenizer=None) -> Tokenization:
    """Tokenize ``text`` with a Hugging Face tokenizer (no BOS/EOS or other added special tokens).

    Pieces: byte-level tokenizers map token strings back to bytes (``Ġmuch`` ->
    ``b" much"``); SentencePiece byte-fallback tokens (``<0xE4>``) are that byte;
    other tokens are the input characters their offsets cover. Spans are the
    tokenizer's offsets. Special-token names in the text are plain text unless
    ``allow_special``. Raises UsageError for empty text and the errors of
    :func:`load_hf_tokenizer`.
    """
    _require_text(text)
    tok = tokenizer if tokenizer is not None else load_hf_tokenizer(model)
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True,
                  split_special_tokens=not allow_special)
    except NotImplementedError as exc:  # slow (Python) tokenizers have no offsets
        raise AnatomyError(f"the tokenizer of '{model}' gives no character offsets (not a fast tokenizer)") from exc
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    strings = tok.convert_ids_to_tokens(ids)
    specials = set(tok.added_tokens_decoder) if allow_special else set()
    byte_decoder = None
    if _byte_level(tok):
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
        else:
            piece = text[start:end].encode("utf-8")
        tokens.append(Token(i, tid, piece, start, end, special))
    return Tokenization(f"hf:{model}", text, tuple(tokens))
