"""`anatomy heads`: the five scores on synthetic patterns, against transformers' eager attentions
computed here with plain loops, and the induction contrast on the real SmolLM2 vs a random-init copy."""

from __future__ import annotations

import copy
import importlib
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses.heads import heads
from anatomy_cli.analyses.heads import pattern_scores
from anatomy_cli.analyses.heads import random_repeat
from anatomy_cli.analyses.heads import repeat_scores
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

runner = CliRunner()


def _causal_softmax(h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(h, n, n, generator=g) * 3
    return torch.softmax(scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")), -1)


def _by_loops(a, start=None, seq_len=None):
    """The five definitions written out with Python loops over one head's pattern a [n, n] (lists)."""
    n = len(a)
    queries = range(1, n)
    entropy = sum(-sum(p * math.log(p) for p in a[q] if p > 0) for q in queries) / (n - 1)
    first = sum(a[q][0] for q in queries) / (n - 1)
    prev = sum(a[q][q - 1] for q in queries) / (n - 1)
    if start is None:
        return entropy, first, prev
    induction = sum(a[start + seq_len + j][start + j + 1] for j in range(seq_len)) / seq_len
    duplicate = sum(a[start + seq_len + j][start + j] for j in range(seq_len)) / seq_len
    return entropy, first, prev, induction, duplicate


# ---------------------------------------------------------------- analysis

def test_pattern_scores_match_the_definitions():
    a = _causal_softmax(3, 9)
    got = pattern_scores(a)
    assert got.shape == (3, 3)
    for h in range(3):
        assert got[:, h].tolist() == pytest.approx(_by_loops(a[h].tolist()), abs=1e-6)


def test_ideal_heads_score_one():
    n = 8
    prev = torch.zeros(1, n, n)
    prev[0, 0, 0] = 1
    prev[0, torch.arange(1, n), torch.arange(n - 1)] = 1
    sink = torch.zeros(1, n, n)
    sink[0, :, 0] = 1
    assert pattern_scores(prev)[:, 0].tolist() == pytest.approx([0.0, 1 / (n - 1), 1.0])
    assert pattern_scores(sink)[:, 0].tolist() == pytest.approx([0.0, 1.0, 1 / (n - 1)])
    # [CLS] r0..r3 r0..r3 [SEP]: start 1, seq_len 4; an ideal induction head and an ideal duplicate head
    start, s = 1, 4
    ind, dup = torch.zeros(1, 10, 10), torch.zeros(1, 10, 10)
    for j in range(s):
        ind[0, start + s + j, start + j + 1] = 1
        dup[0, start + s + j, start + j] = 1
    assert repeat_scores(ind, start=start, seq_len=s)[:, 0].tolist() == [1.0, 0.0]
    assert repeat_scores(dup, start=start, seq_len=s)[:, 0].tolist() == [0.0, 1.0]


def test_random_repeat_is_seeded_distinct_and_from_the_candidates():
    candidates = list(range(100, 400, 3))
    ids = random_repeat(candidates, 20, seed=7)
    assert ids == random_repeat(candidates, 20, seed=7) != random_repeat(candidates, 20, seed=8)
    assert len(ids) == 40 and ids[:20] == ids[20:] and len(set(ids[:20])) == 20 and set(ids) <= set(candidates)
    with pytest.raises(UsageError, match="--seq-len 101 is more than the 100 ordinary tokens"):
        random_repeat(candidates, 101, seed=0)


def test_sort_and_top():
    g = torch.Generator().manual_seed(3)
    pattern, repeat = torch.rand(2, 3, 4, generator=g), torch.rand(2, 2, 4, generator=g)
    result = heads(pattern, repeat, measured_on="random", seq_len=5, seed=0, random_token_ids=[1] * 5,
                   sort="induction", top=3)
    assert len(result.rows) == 3 and result.n_heads_total == 8
    best = sorted(((repeat[l, 0, h].item(), l, h) for l in range(2) for h in range(4)), reverse=True)[:3]
    assert [(r.layer, r.head) for r in result.rows] == [(l, h) for _, l, h in best]
    by_entropy = heads(pattern, repeat, measured_on="random", seq_len=5, seed=0, random_token_ids=[1] * 5,
                       sort="entropy").rows
    assert [r.entropy for r in by_entropy] == sorted(r.entropy for r in by_entropy)  # sharpest first
    assert set(result.to_dict()["heads"][0]) == {"layer", "head", "entropy", "first_token", "prev_token",
                                                  "induction", "duplicate_token"}
    with pytest.raises(UsageError, match="unknown --sort"):
        heads(pattern, repeat, measured_on="random", seq_len=5, seed=0, random_token_ids=[], sort="nope")


# ---------------------------------------------------------------- CLI

def invoke(*args):
    return runner.invoke(app, list(args))


def _hf_scores(model_dir, ids, start=None, seq_len=None):
    """Scores per (layer, head) from transformers' own eager output_attentions, by loops."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    cls = transformers.AutoModelForMaskedLM if cfg.model_type == "bert" else transformers.AutoModelForCausalLM
    ref = cls.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = ref(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    return {(l, h): _by_loops(att[0, h].tolist(), start, seq_len)
            for l, att in enumerate(attentions) for h in range(att.shape[1])}


@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_scores_equal_transformers_eager_attentions(arch, tiny_model_dir):
    model = str(tiny_model_dir(arch))
    result = invoke("heads", "-m", model, "--device", "cpu", "--seq-len", "12", "--seed", "3", "-f", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["seq_len"], data["seed"], data["measured_on"], data["prompt"]) == (12, 3, "random", None)
    start = 1 if arch == "bert" else 0  # an encoder's random sequence is [CLS] r r [SEP]
    assert data["token_ids"][start:start + 24] == data["random_token_ids"] * 2
    assert len(data["token_ids"]) == 24 + 2 * start
    want = _hf_scores(model, data["token_ids"], start, 12)
    assert len(data["heads"]) == len(want) == 8
    for row in data["heads"]:
        got = [row[key] for key in ("entropy", "first_token", "prev_token", "induction", "duplicate_token")]
        assert got == pytest.approx(want[row["layer"], row["head"]], abs=2e-6)

    prompt = invoke("heads", "The cat sat on the mat", "-m", model, "--device", "cpu", "--seq-len", "12",
                    "--seed", "3", "-f", "json")
    assert prompt.exit_code == 0, prompt.stderr
    on_prompt = json.loads(prompt.stdout)
    assert on_prompt["measured_on"] == "prompt" and on_prompt["prompt"] == "The cat sat on the mat"
    want_prompt = _hf_scores(model, on_prompt["token_ids"])
    for row, random_row in zip(on_prompt["heads"], data["heads"]):
        assert [row["entropy"], row["first_token"], row["prev_token"]] == \
            pytest.approx(want_prompt[row["layer"], row["head"]], abs=2e-6)
        assert (row["induction"], row["duplicate_token"]) == (random_row["induction"], random_row["duplicate_token"])


@pytest.mark.usefixtures("cached_load")
def test_random_tokens_are_ordinary_and_the_table_says_length_and_seed(tiny_model_dir, tiny_lm):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("heads", "-m", model, "--device", "cpu", "--sort", "induction", "--top", "3", "--seq-len", "30")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == ["layer", "head", "entropy", "first_token", "prev_token", "induction",
                                    "duplicate_token"] and len(lines) == 4
    assert "30 random tokens × 2, seed 0" in result.stderr  # the heading goes to stderr in tsv
    data = json.loads(invoke("heads", "-m", model, "--device", "cpu", "-f", "json", "--seq-len", "32").stdout)
    lm = tiny_lm("gpt2")
    assert data["seq_len"] == 32 and len(set(data["random_token_ids"])) == 32
    assert not set(data["random_token_ids"]) & (lm.tokenizer.special_ids | {50256})  # <|endoftext|> is special
    table = invoke("heads", "The cat sat", "-m", model, "--device", "cpu", "-f", "table", "--top", "2", "--sort",
                   "prev_token", "--seq-len", "20")
    text = " ".join(table.stdout.split())  # rich wraps the heading at the terminal's width
    assert "top 2 of 8 heads by prev_token" in text and "20 random tokens × 2, seed 0" in text


@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("args, message", [
    (["--seq-len", "40"], "--seq-len 40 makes a random sequence of 80 tokens; {m} takes at most 64 "
                          "(use --seq-len 32 or less)"),
    (["The", "--seq-len", "10"], "the prompt is 1 token: heads measures queries 1..n-1 and needs at least 2"),
    (["--sort", "nope"], "Invalid value for '--sort'"),
])
def test_bad_input_is_a_usage_error(args, message, tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("heads", *args, "-m", model, "--device", "cpu")
    assert result.exit_code == 2
    assert message.format(m=model) in result.stderr


def test_seq_len_is_checked_before_the_weights_load(tiny_model_dir, monkeypatch):

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(importlib.import_module("anatomy_cli.engine.loading"), "_load_weights", no_weights)
    result = invoke("heads", "-m", str(tiny_model_dir("gpt2")), "--device", "cpu", "--seq-len", "33")
    assert result.exit_code == 2 and "--seq-len 33 makes a random sequence of 66 tokens" in result.stderr


# ---------------------------------------------------------------- the real trained decoder

@pytest.fixture(scope="module")
def smollm2_random(smollm2_hf):
    """A random-init model of SmolLM2's shape (its config, torch.manual_seed(0)), wrapped like smollm2_lm."""
    from transformers import AutoModelForCausalLM

    from anatomy_cli import engine

    model, tok = smollm2_hf
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        random_model = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=torch.float32).eval()
    return engine.from_model(random_model, tok, name="SmolLM2-shaped, random init", untrained=True)


def test_trained_smollm2_has_induction_heads_and_a_random_init_copy_does_not(smollm2_lm, smollm2_random,
                                                                              monkeypatch, fixed_load):

    models = {"smollm2": smollm2_lm, "smollm2-random": smollm2_random}
    fixed_load(lambda spec: models[spec.model])
    best = {}
    for spec in models:
        result = invoke("heads", "-m", spec, "--sort", "induction", "--top", "1", "-f", "json")
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["n_heads_total"] == 30 * 9 and (data["seq_len"], data["seed"]) == (50, 0)  # the defaults
        best[spec] = data["heads"][0]["induction"]
    assert best["smollm2"] > 0.5       # measured: 0.925 (layer 18, head 6)
    assert best["smollm2-random"] < 0.2  # measured: 0.020
