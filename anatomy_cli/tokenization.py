"""Tokenization for the engine: ids, character offsets, token bytes and display pieces.

Wraps a Hugging Face fast tokenizer. No rich, no typer, no torch at import time.

Token bytes depend on the tokenizer family (found from its decoder):

* byte-level BPE (GPT-2, Qwen2, Llama 3): the token string mapped back through the
  inverse of GPT-2's ``bytes_to_unicode``; a multi-byte character may be split into
  byte pieces (shown as ``<e4 bd>``). Concatenating all tokens' bytes gives back
  the exact input (for tokenizers without a normalizer).
* SentencePiece-style BPE (Llama 2, Mistral): ``▁`` is a space and ``<0xNN>`` a byte.
* anything else (BERT's WordPiece): the input text the token covers (WordPiece drops
  whitespace and may lower-case, so pieces show the vocabulary string, e.g. ``##ing``).

Special tokens: ``special`` is True for the tokenizer's special ids. Tokens the tokenizer
inserted itself (``[CLS]``, ``[SEP]``, a requested BOS) have offsets ``(0, 0)`` and empty
bytes; a special token written in the text (e.g. ``<|endoftext|>``) covers its text.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from anatomy_cli.display import token_display
from anatomy_cli.errors import AnatomyError


@dataclass(frozen=True)
class Encoded:
    """One tokenized prompt; all lists have one entry per token.

    ``offsets[i]`` is the character span ``text[start:end]`` of token i ((0, 0) for
    inserted special tokens; both byte pieces of one character share its span).
    ``pieces[i]`` is the display string (``·much``, ``<e4 bd>``); ``token_bytes[i]`` the
    raw bytes. ``dropped`` counts tokens cut from the left by ``check_length(truncate="left")``;
    ``text`` is then still the full input and offsets still index into it.
    """

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    pieces: list[str]
    special: list[bool]
    token_bytes: list[bytes]
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    def keep_last(self, n: int) -> "Encoded":
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
        pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
        return replace(self, ids=pick(self.ids), offsets=pick(self.offsets), pieces=pick(self.pieces),
                       special=pick(self.special), token_bytes=pick(self.token_bytes),
                       dropped=self.dropped + len(self) - len(keep))

    def _inserted(self, i: int) -> bool:
        return self.special[i] and self.offsets[i] == (0, 0) and self.token_bytes[i] == b""


def _bytes_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}


def _decoder_kind(hf: Any) -> str:
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


class Tokenizer:
    """A fast Hugging Face tokenizer plus the rules above.

    ``add_special_tokens``: keep the tokenizer's own specials ([CLS]/[SEP] for encoders,
    which were trained with them); decoders get none (no BOS unless asked).
    """

    def __init__(self, hf: Any, *, add_special_tokens: bool = False):
        if not getattr(hf, "is_fast", False):
            raise AnatomyError(f"{type(hf).__name__} is not a fast tokenizer; character offsets need one")
        self.hf = hf
        self.add_special_tokens = add_special_tokens
        self.kind = _decoder_kind(hf)
        self.special_ids = frozenset(hf.all_special_ids)

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

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (specials: their literal string)."""
        token = self.hf.convert_ids_to_tokens(int(token_id))
        if token is None:
            raise AnatomyError(f"token id {token_id} is outside the vocabulary ({len(self)} tokens)")
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

    def piece(self, token_id: int) -> str:
        """Display string of one token id: ``·much``, ``<e4 bd>``, ``<|endoftext|>``, ``##ing``."""
        if token_id in self.special_ids:
            return self.hf.convert_ids_to_tokens(int(token_id))
        return token_display(self.token_bytes(token_id))

    def encode(self, texts: list[str], *, bos: bool = False) -> list[Encoded]:
        """Tokenize each text; see the module docstring for bytes, pieces and specials.

        ``bos=True`` prepends the BOS token (decoders; no-op when the tokenizer already adds
        its specials or has no BOS). Returns one :class:`Encoded` per text.
        """
        batch = self.hf(list(texts), add_special_tokens=self.add_special_tokens,
                        return_offsets_mapping=True, return_attention_mask=False,
                        return_token_type_ids=False)
        out = []
        for text, ids, offsets in zip(texts, batch["input_ids"], batch["offset_mapping"]):
            ids, offsets = list(ids), [tuple(o) for o in offsets]
            if bos and not self.add_special_tokens and self.bos_id is not None:
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
                               token_bytes=raw))
        return out


# tiktoken's gpt2 encoding is these two files (data-gym format), cached under sha1(url).
_TIKTOKEN_GPT2 = {
    "vocab.bpe": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
                  "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    "encoder.json": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
                     "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
}
GPT2_HUB_IDS = ("openai-community/gpt2", "gpt2")


def _tiktoken_gpt2_files() -> dict[str, Path] | None:
    """The cached gpt2 files if tiktoken's cache holds both (never downloads)."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), "data-gym-cache")
    found = {}
    for name, (url, sha256) in _TIKTOKEN_GPT2.items():
        path = Path(cache) / hashlib.sha1(url.encode()).hexdigest()
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
            return None
        found[name] = path
    return found


def hf_cached_tokenizer(repo_ids: tuple[str, ...]) -> Any | None:
    """An AutoTokenizer for the first repo whose tokenizer is in the local HF cache, else None."""
    from huggingface_hub import try_to_load_from_cache
    from transformers import AutoTokenizer

    for repo in repo_ids:
        if any(isinstance(try_to_load_from_cache(repo, f), str)
               for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
            try:
                return AutoTokenizer.from_pretrained(repo, local_files_only=True)
            except (OSError, ValueError):
                continue
    return None


def gpt2_tokenizer() -> Any:
    """GPT-2's BPE tokenizer (HF fast) without network.

    Looks in the local Hugging Face cache (openai-community/gpt2, gpt2), then in tiktoken's
    cache (TIKTOKEN_CACHE_DIR) for its gpt2 files. Raises AnatomyError saying how to get it.
    """
    hf = hf_cached_tokenizer(GPT2_HUB_IDS)
    if hf is not None:
        return hf
    files = _tiktoken_gpt2_files()
    if files is None:
        raise AnatomyError(
            "the GPT-2 tokenizer is not available offline: it is neither in the Hugging Face cache "
            "(openai-community/gpt2) nor in tiktoken's cache; run `python -c \"import tiktoken; "
            "tiktoken.get_encoding('gpt2')\"` once on a connected machine, or set TIKTOKEN_CACHE_DIR")
    from transformers import GPT2TokenizerFast

    vocab = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
    lines = files["vocab.bpe"].read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines[1:] if line.strip()]  # line 0: #version
    return GPT2TokenizerFast(vocab=vocab, merges=merges)
