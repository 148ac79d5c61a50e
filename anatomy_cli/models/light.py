"""A model's config.json and tokenizer.json read without torch or transformers: enough to check a command's
prompt-level arguments (token counts, positions, targets, layers) before the slow imports.

transformers' config and tokenizer classes import torch, which costs seconds. This module reads
``config.json`` as JSON (:class:`JsonConfig`) and returns the ``tokenizers`` library's tokenizer built from
``tokenizer.json`` (or, for the GPT-2 presets, from the BPE files inside the package), with
tokenizer_config.json's special tokens. Only sources it can read exactly are answered: a local directory
whose tokenizer class is in :data:`TOKENIZER_CLASSES`, or a GPT-2 preset with ``--init random``;
:func:`read` returns None for everything else (GGUF files, Hub ids, SentencePiece-only tokenizers), and
the caller simply waits for the full load. No torch, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.data import GPT2_SPECIAL
from anatomy_cli.data import gpt2_merges
from anatomy_cli.data import gpt2_vocab
from anatomy_cli.models import presets
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.json_config import JsonConfig
from anatomy_cli.models.model_files import GPT2_HUB_IDS
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.resolve import in_cache

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from anatomy_cli.models.headers import GGUFHeader

# Tokenizer classes whose transformers tokenizer is the tokenizer.json it was saved with, unchanged
# (checked by tests/test_preflight.py); others (Llama's, Gemma's) may rebuild parts of it.
TOKENIZER_CLASSES = frozenset({"GPT2Tokenizer", "GPT2TokenizerFast", "TokenizersBackend", "PreTrainedTokenizerFast",
                               "BertTokenizer", "BertTokenizerFast", "RobertaTokenizer", "RobertaTokenizerFast"})

def _json(path: Path) -> dict[str, object] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read(spec: str, init: str = "pretrained") -> tuple[JsonConfig, Tokenizer, dict[str, object]] | None:
    """``(config, backend, special)`` for model ``spec`` when it can be read without torch, else None.

    ``backend`` is a ``tokenizers.Tokenizer``, ``special`` tokenizer_config.json's entries (see
    :class:`anatomy_cli.text.fast.BackendTokenizer`). Raises what :func:`check_path` raises.
    """
    source = check_path(spec)
    if source is None:
        if init == "random" and spec in presets.PRESETS and presets.PRESETS[spec][0] == "gpt2":
            return _gpt2_preset(spec)
        return None
    if source.kind != "dir":
        return None
    root = Path(source.ref)
    config, special = _json(root / "config.json"), _json(root / "tokenizer_config.json") or {}
    if config is None or not (root / "tokenizer.json").is_file():
        return None
    if special.get("tokenizer_class") not in TOKENIZER_CLASSES:
        return None
    special = {**(_json(root / "special_tokens_map.json") or {}), **special}
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception:  # the tokenizers library's own error types; the full load reports the file
        return None
    return JsonConfig(config), backend, special


def gguf_header(spec: str) -> GGUFHeader | None:
    """The header of the GGUF file behind ``spec``, read without torch, for checks before the slow open (the block
    count, ``GGUFHeader.block_count``: an upper bound; the context, ``GGUFHeader.context_length``); None for every
    other source (a directory's light open is quick; a Hub id or a preset is known once opened). Raises what
    :func:`check_path` and ``read_gguf`` raise (a missing path, a corrupt header)."""
    source = check_path(spec)
    if source is None or source.kind != "gguf":
        return None
    return read_gguf(source.ref)


def _gpt2_preset(spec: str) -> tuple[JsonConfig, Tokenizer, dict[str, object]] | None:
    """GPT-2's tokenizer from the package's BPE files, as transformers builds it (GPT2Tokenizer), and the
    preset's shape. None when GPT-2's tokenizer is in the HF cache (that one is used by the full load)."""
    if any(in_cache(repo, f) for repo in GPT2_HUB_IDS for f in ("tokenizer.json", "tokenizer_config.json",
                                                                 "vocab.json")):
        return None
    from tokenizers import AddedToken
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers

    backend = Tokenizer(models.BPE(vocab=dict(gpt2_vocab()), merges=gpt2_merges()))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    # tokenizers' stub gives the ByteLevel decoder no keywords; its constructor takes (and serializes) the
    # pre-tokenizer's, as transformers' GPT-2 converter passes them.
    backend.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True,  # type: ignore[call-arg]
                                         use_regex=True)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GPT2_SPECIAL])
    model_type, shape = presets.PRESETS[spec]
    token = next(iter(GPT2_SPECIAL))
    return JsonConfig({"model_type": model_type, **shape}), backend, {"bos_token": token, "eos_token": token,
                                                                       "unk_token": token}
