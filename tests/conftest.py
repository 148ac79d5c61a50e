"""Shared fixtures: the real GPT-2 tokenizer files from ../shared, offline only.

No test touches the network: HF_HUB_OFFLINE is forced on and TIKTOKEN_CACHE_DIR
points at a session cache seeded from ../shared/data/gpt2-bpe.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPT2_BPE = ROOT.parent / "shared" / "data" / "gpt2-bpe"
_TIKTOKEN_URLS = {
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _need_bpe() -> Path:
    if not (GPT2_BPE / "encoder.json").is_file():
        pytest.skip(f"GPT-2 BPE files not found at {GPT2_BPE} (../shared/data/gpt2-bpe)")
    return GPT2_BPE


@pytest.fixture(scope="session")
def tiktoken_cache(tmp_path_factory) -> Path:
    """A TIKTOKEN_CACHE_DIR holding the gpt2 encoding's two files; set in the environment."""
    src = _need_bpe()
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in _TIKTOKEN_URLS.items():
        shutil.copyfile(src / name, cache / hashlib.sha1(url.encode()).hexdigest())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return cache


def build_gpt2_tokenizer():
    """The real GPT-2 tokenizer (transformers, fast) built from the shared BPE files."""
    from transformers import GPT2TokenizerFast

    src = _need_bpe()
    vocab = json.loads((src / "encoder.json").read_text(encoding="utf-8"))
    lines = (src / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines[1:] if line.strip()]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges)
    assert len(tok) == 50257, len(tok)
    return tok


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(tmp_path_factory) -> Path:
    """A directory with the real GPT-2 tokenizer saved by save_pretrained."""
    out = tmp_path_factory.mktemp("gpt2-tokenizer")
    build_gpt2_tokenizer().save_pretrained(out)
    return out
