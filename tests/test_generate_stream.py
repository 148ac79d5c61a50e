"""`generate` streams its tokens on a terminal (issue 51 item 11): the status line on stderr shows the token
count and the continuation so far as it comes; stdout, piped or JSON, is what it was."""

from __future__ import annotations

import json

from terminal import ANSI
from terminal import on_terminal
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.output.sink import with_tail


def test_generate_streams_its_tokens_on_the_status_line(tiny_model_dir, cached_load, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    args = ["generate", "The cat sat on the", "--model", str(tiny_model_dir("gpt2")), "--max-new-tokens", "6",
            "--format", "json"]
    piped = CliRunner().invoke(app, args)
    assert piped.exit_code == 0, piped.output
    assert "tokens" not in piped.stderr  # piped: no status line at all
    stdout, drawn = on_terminal(args, monkeypatch)
    drawn = ANSI.sub("", drawn)
    assert stdout == piped.stdout  # the result is unchanged on a terminal
    text = json.loads(stdout)["continuation"]
    assert len(json.loads(stdout)["generated_ids"]) == 6
    assert "generating (1/1): 6/6 tokens · " in drawn  # the count, then the text so far
    shown = text.replace("\r", "").replace("\n", "⏎").lstrip("\ufffd")
    assert shown[-12:] in drawn  # the continuation as it stands after the last token


def test_forced_status_lines_carry_the_text_off_a_terminal(tiny_model_dir, cached_load):
    args = ["generate", "The cat sat on the", "--model", str(tiny_model_dir("gpt2")), "--max-new-tokens", "4",
            "--format", "json"]
    quiet = CliRunner().invoke(app, args)
    shown = CliRunner().invoke(app, args, env={"ANATOMY_STATUS": "1", "COLUMNS": "200"})
    assert quiet.stdout == shown.stdout
    last = [line for line in shown.stderr.splitlines() if line.startswith("generating (1/1): 4/4 tokens")]
    text = json.loads(shown.stdout)["continuation"].replace("\n", "⏎").lstrip("\ufffd")
    assert last and last[-1].endswith(text[-12:])


def test_a_long_continuation_keeps_its_end_within_the_width():
    line = with_tail("generating (1/1): 90/100 tokens · ETA 0:01", "word " * 40, width=80)
    assert len(line) <= 80 - 6 + 4 and line.endswith("word ")
    assert "…" in line
    assert with_tail("g: 1/2 tokens", "a\nb", width=80) == "g: 1/2 tokens · a⏎b"
