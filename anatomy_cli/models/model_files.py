"""A resolved model's config and tokenizer: the one reading path behind ``params``, ``tokens --model``
and the engine (where the model comes from: :func:`anatomy_cli.models.resolve.resolve`; its weights:
:mod:`anatomy_cli.engine.loading`).

No torch and no transformers at import time; transformers is imported when a config or a tokenizer is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.data import gpt2_merges
from anatomy_cli.data import gpt2_vocab
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import UnsupportedArchitecture
from anatomy_cli.models import gguf
from anatomy_cli.models import gguf_tokenizer
from anatomy_cli.models import hub
from anatomy_cli.models import presets
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.resolve import TOKENIZER_FILES
from anatomy_cli.models.resolve import Source
from anatomy_cli.models.resolve import config_path
from anatomy_cli.models.resolve import first_line
from anatomy_cli.models.resolve import in_cache
from anatomy_cli.models.resolve import offline_error

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase


def read_config(source: Source, *, trust_remote_code: bool = False,
                check_model_type: Callable[[str], object] | None = None) -> PreTrainedConfig:
    """The transformers config of ``source``: a preset's built-in config, the config stored in a GGUF
    file's metadata, or config.json of a directory or a Hub id (the cached file; a Hub repository's
    own code only with ``trust_remote_code``).

    ``check_model_type(model_type)``, when given, sees config.json's raw ``model_type`` before
    transformers builds anything (the engine refuses architectures it has no adapter for there).

    Raises CheckpointError (config.json not JSON, unreadable or inconsistent; GGUF metadata
    transformers cannot turn into a config), UnsupportedArchitecture (no or an unknown model_type),
    and whatever ``check_model_type`` raises.
    """
    if source.kind == "preset":
        return presets.preset_config(source.spec)
    if source.kind == "gguf":
        return gguf.read_config(read_gguf(source.ref), source.spec)
    spec, path = source.spec, config_path(source)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{spec}: config.json is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{spec}: config.json is not a JSON object")
    if "model_type" not in raw:
        raise UnsupportedArchitecture(f"{spec}: config.json has no model_type")
    if check_model_type is not None:
        check_model_type(raw["model_type"])
    # Remote code needs the repository id so transformers can fetch its .py files.
    target = source.ref if source.kind == "hub" and trust_remote_code else str(path.parent)
    return _auto_config(spec, target, trust_remote_code, local_only=source.local_only)


def _auto_config(spec: str, target: str, trust_remote_code: bool, local_only: bool) -> PreTrainedConfig:
    import transformers
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        config: PreTrainedConfig = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code,
                                                              local_files_only=local_only)
        return config
    except OSError as exc:
        raise CheckpointError(f"{spec}: cannot read config.json: {_first_sentence(exc)}") from None
    except StrictDataclassError as exc:  # v5 configs validate their fields (e.g. hidden % heads)
        raise CheckpointError(f"{spec}: config.json is inconsistent: {_first_sentence(exc.__cause__ or exc)}") from None
    except (ValueError, KeyError, TypeError) as exc:
        m = re.search(r"model type `([^`]*)`", str(exc))
        if m:
            raise UnsupportedArchitecture(
                f"{spec}: model_type '{m.group(1)}' is unknown to transformers {transformers.__version__} "
                "(try a newer transformers, or --trust-remote-code if the repository ships its own code)") from None
        raise UnsupportedArchitecture(f"{spec}: config.json is not a known transformers architecture: "
                                      f"{_first_sentence(exc)}") from None


def _first_sentence(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.split(". ")[0].rstrip(".")


GPT2_HUB_IDS = ("openai-community/gpt2", "gpt2")


def load_tokenizer(source: Source, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The transformers (fast) tokenizer of ``source``.

    * ``gguf``: the tokenizer stored in the file, converted by transformers' GGUF support once and then read
      from the user cache (:mod:`anatomy_cli.models.gguf_tokenizer`);
    * ``preset``: GPT-2's BPE (HF cache, else the files inside the package: always offline);
      another preset's tokenizer from the local HF cache;
    * ``dir`` / ``hub``: ``AutoTokenizer.from_pretrained`` (the Hub only when
      ``source.local_only`` is False).

    Raises CheckpointError (no tokenizer files, files that build no tokenizer or no vocabulary,
    GGUF metadata transformers cannot convert), OfflineError (a Hub id whose tokenizer is not
    cached while offline), ModelNotFound (a Hub id without a tokenizer), AnatomyError (a
    non-GPT-2 preset whose tokenizer is not cached).
    """
    if source.kind == "gguf":
        return _gguf_tokenizer(source)
    if source.kind == "preset":
        return _preset_tokenizer(source.spec)
    name = source.spec
    if source.kind == "dir":
        present = any((Path(source.ref) / f).is_file() for f in TOKENIZER_FILES)
    else:
        present = not source.local_only or any(in_cache(source.ref, f) for f in TOKENIZER_FILES)
    if not present:
        raise CheckpointError(f"'{name}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...)")
    from transformers import AutoTokenizer

    try:
        hf: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(source.ref, local_files_only=source.local_only,
                                                                    trust_remote_code=trust_remote_code)
    except OSError as exc:
        if source.kind == "dir":
            raise CheckpointError(f"'{name}' has no usable tokenizer files: {first_line(exc)}") from None
        if hub.offline() or "connect" in str(exc).lower():
            raise offline_error(name, "tokenizer") from None
        raise ModelNotFound(f"no tokenizer for '{name}': {first_line(exc)}") from None
    except (ValueError, TypeError, KeyError) as exc:  # files present but no tokenizer can be built from them
        # transformers' "Couldn't instantiate the backend tokenizer from one of:" lists the ways on the lines after
        why = f"a required field is missing: {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        raise CheckpointError(f"'{name}' has no usable tokenizer files (tokenizer.json, vocab and merges, or a "
                              f"SentencePiece model): {why}") from None
    if not getattr(hf, "vocab_size", 0):
        raise CheckpointError(f"'{name}': its tokenizer files define no vocabulary")
    return hf


