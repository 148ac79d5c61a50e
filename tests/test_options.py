"""One name per option across commands, hidden aliases for the old spellings, and `git`-like suggestions
for a mistyped option (issue 32, item 2)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli import app as app_module
from anatomy_cli.cli.main import app

runner = CliRunner()


def _command():
    command = app_module.click_command()
    app_module._hide_aliases(command)
    return command


def test_each_short_option_has_one_long_name_in_every_command():
    shown = defaultdict(set)
    for sub in _command().commands.values():
        for param in sub.params:
            if param.param_type_name == "option" and not param.hidden:
                longs = [o for o in param.opts if o.startswith("--")]
                for short in (o for o in param.opts if not o.startswith("--")):
                    shown[short].add(longs[0])
    assert {s: names for s, names in shown.items() if len(names) > 1} == {}
    assert shown["-k"] == {"--top"}  # next, trace, lens, attn, heads, dla: how many of the best to show


@pytest.mark.parametrize("command", ["next", "trace", "lens", "attn", "heads", "dla"])
def test_help_shows_top_and_not_the_old_spellings(command):
    text = runner.invoke(app, [command, "--help"]).stdout
    assert "-k, --top N" in text
    assert "--k " not in text and "-n, " not in text and ", -n" not in text


@pytest.mark.parametrize(("command", "args"), [("next", ["--k", "3"]), ("next", ["-k", "3"]), ("next", ["--top", "3"]),
                                               ("trace", ["--k", "3"]), ("lens", ["--k", "3"]), ("attn", ["--k", "3"]),
                                               ("heads", ["-n", "3"]), ("heads", ["--top", "3"])])
def test_old_spellings_still_parse(command, args):
    sub = _command().commands[command]
    prompt = [] if command == "heads" else ["hi"]
    ctx = sub.make_context(command, [*prompt, *args])
    assert ctx.params["k" if command != "heads" else "top"] == 3


@pytest.mark.usefixtures("cached_load")
def test_next_top_gives_what_k_gives(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    outs = [runner.invoke(app, ["next", "Thank you very", "-m", model, "--format", "tsv", *k]) for k in
            (["--top", "3"], ["--k", "3"])]
    assert outs[0].exit_code == 0, outs[0].stderr
    assert outs[0].stdout == outs[1].stdout and len(outs[0].stdout.splitlines()) == 4


@pytest.mark.parametrize(("typed", "meant"), [("--topp", "--top"), ("--kk", "--top"), ("--dtyp", "--dtype"),
                                              ("--targe", "--target")])
def test_a_mistyped_option_suggests_the_name_it_resembles(typed, meant):
    result = runner.invoke(app, ["next", "hi", typed, "3"])
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: No such option: {typed} (did you mean {meant}")
    assert "Possible options" not in first


def test_suggestions_compare_names_without_their_dashes():
    sub = _command().commands["next"]
    assert app_module.suggest_options("--tp", sub) == ["--top"]
    assert "--bos" not in app_module.suggest_options("--top", _command().commands["drift"])  # drift has no --top
    assert app_module.suggest_options("--zzzzzz", sub) == []
    assert app_module.suggest_options("--pos", _command().commands["trace"])[0] == "--position"
