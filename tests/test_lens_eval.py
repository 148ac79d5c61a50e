"""`lens-eval ITEMS.json` (issue 48): jlens' lens evaluation, pass@1/5/10 per lens side by side, against an
independent reading on a tiny random LLaMA of 4 blocks: transformers' own ``hidden_states`` through the model's
final norm and LM head, the single-token forms from transformers' tokenizer as jlens builds them, ranks and pass@k
by hand."""

from __future__ import annotations

import json

import pytest
import torch
from test_fitted_lens import D
from test_fitted_lens import _save_jacobian
from test_fitted_lens import _save_tuned
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

runner = CliRunner()
BLOCKS = 4
PROMPTS = ["The capital of France is", "Thank you very", "One, two, three, four"]
COMMON = ["the", "paris", "much", "Five", "xqzvbnmkjhq"]  # the last has no single-token form


@pytest.fixture(scope="module")
def deep(tmp_path_factory, gpt2_tokenizer_dir):
    """``(directory, transformers model, tokenizer)``: a tiny random LLaMA of 4 blocks (3 below the last)."""
    import models
    import transformers

    kwargs = {**models.config_kwargs("llama"), "num_hidden_layers": BLOCKS}
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(gpt2_tokenizer_dir)
    out = tmp_path_factory.mktemp("deep-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, model, tok


def _forms(tok, word):
    """jlens' ``_single_token_ids``: the word, with a leading space, capitalised, both; one token each."""
    out = []
    for form in (word, f" {word}", word.capitalize(), f" {word.capitalize()}"):
        ids = tok.encode(form, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in out:
            out.append(ids[0])
    return out


def _readings(model, tok, prompt, blocks):
    """``[len(blocks), vocab]``: transformers' hidden_states[b + 1] (block b's raw output, b below the last) at the
    last token through the model's own final norm and LM head."""
    ids = tok(prompt, add_special_tokens=False).input_ids
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        h = torch.stack([hs[b + 1][0, -1] for b in blocks])
        return model.lm_head(model.model.norm(h)).float()


def _rank(logits, ids):
    """Best 1-based rank of ``ids`` over the rows: 1 + the number of strictly larger logits."""
    if not ids:
        return None
    return min(1 + int((row > row[t]).sum()) for row in logits for t in ids)


def _items(model, tok):
    """Per prompt the common words plus two words the reading ranks highly (so that pass@k is not all zeros)."""
    items = []
    for prompt in PROMPTS:
        logits = _readings(model, tok, prompt, range(BLOCKS - 1))
        near = []
        for t in logits[1].argsort(descending=True)[:40].tolist():
            word = tok.decode([t]).strip()
            if word.isalpha() and word.isascii() and word not in near:
                near.append(word)
        items.append({"prompt": prompt, "intermediates": [*near[:2], *COMMON[:3]], "other": 1})
    items[-1]["intermediates"].append(COMMON[3])
    items[0]["intermediates"].append(COMMON[4])
    return items


def _by_hand(model, tok, items, blocks):
    ranks = []
    for item in items:
        logits = _readings(model, tok, item["prompt"], blocks)
        ranks.append([_rank(logits, _forms(tok, w)) for w in item["intermediates"]])
    return ranks


def _pass_at(ranks, k):
    return sum(sum(r is not None and r <= k for r in item) / len(item) for item in ranks) / len(ranks)


def _run(path, model_dir, *args):
    res = runner.invoke(app, ["lens-eval", str(path), "--model", str(model_dir), "--no-bos", *args,
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res


def _write(tmp_path, items, name="items.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"items": items}), encoding="utf-8")
    return path


def test_ranks_and_pass_at_k_equal_an_independent_reading(deep, tmp_path):
    directory, model, tok = deep
    items = _items(model, tok)
    data, res = _run(_write(tmp_path, items), directory)
    expected = _by_hand(model, tok, items, range(BLOCKS - 1))
    got = [[w["rank"]["logit"] for w in item["intermediates"]] for item in data["items"]]
    assert got == expected
    assert [[w["token_ids"] for w in item["intermediates"]] for item in data["items"]] == [
        [_forms(tok, w) for w in item["intermediates"]] for item in items]
    (lens,) = data["lenses"]
    assert lens["lens"] == "logit" and lens["blocks"] == [0, 1, 2]
    for k in (1, 5, 10):
        assert lens[f"pass_at_{k}"] == pytest.approx(_pass_at(expected, k), abs=1e-12)
    assert _pass_at(expected, 10) > 0  # the test reads hits, not only misses
    assert data["set"] == "items" and data["n_items"] == 3 and data["no_single_token"] == ["xqzvbnmkjhq"]
    assert [item["position"] for item in data["items"]] == [
        len(tok(p, add_special_tokens=False).input_ids) - 1 for p in PROMPTS]
    assert "1 of " in res.stderr and "'xqzvbnmkjhq'" in res.stderr and "count as misses" in res.stderr
    # the block reported is one where the best rank is reached (the first such)
    for item, got_item in zip(items, data["items"]):
        logits = _readings(model, tok, item["prompt"], range(BLOCKS - 1))
        for w, g in zip(item["intermediates"], got_item["intermediates"]):
            if g["block"]["logit"] is not None:
                assert _rank(logits[g["block"]["logit"]:g["block"]["logit"] + 1], _forms(tok, w)) == g["rank"]["logit"]


def test_an_identity_jacobian_and_zero_translators_read_exactly_the_logit_lens(deep, tmp_path):
    directory, model, tok = deep
    items = _items(model, tok)
    eye = _save_jacobian(tmp_path / "eye.pt", {b: torch.eye(D) for b in range(BLOCKS - 1)})
    zero = _save_tuned(tmp_path / "zero", [torch.zeros(D, D)] * BLOCKS, [torch.zeros(D)] * BLOCKS, layers=BLOCKS)
    data, _ = _run(_write(tmp_path, items), directory, "--lens", "logit", "--lens", f"jacobian:{eye}",
                   "--lens", f"tuned:{zero}")
    assert [lens["label"] for lens in data["lenses"]] == ["logit", "jacobian", "tuned"]
    first, *others = data["lenses"]
    for lens in others:
        assert lens["blocks"] == first["blocks"] == [0, 1, 2]
        assert [lens[f"pass_at_{k}"] for k in (1, 5, 10)] == [first[f"pass_at_{k}"] for k in (1, 5, 10)]
    for item in data["items"]:
        for w in item["intermediates"]:
            assert w["rank"]["jacobian"] == w["rank"]["tuned"] == w["rank"]["logit"]
            assert w["block"]["jacobian"] == w["block"]["tuned"] == w["block"]["logit"]


def test_a_jacobian_lens_reads_its_fitted_blocks_only(deep, tmp_path):
    directory, model, tok = deep
    items = _items(model, tok)
    torch.manual_seed(3)
    jac = {1: torch.randn(D, D) / D ** 0.5, 2: torch.randn(D, D) / D ** 0.5, BLOCKS - 1: torch.eye(D)}
    path = _save_jacobian(tmp_path / "j.pt", jac, dtype=torch.float32)
    data, _ = _run(_write(tmp_path, items), directory, "--lens", f"jacobian:{path}", "--lens", "logit")
    assert [lens["blocks"] for lens in data["lenses"]] == [[1, 2], [0, 1, 2]]  # the last block: never read
    for item, got in zip(items, data["items"]):
        ids = tok(item["prompt"], add_special_tokens=False).input_ids
        with torch.no_grad():
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            h = torch.stack([jac[b] @ hs[b + 1][0, -1] for b in (1, 2)])
            logits = model.lm_head(model.model.norm(h)).float()
        assert [w["rank"]["jacobian"] for w in got["intermediates"]] == [
            _rank(logits, _forms(tok, w)) for w in item["intermediates"]]


def test_the_api_returns_the_commands_json_and_a_poetry_set_reads_at_the_last_newline(deep, tmp_path):
    directory, model, tok = deep
    items = [{"prompt": "Roses are red,\nviolets are", "intermediates": ["blue", "the"]}]
    lm = api.load(str(directory), device="cpu")
    result = api.lens_eval(lm, {"items": items, "name": "poetry-set"}, lens="logit",
                           prompts=api.PromptOptions(bos=False))
    ids = tok(items[0]["prompt"], add_special_tokens=False).input_ids
    newline = max(i for i, t in enumerate(ids) if "\n" in tok.decode([t]))
    assert result.result.items[0].position == newline < len(ids) - 1
    assert result.result.pass_at(0, 10) == result.to_dict()["lenses"][0]["pass_at_10"]
    plain, _ = _run(_write(tmp_path, items), directory)
    assert plain["items"][0]["position"] == len(ids) - 1  # any other set: the last token
    poetry, _ = _run(_write(tmp_path, items, "poetry.json"), directory)
    assert poetry["items"][0]["position"] == newline and poetry["set"] == "poetry"


def test_tsv_gives_pass_at_k_per_lens_then_every_intermediate(deep, tmp_path):
    directory, model, tok = deep
    path = _write(tmp_path, [{"prompt": PROMPTS[0], "intermediates": ["paris", "xqzvbnmkjhq"]},
                             {"prompt": PROMPTS[1], "intermediates": []}])
    res = runner.invoke(app, ["lens-eval", str(path), "--model", str(directory), "--format", "tsv"])
    assert res.exit_code == 0, res.output
    summary, words = res.stdout.rstrip("\n").split("\n\n")
    assert summary.splitlines()[0].split("\t") == ["lens", "source", "blocks", "pass_at_1", "pass_at_5", "pass_at_10"]
    assert summary.splitlines()[1].split("\t")[:3] == ["logit", "logit", "0-2"]
    header, *rows = words.splitlines()
    assert header.split("\t") == ["item", "word", "forms", "rank_logit", "block_logit"]
    assert [r.split("\t")[1] for r in rows] == ["paris", "xqzvbnmkjhq"]
    assert rows[1].split("\t")[2:] == ["", "", ""]  # no form: no rank, no block
    assert "1 of 2 items have no intermediates: not scored" in res.stderr


BAD = {
    "not json": ("{items: [", "is not JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    "no items key": ('{"prompts": []}', 'expected {"items": [{"prompt": ..., "intermediates": [...]}, ...]}'),
    "a list": ("[]", 'expected {"items"'),
    "empty items": ('{"items": []}', '"items" is empty: nothing to evaluate'),
    "no prompt": ('{"items": [{"intermediates": ["a"]}]}', 'item 1 has no "prompt"'),
    "no intermediates": ('{"items": [{"prompt": "a", "intermediates": ["x"]}, {"prompt": "b"}]}',
                         'item 2 has no "intermediates"'),
    "a number": ('{"items": [3]}', "item 1 is a int, not an object"),
    "empty prompt": ('{"items": [{"prompt": "", "intermediates": ["a"]}]}', '"prompt" must be a non-empty text'),
    "words not a list": ('{"items": [{"prompt": "a", "intermediates": "a"}]}', "must be a list of non-empty texts"),
    "nothing to score": ('{"items": [{"prompt": "a", "intermediates": []}]}', "no item has intermediates"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_items_are_one_line_usage_errors(case, tiny_model_dir, tmp_path):
    text, message = BAD[case]
    path = tmp_path / "items.json"
    path.write_text(text, encoding="utf-8")
    res = runner.invoke(app, ["lens-eval", str(path), "--model", str(tiny_model_dir("llama"))])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr


def test_bad_lenses_and_files_are_usage_errors(tiny_model_dir, tmp_path):
    path = _write(tmp_path, [{"prompt": "a b", "intermediates": ["b"]}])
    model = str(tiny_model_dir("llama"))
    cases = {("--lens", "logit", "--lens", "logit"): "--lens logit is given twice",
             ("--lens", "jacobian:/nope.pt"): "/nope.pt does not exist",
             ("--lens", "fancy"): "use logit, tuned:DIR"}
    for args, message in cases.items():
        res = runner.invoke(app, ["lens-eval", str(path), "--model", model, *args])
        assert res.exit_code == 2 and message in res.stderr, (args, res.output)
    res = runner.invoke(app, ["lens-eval", str(tmp_path / "missing.json"), "--model", model])
    assert res.exit_code == 2 and "missing.json does not exist" in res.stderr, res.output
    last_only = _save_jacobian(tmp_path / "last.pt", {1: torch.eye(D)})  # the tiny model's last block
    res = runner.invoke(app, ["lens-eval", str(path), "--model", model, "--lens", f"jacobian:{last_only}"])
    assert res.exit_code == 2 and "reads no block below the last" in res.stderr, res.output
    with pytest.raises(UsageError, match="given twice"):
        api.lens_eval(str(tiny_model_dir("llama")), str(path), lens=["logit", "logit"])


def test_no_item_with_intermediates_is_refused_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    # On a GGUF model this once reached the encoder with no prompt (IndexError); the options refuse it now.
    from anatomy_cli.engine import loader

    monkeypatch.setattr(loader.DIRECT, "load_weights", lambda opened: pytest.fail("weights loaded"))
    path = _write(tmp_path, [{"prompt": "Hi", "intermediates": []}])
    res = runner.invoke(app, ["lens-eval", str(path), "--model", str(tiny_model_dir("llama"))])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == "error: items: no item has intermediates: nothing to evaluate", res.stderr
