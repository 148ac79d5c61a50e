"""One rule for blank prompts (issue 42, item 7): a PROMPT that is empty or only whitespace is a usage error
with one message, on every command that reads prompts (they all read them through text.inputs.read_prompts),
as stdin's blank lines are skipped."""

from __future__ import annotations

import io

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError
from anatomy_cli.text.inputs import read_prompts

MESSAGE = "error: empty prompt: give some text (or '-' to read prompts from stdin)"


@pytest.mark.parametrize("prompt", ["", " ", "   ", "\t\n"])
def test_a_blank_prompt_is_refused(prompt):
    with pytest.raises(UsageError, match="^empty prompt"):
        read_prompts(prompt)


def test_text_with_spaces_keeps_them():
    assert read_prompts("  a  ") == ["  a  "]
    assert read_prompts("-", stdin=io.BytesIO(b"   \n b \n")) == [" b "]


@pytest.mark.parametrize("command", ["next", "trace"])
@pytest.mark.parametrize("prompt", ["", "   "])
def test_commands_refuse_a_blank_prompt(command, prompt, tiny_model_dir):
    result = CliRunner().invoke(app, [command, prompt, "--model", str(tiny_model_dir("gpt2"))])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [MESSAGE]
