"""Engine tokenization: real GPT-2 ids, byte pieces, offsets, specials, BOS, BERT, length checks."""

from __future__ import annotations

import pytest
from conftest import build_gpt2_tokenizer

from anatomy_cli import engine
from anatomy_cli.errors import PromptTooLong
from anatomy_cli.errors import UsageError
from anatomy_cli.models.model_files import gpt2_tokenizer
from anatomy_cli.text.tokenization import Tokenizer


@pytest.fixture(scope="module")
def gpt2_tok():
    return Tokenizer(build_gpt2_tokenizer())


def test_thank_you_very(gpt2_tok):
    enc = engine.encode(gpt2_tok, ["Thank you very"])[0]
    assert enc.ids == [10449, 345, 845]
    assert enc.pieces == ["Thank", "·you", "·very"]
    assert enc.offsets == [(0, 5), (5, 9), (9, 14)]
    assert enc.special == [False, False, False]
    assert b"".join(enc.token_bytes) == b"Thank you very"
    assert [enc.text[s:e] for s, e in enc.offsets] == ["Thank", " you", " very"]


def test_known_ids(gpt2_tok):
    assert [e.ids for e in engine.encode(gpt2_tok, [" much", " bank", "bank"])] == [[881], [3331], [17796]]
    assert gpt2_tok.piece(881) == "·much" and gpt2_tok.token_bytes(881) == b" much"


def test_chinese_gives_byte_pieces(gpt2_tok):
    text = "你好 world"
    enc = engine.encode(gpt2_tok, [text])[0]
    assert enc.ids == [19526, 254, 25001, 121, 995]
    assert enc.pieces == ["<e4 bd>", "<a0>", "<e5 a5>", "<bd>", "·world"]
    assert enc.offsets[:2] == [(0, 1), (0, 1)]  # both pieces of 你 cover its one character
    assert b"".join(enc.token_bytes).decode("utf-8") == text


@pytest.mark.parametrize("text", ["  two  spaces\n\ttab", "émigré naïve café", "emoji 🙂 ok", "a<|endoftext|>b"])
def test_pieces_concatenate_back(gpt2_tok, text):
    enc = engine.encode(gpt2_tok, [text])[0]
    assert b"".join(enc.token_bytes).decode("utf-8") == text
    assert len(enc.pieces) == len(enc.ids) == len(enc.offsets) == len(enc.special)


def test_special_token_text_is_plain_text_by_default(gpt2_tok):
    enc = engine.encode(gpt2_tok, ["a<|endoftext|>b"])[0]
    assert enc.ids == [64, 27, 91, 437, 1659, 5239, 91, 29, 65]  # what tiktoken's gpt2 gives (tokens)
    assert not any(enc.special)


def test_special_token_in_text_with_allow_special_is_special_and_covers_its_text(gpt2_tok):
    enc = engine.encode(gpt2_tok, ["a<|endoftext|>b"], allow_special=True)[0]
    assert enc.ids == [64, 50256, 65]
    assert enc.special == [False, True, False]
    assert enc.pieces[1] == "<|endoftext|>" and enc.offsets[1] == (1, 14)


def test_bos_on_a_prompt_that_starts_with_bos_keeps_one(gpt2_tok):
    from anatomy_cli.text.tokenization import starts_with_bos

    enc = engine.encode(gpt2_tok, ["<|endoftext|>Hi"], bos=True, allow_special=True)[0]
    assert enc.ids == [50256, 17250] and starts_with_bos(enc, gpt2_tok.bos_id)
    plain = engine.encode(gpt2_tok, ["<|endoftext|>Hi"], bos=True)[0]  # plain text: the BOS is added
    assert plain.ids[0] == 50256 and plain.ids[1:3] == [27, 91] and not starts_with_bos(plain, gpt2_tok.bos_id)


def test_bert_specials_stay_with_plain_special_text(tiny_lm):
    lm = tiny_lm("bert")
    enc = engine.encode(lm, ["a [SEP] b"])[0]
    assert enc.ids[0] == 101 and enc.ids[-1] == 102 and enc.ids.count(102) == 1
    assert engine.encode(lm, ["a [SEP] b"], allow_special=True)[0].ids.count(102) == 2


def test_no_bos_unless_asked(gpt2_tok):
    plain = engine.encode(gpt2_tok, ["Thank you very"])[0]
    with_bos = engine.encode(gpt2_tok, ["Thank you very"], bos=True)[0]
    assert with_bos.ids == [50256] + plain.ids
    assert with_bos.special[0] and with_bos.offsets[0] == (0, 0) and with_bos.token_bytes[0] == b""
    assert b"".join(with_bos.token_bytes) == b"Thank you very"


