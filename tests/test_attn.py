"""`anatomy attn` and engine.attention_patterns.

Patterns are checked against softmax(QKᵀ/√d_head + mask) recomputed here from the weights (GPT-2's
fused c_attn; LLaMA's rotary positions and grouped-query attention written out by hand), against
transformers' own eager ``output_attentions``, for row sums, the causal zeros, batching with
padding (BERT) and the CLI's long form and errors.
"""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app

PROMPTS = ["The cat sat on the mat", "Thank you very", "A long prompt, with a comma, and more words in it"]
runner = CliRunner()


def _hidden_states(lm, text):
    """Each block's input (HF output_hidden_states: independent of the engine's hooks), and the ids."""
    ids = torch.tensor([engine.encode(lm, [text])[0].ids])
    with torch.no_grad():
        out = lm.model.base_model(input_ids=ids, output_hidden_states=True)
    return out.hidden_states, ids.shape[1]


def _softmax(q, k, causal=True):
    """q, k: [heads, pos, d_head] -> softmax(q kᵀ / √d_head + causal mask): [heads, pos, pos]."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1)


def _gpt2_by_hand(lm, text):
    hidden, n = _hidden_states(lm, text)
    H, dh = lm.n_heads, lm.d_head
    out = []
    for layer, block in enumerate(lm.model.transformer.h):
        x = torch.nn.functional.layer_norm(hidden[layer][0], (lm.d_model,), block.ln_1.weight, block.ln_1.bias,
                                           block.ln_1.eps)
        qkv = x @ block.attn.c_attn.weight + block.attn.c_attn.bias  # Conv1D: weight [d, 3d], fused q|k|v
        q, k, _ = qkv.split(lm.d_model, dim=-1)
        out.append(_softmax(q.view(n, H, dh).transpose(0, 1), k.view(n, H, dh).transpose(0, 1)))
    return torch.stack(out)


def _llama_by_hand(lm, text):
    hidden, n = _hidden_states(lm, text)
    cfg = lm.model.config
    H, KV, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None]       # [pos, dh/2]
    cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()

    def rotate(x):  # x [heads, pos, dh]; HF LLaMA pairs dimension i with i + dh/2
        half = torch.cat([-x[..., dh // 2:], x[..., :dh // 2]], -1)
        return x * cos + half * sin

    out = []
    for layer, block in enumerate(lm.model.model.layers):
        h = hidden[layer][0]
        norm = block.input_layernorm
        x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
        q = (x @ block.self_attn.q_proj.weight.T).view(n, H, dh).transpose(0, 1)
        k = (x @ block.self_attn.k_proj.weight.T).view(n, KV, dh).transpose(0, 1)
        k = k.repeat_interleave(H // KV, dim=0)  # query head h reads key/value head h // (H / KV)
        out.append(_softmax(rotate(q), rotate(k)))
    return torch.stack(out)


@pytest.mark.parametrize("arch, by_hand", [("gpt2", _gpt2_by_hand), ("llama", _llama_by_hand)])
def test_patterns_equal_softmax_qk_recomputed_from_the_weights(arch, by_hand, tiny_lm):
    lm = tiny_lm(arch)
    if arch == "llama":
        assert (lm.model.config.num_attention_heads, lm.model.config.num_key_value_heads) == (4, 2)
    for text in PROMPTS[:2]:
        [got] = engine.attention_patterns(lm, engine.encode(lm, [text]))
        with torch.no_grad():
            want = by_hand(lm, text)
        assert got.shape == want.shape == (lm.n_layers, lm.n_heads, want.shape[-1], want.shape[-1])
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
        # the tiny random models attend almost uniformly: the check must see more than the mask
        assert (got - torch.tril(torch.ones_like(got)) / torch.tril(torch.ones_like(got)).sum(-1, keepdim=True)) \
            .abs().max() > 1e-3


def _every_arch():
    import models

    return list(models.ARCHS)


@pytest.mark.parametrize("arch", _every_arch())
def test_patterns_equal_transformers_eager_output_attentions(arch):
    """Every architecture of tests/models.py: the engine's patterns (model built with the default sdpa,
    switched for the run) equal output_attentions of the same weights built natively eager."""
    import models
    import transformers
    from conftest import build_gpt2_tokenizer

    config_cls, model_cls, _ = models.ARCHS[arch]
    config = getattr(transformers, config_cls)(**models.config_kwargs(arch), attn_implementation="eager")
    torch.manual_seed(0)  # the seed build_model uses: the same weights
    ref = getattr(transformers, model_cls)(config).eval()
    model = models.build_model(arch)
    tokenizer = {"bert": models.bert_tokenizer, "roberta": getattr(models, "roberta_tokenizer", None)}.get(
        arch, build_gpt2_tokenizer)()
    lm = engine.from_model(model, tokenizer, name=arch)
    before = model.config._attn_implementation  # sdpa, except where transformers picks eager (Gemma 2)
    assert before == "sdpa" or arch.startswith("gemma")
    encoded = engine.encode(lm, PROMPTS[:2])
    got = engine.attention_patterns(lm, encoded)
    for enc, pattern in zip(encoded, got):
        with torch.no_grad():
            out = ref(input_ids=torch.tensor([enc.ids]), output_attentions=True)
        torch.testing.assert_close(pattern, torch.cat(out.attentions), atol=1e-6, rtol=1e-5)
    assert model.config._attn_implementation == before  # eager only for that run


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox", "bert"])
def test_rows_sum_to_one_and_causal_models_see_no_future(arch, tiny_lm):
    lm = tiny_lm(arch)
    for pattern in engine.attention_patterns(lm, engine.encode(lm, PROMPTS)):
        torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-5, rtol=0)
        above = torch.ones(pattern.shape[-2:], dtype=torch.bool).triu(1)
        if lm.is_causal:
            assert pattern[..., above].abs().max().item() == 0.0  # exactly 0, not merely small
        else:
            assert pattern[..., above].min().item() > 0.0


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_batched_with_padding_equals_one_prompt_at_a_time(arch, tiny_lm):
    lm = tiny_lm(arch)
    encoded = engine.encode(lm, PROMPTS)
    assert len({len(e) for e in encoded}) == 3
    from anatomy_cli.engine.attention import batches

    # prompts of different lengths share a batch: it is padded
    assert any(len({len(encoded[i]) for i in b}) > 1 for b in batches([len(e) for e in encoded], 3))
    batched = engine.attention_patterns(lm, encoded, batch_size=3)
    for enc, pattern in zip(encoded, batched):
        [single] = engine.attention_patterns(lm, [enc])
        assert pattern.shape == single.shape == (lm.n_layers, lm.n_heads, len(enc), len(enc))
        torch.testing.assert_close(pattern, single, atol=1e-6, rtol=1e-5)


def test_batches_group_similar_lengths_longest_first():
    from anatomy_cli.engine.attention import batches

    assert batches([5, 9, 7], 3) == [[1, 2, 0]]
    assert batches([5, 201], 8) == [[1], [0]]  # heads PROMPT: 5 tokens are not padded to 201
    assert batches([10, 10, 10, 10, 3], 2) == [[0, 1], [2, 3], [4]]
    assert batches([4], 0) == [[0]]


def test_reduce_keeps_only_what_it_returns_and_layers_select(tiny_lm):
    lm = tiny_lm("gpt2")
    enc = engine.encode(lm, PROMPTS[:1])
    [full] = engine.attention_patterns(lm, enc)
    seen = []
    [last_row] = engine.attention_patterns(lm, enc, layers=[1], reduce=lambda i, l, p: seen.append((i, l)) or p[:, -1])
    assert seen == [(0, 1)] and last_row.shape == (1, lm.n_heads, len(enc[0]))
    torch.testing.assert_close(last_row[0], full[1, :, -1])
    with pytest.raises(Exception, match="layer 2 is out of range"):
        engine.attention_patterns(lm, enc, layers=[2])


# ---------------------------------------------------------------- CLI

def invoke(*args):
    return runner.invoke(app, list(args))


@pytest.mark.usefixtures("cached_load")
def test_one_head_json_is_the_long_form_of_the_engine_pattern(tiny_model_dir, tiny_lm):
    result = invoke("attn", PROMPTS[0], "-m", str(tiny_model_dir("gpt2")), "--device", "cpu",
                    "--layer", "1", "--head", "-1", "-f", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    lm = tiny_lm("gpt2")
    [want] = engine.attention_patterns(lm, engine.encode(lm, [PROMPTS[0]]))
    n = len(data["tokens"])
    assert (data["layers"], data["heads"], data["query_positions"]) == ([1], [3], list(range(n)))
    assert len(data["weights"]) == n * (n + 1) // 2  # causal: keys after the query are left out
    first = data["weights"][0]
    assert list(first) == ["layer", "head", "query_position", "key_position", "query_token", "key_token", "weight"]
    for w in data["weights"]:
        assert w["key_position"] <= w["query_position"]
        assert w["query_token"] == data["tokens"][w["query_position"]]
        assert w["key_token"] == data["tokens"][w["key_position"]]
        assert w["weight"] == pytest.approx(want[1, 3, w["query_position"], w["key_position"]].item(), abs=1e-7)
    for q in range(n):
        assert sum(w["weight"] for w in data["weights"] if w["query_position"] == q) == pytest.approx(1, abs=1e-5)


@pytest.mark.usefixtures("cached_load")
def test_every_layer_tsv_and_encoder_default_query(tiny_model_dir):
    result = invoke("attn", "The cat sat", "-m", str(tiny_model_dir("bert")), "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split("\t") == ["layer", "head", "query_position", "key_position", "query_token", "key_token",
                                    "weight"]
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == 2 * 4 * 5  # layers x heads x keys ([CLS] the cat sat [SEP]: bidirectional)
    assert {r[2] for r in rows} == {"3"} and {r[4] for r in rows} == {"sat"}  # the last token before [SEP]


@pytest.mark.usefixtures("cached_load")
def test_table_is_a_matrix_when_it_fits_and_top_keys_when_not(tiny_model_dir, monkeypatch):
    args = ["attn", PROMPTS[0], "-m", str(tiny_model_dir("gpt2")), "--device", "cpu", "--layer", "0", "-f", "table"]
    monkeypatch.setenv("COLUMNS", "120")
    wide = invoke(*args)
    assert wide.exit_code == 0, wide.stderr
    assert "·mat" in wide.stdout and "top 3 keys" not in wide.stdout
    monkeypatch.setenv("COLUMNS", "50")
    narrow = invoke(*args, "--k", "2")
    assert narrow.exit_code == 0, narrow.stderr
    assert "top 2 keys" in narrow.stdout


@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("args, message", [
    (["--layer", "2"], "--layer 2 is out of range: this model has blocks 0..1 (negative counts from the last)"),
    (["--layer", "-3"], "--layer -3 is out of range"),
    (["--layer", "0", "--head", "4"], "--head 4 is out of range: {m} has 4 heads per layer (use 0..3"),
    (["--head", "1"], "--head needs --layer"),
    (["--position", "6"], "--position 6 is out of range: the prompt has 6 tokens (use 0..5"),
])
def test_out_of_range_is_a_usage_error_with_the_valid_range(args, message, tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("attn", PROMPTS[0], "-m", model, "--device", "cpu", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: " + message.format(m=model)), result.stderr


def test_layer_out_of_range_fails_before_the_weights_load(tiny_model_dir, monkeypatch):

    load_module = importlib.import_module("anatomy_cli.engine.loading")

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(load_module, "_load_weights", no_weights)
    result = invoke("attn", PROMPTS[0], "-m", str(tiny_model_dir("gpt2")), "--device", "cpu", "--layer", "7")
    assert result.exit_code == 2, result.stderr
    assert "--layer 7 is out of range" in result.stderr


@pytest.mark.usefixtures("cached_load")
def test_prompt_too_long_is_the_same_error_as_trace(tiny_model_dir):
    long = " ".join(["word"] * 80)  # the tiny models take 64 tokens
    model = str(tiny_model_dir("gpt2"))
    errors = [invoke(cmd, long, "-m", model, "--device", "cpu") for cmd in ("attn", "trace")]
    assert [r.exit_code for r in errors] == [2, 2]
    assert errors[0].stderr == errors[1].stderr and "takes at most 64" in errors[0].stderr
