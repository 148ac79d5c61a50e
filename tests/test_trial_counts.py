"""What a new user's trial found in the output (misc69, task 6): "1 steps" and "2977 tokens" (counts are written
by one rule, :func:`anatomy_cli.units.counted`: the noun singular for 1, a thousands separator), an empty
`circuit` / `sae` PROMPT refused only after the dictionary's model line and the model's open, and `--ctx` past the
model's context refused by fit-sae as a --max-tokens budget. Each refusal: exit 2, one `error:` line, and nothing
opened, loaded or costed (the loader, the dictionary readers and the cost functions fail the test if called)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.units import counted

EMPTY = "error: empty prompt: give some text (or '-' to read prompts from stdin)"


def _fail(what):
    def called(*args, **kwargs):
        raise AssertionError(f"{what} was called")
    return called


def test_counts_have_one_rule():
    assert [counted(n, "step") for n in (0, 1, 2, 2977)] == ["0 steps", "1 step", "2 steps", "2,977 steps"]


def test_tokens_counts_its_text_with_separators(tiny_model_dir):
    """`tokens`' summary: the counts are transformers' own tokenizer's and the text's, written by counted."""
    from transformers import AutoTokenizer

    model = tiny_model_dir("gpt2")
    text = "The quick brown fox jumps over the lazy dog. " * 120
    n = len(AutoTokenizer.from_pretrained(model)(text)["input_ids"])
    assert n > 1000
    res = CliRunner().invoke(app, ["tokens", text, "--model", str(model)])
    assert res.exit_code == 0, res.output
    assert f"{n:,} tokens, {len(text):,} characters, {len(text.encode()):,} bytes" in res.stderr, res.stderr
    res = CliRunner().invoke(app, ["tokens", "Hi", "--model", str(model)])
    assert "1 token, 2 characters, 2 bytes" in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["circuit", "sae"])
def test_an_empty_prompt_is_refused_before_anything_is_read(command, tmp_path, monkeypatch):
    from anatomy_cli.models import ct_block
    from anatomy_cli.models import transcoders
    from anatomy_cli.tasks import recorded_model
    from anatomy_cli.tasks import session

    for module, name in ((session, "open_model"), (session, "load_weights"), (recorded_model, "named_model"),
                         (recorded_model, "describe"), (transcoders, "describe"), (ct_block, "read_dictionary")):
        monkeypatch.setattr(module, name, _fail(name))
    folder = "--transcoders" if command == "circuit" else "--sae"
    res = CliRunner().invoke(app, [command, "", folder, str(tmp_path)])  # a folder: the options take it
    assert res.exit_code == 2 and res.stderr.splitlines() == [EMPTY], res.output
    assert res.stdout == ""


def _config_ctx(model) -> int:
    return json.loads((model / "config.json").read_text())["n_positions"]


def test_fit_sae_refuses_a_ctx_past_the_context_before_the_budget(tiny_model_dir, tmp_path, monkeypatch):
    """Default --max-tokens under two --ctx 100000 windows: the context is the reason, said before the corpus is
    tokenized, anything is costed or the weights load."""
    from anatomy_cli.tasks import fit_sae
    from anatomy_cli.tasks import session

    for module, name in ((session, "load_weights"), (fit_sae, "windows"), (fit_sae, "estimate")):
        monkeypatch.setattr(module, name, _fail(name))
    model = tiny_model_dir("gpt2")
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat. " * 20)
    res = CliRunner().invoke(app, ["fit-sae", str(corpus), "--model", str(model), "--out", str(tmp_path / "o"),
                                   "--layer", "0", "--ctx", "100000"])
    n_ctx = _config_ctx(model)
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [f"error: --ctx 100000 is more than {model}'s context of {n_ctx} tokens"]


def test_features_refuses_a_ctx_past_the_context_before_the_cost(tiny_model_dir, tmp_path, monkeypatch):
    from test_features import TEXT
    from test_features import write_sae

    from anatomy_cli.tasks import _features_run

    for name in ("load_weights", "estimate", "cost_line", "_pass"):
        monkeypatch.setattr(_features_run, name, _fail(name))
    model = tiny_model_dir("gpt2")
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    res = CliRunner().invoke(app, ["features", str(write_sae(tmp_path / "sae")), "--corpus", str(corpus), "--model",
                                   str(model), "--ctx", "100000"])
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [f"error: --ctx 100000 is more than {model}'s context of {_config_ctx(model)} "
                                       "tokens"]


def test_circuit_takes_no_ctx(tmp_path):
    """circuit reads one prompt, never windows of a corpus: --ctx is no option of it (a usage error, exit 2)."""
    res = CliRunner().invoke(app, ["circuit", "Hi there", "--transcoders", str(tmp_path), "--ctx", "100000"])
    assert res.exit_code == 2 and "No such option: --ctx" in res.output, res.output
