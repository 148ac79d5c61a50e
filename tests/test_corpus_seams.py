"""A text file read in pieces is tokenized as one document (issue 41 item 2): the corpus' token stream
equals the tokenizer run on the whole text, for a byte-level BPE (GPT-2) and SentencePiece-style
tokenizers (a Metaspace BPE with a dummy prefix, and Gemma 3's, when installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from anatomy_cli.corpus import sources
from anatomy_cli.corpus import windows
from anatomy_cli.corpus.sources import open_source

ROOT = Path(__file__).resolve().parents[1]
# Seams land everywhere: after "\n" before "\n" (GPT-2 merges "\n\n"), before a word ("▁" prefix), in runs
# of spaces, around multi-byte characters.
TEXT = ((ROOT / "docs" / "article.md").read_text()[:5000]
        + "\n\n\n  indented   spaces\n\nnaïve café — 数学 🙂 emoji\n\n" * 3 + "end without newline")


def stream(path: Path, hf) -> list[int]:
    out: list[int] = []
    for ids in windows.token_stream(open_source(str(path)).pieces(), hf, eos=hf.eos_token_id):
        out.extend(ids)
    return out


def whole(hf, text: str) -> list[int]:
    return [*hf(text, add_special_tokens=False)["input_ids"], hf.eos_token_id]


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of ~60 bytes, a held tail and context of 40 characters: a seam every line."""
    monkeypatch.setattr(sources, "PIECE_BYTES", 60)
    monkeypatch.setattr(windows, "HOLD_CHARS", 40)
    monkeypatch.setattr(windows, "CONTEXT_CHARS", 40)


def sentencepiece_bpe():
    """A SentencePiece-style tokenizer (Metaspace "▁" with a dummy prefix, BPE), trained here offline."""
    from tokenizers import SentencePieceBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = SentencePieceBPETokenizer(add_prefix_space=True)
    tok.train_from_iterator([TEXT], vocab_size=400, min_frequency=1, special_tokens=["</s>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def test_gpt2_bpe_across_seams(tmp_path, small_pieces):
    from conftest import build_gpt2_tokenizer

    hf = build_gpt2_tokenizer()
    (tmp_path / "a.txt").write_text(TEXT)
    assert len(list(open_source(str(tmp_path / "a.txt")).pieces())) >= 40
    assert stream(tmp_path / "a.txt", hf) == whole(hf, TEXT)


def test_sentencepiece_style_across_seams(tmp_path, small_pieces):
    hf = sentencepiece_bpe()
    assert hf("x y", add_special_tokens=False).tokens()[0].startswith("▁")  # it adds the dummy prefix
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "b.txt").write_text(TEXT[:900])  # a second document: a new start, with its own prefix
    assert stream(tmp_path / "a.txt", hf) == whole(hf, TEXT)
    d = tmp_path
    src = open_source(str(d))
    assert src.kind == "dir"
    assert stream(d, hf) == whole(hf, TEXT) + whole(hf, TEXT[:900])


def test_gemma3_tokenizer_across_seams(tmp_path, small_pieces, gemma3_gguf):
    from anatomy_cli import engine
    from anatomy_cli.models.spec import ModelSpec

    hf = engine.open_model(ModelSpec(str(gemma3_gguf))).tokenizer.hf
    (tmp_path / "a.txt").write_text(TEXT[:3000] + TEXT[-400:])
    assert stream(tmp_path / "a.txt", hf) == whole(hf, TEXT[:3000] + TEXT[-400:])
