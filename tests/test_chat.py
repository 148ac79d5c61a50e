"""`--chat` (issue 42 item 7): each prompt wrapped in the tokenizer's chat template, one rule for every command."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.text import chat
from anatomy_cli.text.options import PromptOptions

runner = CliRunner()
QUESTION = "What is the capital of France?"


def _template_ids(hf, text):
    got = hf.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(got["input_ids"] if hasattr(got, "keys") else got)


def test_chat_ids_are_the_templates_own_on_smollm2(smollm2_lm):
    tokenizer = smollm2_lm.tokenizer  # the GGUF's tokenizer.chat_template, carried by transformers' GGUF tokenizer
    for text in (QUESTION, "<|im_end|> twice\nand a new line"):
        (enc,) = chat.encode(tokenizer, [text], PromptOptions(chat=True), "smollm2")
        assert enc.ids == _template_ids(tokenizer.hf, text)
        assert enc.pieces[0] == "<|im_start|>" and enc.special[0]
        assert enc.bos_source == chat.SOURCE
    (plain,) = chat.encode(tokenizer, [QUESTION], PromptOptions(), "smollm2")
    assert plain.ids == tokenizer.hf(QUESTION, add_special_tokens=False)["input_ids"]


def test_next_with_chat_runs_the_wrapped_prompt(smollm2_lm, fixed_load):
    fixed_load(smollm2_lm)
    result = runner.invoke(app, ["next", QUESTION, "--model", "smollm2", "--chat", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["token_ids"] == _template_ids(smollm2_lm.tokenizer.hf, QUESTION)


def test_a_model_without_a_template_is_one_line(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = runner.invoke(app, ["next", QUESTION, "--model", model, "--chat"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and "has no chat template" in result.stderr and "--chat" in result.stderr