def test_encode_accepts_loaded_model_and_raw_tokenizer(tiny_lm):
    lm = tiny_lm("llama")
    assert engine.encode(lm, ["Thank you very"])[0].ids == [10449, 345, 845]  # no BOS for decoders
    assert engine.encode(build_gpt2_tokenizer(), "Thank you very")[0].ids == [10449, 345, 845]


def test_bert_keeps_cls_and_sep(tiny_lm):
    lm = tiny_lm("bert")
    enc = engine.encode(lm, ["The Bank of rivers"])[0]
    assert enc.ids == [101, 1996, 2924, 1997, 5485, 102]
    assert enc.pieces == ["[CLS]", "the", "bank", "of", "rivers", "[SEP]"]
    assert enc.special == [True, False, False, False, False, True]
    assert enc.offsets[0] == enc.offsets[-1] == (0, 0)
    assert enc.token_bytes[2] == b"Bank"  # WordPiece: bytes are the input text the token covers
    assert lm.tokenizer.kind == "text" and lm.tokenizer.pad_id == 0


def test_gpt2_tokenizer_offline_from_the_bundled_files(tiktoken_cache, empty_hf_cache):
    tok = Tokenizer(gpt2_tokenizer())
    assert len(tok) == 50257
    assert engine.encode(tok, ["Thank you very"])[0].ids == [10449, 345, 845]
    assert engine.encode(tok, [" much"])[0].ids == [881]
    assert tok.pad_id == 50256  # GPT-2 has no pad token: EOS, only as padding


def test_prompt_too_long_and_truncate_left(tiny_lm):
    lm = tiny_lm("gpt2")  # n_ctx 64
    text = " ".join(f"w{i}" for i in range(40))
    enc = engine.encode(lm, [text])
    n = len(enc[0])
    assert n > 64
    with pytest.raises(PromptTooLong) as err:
        engine.check_length(lm, enc, truncate=None)
    assert str(err.value).startswith(f"prompt is {n} tokens; {lm.name} takes at most 64")
    assert err.value.exit_code == 2 and isinstance(err.value, UsageError)
    with pytest.raises(PromptTooLong, match=r"^prompt 2 is"):
        engine.check_length(lm, engine.encode(lm, ["short"]) + enc)
    [cut] = engine.check_length(lm, enc, truncate="left")
    assert len(cut) == 64 and cut.ids == enc[0].ids[-64:] and cut.dropped == n - 64
    assert cut.text == text and cut.offsets == enc[0].offsets[-64:]
    cache = engine.run(lm, [cut], ["logits"])[0]
    assert cache.logits.shape == (64, lm.vocab_size)
    short = engine.encode(lm, ["short"])
    assert engine.check_length(lm, short) == short
    with pytest.raises(UsageError, match="unknown truncation"):
        engine.check_length(lm, short, truncate="right")


def test_truncate_left_keeps_inserted_specials(tiny_lm):
    lm = tiny_lm("bert")  # n_ctx 64, [CLS] ... [SEP]
    enc = engine.encode(lm, [" ".join(["bank"] * 80)])
    [cut] = engine.check_length(lm, enc, truncate="left")
    assert len(cut) == 64 and cut.ids[0] == 101 and cut.ids[-1] == 102 and cut.dropped == 82 - 64


def _sentencepiece_style_tokenizer():
    """A tiny Llama-2-style BPE: ▁ for spaces, a dummy prefix space, <0xNN> byte fallback."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for token in ["▁", "a", "b", "▁a", "▁b", "ab", "▁ab"]:
        vocab[token] = len(vocab)
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁", "b"), ("a", "b"), ("▁a", "b")],
                                  byte_fallback=True, unk_token="<unk>"))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_sentencepiece_style_pieces():
    tok = Tokenizer(_sentencepiece_style_tokenizer())
    assert tok.kind == "sentencepiece"
    enc = engine.encode(tok, ["ab b你"])[0]
    assert enc.pieces == ["·ab", "·b", "<e4>", "<bd>", "<a0>"]
    assert b"".join(enc.token_bytes).decode("utf-8") == " ab b你"  # the dummy prefix space shows
    assert enc.offsets[2:] == [(4, 5)] * 3
    assert engine.encode(tok, ["ab"], bos=True)[0].ids == [1, 265]