def _gguf_tokenizer(source: Source) -> PreTrainedTokenizerBase:
    header = read_gguf(source.ref)
    return gguf_tokenizer.load(header, gguf.read_config(header, source.spec), source.spec)


def _preset_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    if presets.PRESETS[spec][0] == "gpt2":
        return gpt2_tokenizer()
    repo = presets.HUB_IDS.get(spec, spec)
    hf = hf_cached_tokenizer((repo,))
    if hf is None:
        raise AnatomyError(f"no tokenizer for the {spec} preset offline: {repo}'s tokenizer is not in the local "
                           f"Hugging Face cache; fetch it once on a connected machine "
                           f"(hf download {repo} --include 'tokenizer*')")
    return hf


def hf_cached_tokenizer(repo_ids: tuple[str, ...]) -> PreTrainedTokenizerBase | None:
    """An AutoTokenizer for the first repo whose tokenizer is in the local HF cache, else None."""
    from transformers import AutoTokenizer

    for repo in repo_ids:
        if any(in_cache(repo, f) for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
            try:
                found: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(repo, local_files_only=True)
                return found
            except (OSError, ValueError):
                continue
    return None


def gpt2_tokenizer() -> PreTrainedTokenizerBase:
    """GPT-2's BPE tokenizer (HF fast, 50,257 tokens) without network.

    From the local Hugging Face cache (openai-community/gpt2, gpt2) when it is there, else
    built from the BPE files inside the package (:mod:`anatomy_cli.data`): it always works.
    """
    hf = hf_cached_tokenizer(GPT2_HUB_IDS)
    if hf is not None:
        return hf
    from transformers import GPT2Tokenizer  # GPT2TokenizerFast is v5's alias of this (fast) class

    # vocab=/merges= as data: transformers 5 turns file paths given there into a one-token tokenizer.
    built: PreTrainedTokenizerBase = GPT2Tokenizer(vocab=dict(gpt2_vocab()), merges=gpt2_merges())
    return built
