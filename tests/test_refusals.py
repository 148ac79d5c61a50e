"""The encoder refusal is one sentence (issue 47): the same from every command that needs a decoder and from
the Python API, made before any weight loads.

The sentence is :func:`anatomy_cli.models.capabilities.refusal` for ``Need.decoder``; the model is a tiny random
RoBERTa (tests/models.py, with its masked-LM head: an encoder that has an LM head, so the decoder need is the one
it lacks).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

PROMPT = "Hello world"

# command -> its arguments after the model (the model is given as -m/--model, diff's as its two arguments)
COMMANDS = {
    "next": [PROMPT],
    "generate": [PROMPT, "--max-new-tokens", "2"],
    "steer": ["--positive", "good", "--negative", "bad", "--layer", "0"],
    "ablate": [PROMPT, "--target", " world"],
    "patch": [PROMPT, "Hello there", "--target", " world"],
    "attribute": [PROMPT, "--target", " world"],
    "dla": [PROMPT, "--target", " world"],
    "diff": [PROMPT],
}


@pytest.fixture(scope="module")
def roberta(tiny_model_dir):
    return str(tiny_model_dir("roberta"))


@pytest.fixture(scope="module")
def info(roberta):
    from anatomy_cli import engine
    from anatomy_cli.models.spec import ModelSpec

    return engine.open_model(ModelSpec(model=roberta)).info


def sentence(info, command: str) -> str:
    from anatomy_cli.models.capabilities import Need
    from anatomy_cli.models.capabilities import refusal

    return refusal(info, Need.decoder, command)


class NoWeights:
    """A loader that opens as the files say and fails the test if any weights are asked for."""

    def open(self, spec):
        from anatomy_cli.engine.loader import DIRECT

        return DIRECT.open(spec)

    def load_weights(self, opened):
        raise AssertionError(f"weights of {opened.spec.model} loaded before the refusal")


def test_the_sentence_names_the_model_the_family_and_the_command(info):
    text = sentence(info, "dla")
    assert "is an encoder (roberta)" in text and "`dla` needs a decoder-only model" in text
    assert text.count(". ") == 0 and "\n" not in text  # one sentence


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_an_encoder_in_the_same_words_before_loading(command, roberta, info, tmp_path,
                                                                           monkeypatch):
    from anatomy_cli.engine.loader import using_loader

    monkeypatch.chdir(tmp_path)  # steer may write its vector next to the cwd
    args = [command, roberta, roberta, *COMMANDS[command]] if command == "diff" else \
        [command, *COMMANDS[command], "--model", roberta]
    with using_loader(NoWeights()):
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (args, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {sentence(info, command)}"], result.stderr


API_CALLS = {
    "next": lambda api, m: api.next_token(m, PROMPT),
    "generate": lambda api, m: api.generate(m, PROMPT, max_new_tokens=2),
    "steer": lambda api, m: api.steer(m, positive=["good"], negative=["bad"], layer=0),
    "ablate": lambda api, m: api.ablate(m, PROMPT, target=" world"),
    "patch": lambda api, m: api.patch(m, PROMPT, "Hello there", target=" world"),
    "attribute": lambda api, m: api.attribute(m, PROMPT, target=" world"),
    "dla": lambda api, m: api.dla(m, PROMPT, target=" world"),
}


@pytest.mark.parametrize("command", API_CALLS)
def test_the_api_refuses_in_the_same_words(command, roberta, info, tiny_lm):
    import anatomy_cli as anatomy
    from anatomy_cli.errors import UsageError

    with pytest.raises(UsageError) as raised:
        API_CALLS[command](anatomy, tiny_lm("roberta"))
    assert str(raised.value) == sentence(info, command)
