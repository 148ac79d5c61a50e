"""A GGUF file's tokenizer, converted once and then read from the user cache.

The first time a file is seen its vocabulary is turned into a fast tokenizer by transformers' own converter
(the tokenizer class transformers picks for the config, built with ``gguf_file=``: ``get_gguf_tokenizer`` and
``convert_gguf_tokenizer``). That takes seconds (5 s for Gemma 3's 262,144 tokens, whose merges are rebuilt
from the vocabulary), so the result is kept: the backend's ``tokenizer.json`` and a small JSON entry with the
class name and the keyword arguments that rebuild the same object (special tokens, ``add_bos_token``,
``add_eos_token``, the chat template). Both live in ``cache_dir()/gguf-tokenizers/`` (``$ANATOMY_CACHE_DIR``,
else ``$XDG_CACHE_HOME/anatomy``, else ``~/.cache/anatomy``), named by a key made of the file's identity
(:func:`anatomy_cli.models.gguf.identity`: size, mtime and a digest of the header) and the transformers and
tokenizers versions, so an edited file or an upgraded converter never meets an old entry.

Each file is written to a temporary name and renamed into place; the entry records the SHA-256 of its
``tokenizer.json``. An entry that is missing, partial, unreadable or whose digest differs is rebuilt, never
trusted. A cache that cannot be written is skipped (the tokenizer is still right, only slower next time).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.errors import CheckpointError
from anatomy_cli.models import gguf
from anatomy_cli.models.cachedir import cache_dir
from anatomy_cli.models.headers import GGUFHeader
from anatomy_cli.models.identity import file_sha256

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

_FORMAT = 1
# init keywords that name where the tokenizer came from, not what it is.
_WHERE = {"vocab_file", "name_or_path", "is_local", "local_files_only", "gguf_file", "tokenizer_file", "vocab",
          "merges", "_commit_hash", "_from_auto", "added_tokens_decoder"}


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def entry_paths(header: GGUFHeader) -> tuple[Path, Path]:
    """``(tokenizer.json, entry.json)`` of the file's cache entry (they may not exist)."""
    parts = [_FORMAT, _version("transformers"), _version("tokenizers"), gguf.identity(header)]
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]
    folder = cache_dir() / "gguf-tokenizers"
    return folder / f"{key}.tokenizer.json", folder / f"{key}.entry.json"


def load(header: GGUFHeader, config: PreTrainedConfig, spec: str) -> PreTrainedTokenizerBase:
    """The transformers fast tokenizer of the GGUF file ``header`` describes (``config``: its transformers config).

    From the cache when its entry is whole; else converted by transformers and stored. Raises CheckpointError
    when transformers cannot convert the file's vocabulary.
    """
    tokenizer_json, entry = entry_paths(header)
    cached = _from_cache(tokenizer_json, entry, header)
    if cached is not None:
        return cached
    hf = _convert(header, config, spec)
    _store(hf, tokenizer_json, entry)
    return hf


def _from_cache(tokenizer_json: Path, entry: Path, header: GGUFHeader) -> PreTrainedTokenizerBase | None:
    try:
        meta = json.loads(entry.read_text(encoding="utf-8"))
        if meta.get("format") != _FORMAT or meta.get("sha256") != file_sha256(tokenizer_json):
            return None
        from transformers.models.auto.tokenization_auto import TokenizersBackend
        from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

        cls = tokenizer_class_from_name(meta["class"]) or TokenizersBackend
        hf: PreTrainedTokenizerBase = cls(tokenizer_file=str(tokenizer_json),
                                          name_or_path=str(Path(header.path).resolve().parent), **meta["kwargs"])
        return hf
    except Exception:  # a partial, corrupt or foreign entry: rebuilt from the file
        return None


def tokenizer_class(config: PreTrainedConfig) -> type[PreTrainedTokenizerBase]:
    """The class ``AutoTokenizer`` picks for a GGUF file's config (its last resort for a file with no tokenizer
    files: the class registered for the config, else ``TokenizersBackend``)."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING
    from transformers.models.auto.tokenization_auto import TokenizersBackend

    cls: type[PreTrainedTokenizerBase] = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    return TokenizersBackend if getattr(cls, "__name__", "") == "MistralCommonBackend" else cls


def _convert(header: GGUFHeader, config: PreTrainedConfig, spec: str) -> PreTrainedTokenizerBase:
    path = Path(header.path).resolve()
    try:
        hf: PreTrainedTokenizerBase = tokenizer_class(config).from_pretrained(str(path.parent), gguf_file=path.name,
                                                                               local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError, NotImplementedError) as exc:
        first = " ".join(str(exc).split()).split(". ")[0] or type(exc).__name__
        raise CheckpointError(f"{spec}: cannot build its tokenizer from the GGUF metadata: {first}") from None
    return hf


def _kwargs(hf: PreTrainedTokenizerBase) -> dict[str, object]:
    out: dict[str, object] = {}  # JSON values: what the tokenizer class takes as keywords
    for name, value in hf.init_kwargs.items():
        if name in _WHERE:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[name] = value
    # What a caller reads to decide on BOS/EOS, as the converted object has it (the init keywords may lack them).
    for name in ("add_bos_token", "add_eos_token"):
        if hasattr(hf, name):
            out[name] = bool(getattr(hf, name))
    return out


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _store(hf: PreTrainedTokenizerBase, tokenizer_json: Path, entry: Path) -> None:
    try:
        tokenizer_json.parent.mkdir(parents=True, exist_ok=True)
        text = hf.backend_tokenizer.to_str()
        _write(tokenizer_json, text)
        meta = {"format": _FORMAT, "class": type(hf).__name__, "kwargs": _kwargs(hf),
                "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
        _write(entry, json.dumps(meta))
    except OSError:
        pass
