"""Target and foil tokens (`anatomy_cli.text.targets`): one token, its id, the leading-space note, --first-token.

GPT-2 facts used below (the real tokenizer): ' much' 881, 'much' 29482, ' Berlin' 11307,
'Berlin' = 'Ber' + 'lin' (24814, 2815), 'much more' = 29482 + 517.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError
from anatomy_cli.text import targets

runner = CliRunner()
PROMPT = "Thank you very"


def _resolve(lm, text=None, id=None, first_token=False, option="--target"):
    notes: list[str] = []
    wanted = targets.choice(text, id, option=option, first_token=first_token)
    return targets.resolve(lm, wanted, note=notes.append), notes


def test_one_token_and_the_leading_space_note(tiny_lm):
    lm = tiny_lm("gpt2")
    assert _resolve(lm, " much") == (881, [])
    # 'much' is a token of its own (mid-word), but the word after a space is ' much': a note says so.
    tid, notes = _resolve(lm, "much")
    assert tid == 29482
    assert notes == ["note: --target 'much' is much (29482), with no leading space; the word after a space is "
                     "·much (881): --target ' much'"]
    # The same rules work on the bare tokenizer (the before-weights check has no model yet).
    assert _resolve(lm.tokenizer, " Berlin")[0] == 11307
    assert targets.token_id(lm, " much") == 881  # the one-call form the ablate/patch commands use


def test_several_tokens_error_shows_the_split_and_the_spaced_version(tiny_lm):
    lm = tiny_lm("gpt2")
    with pytest.raises(UsageError) as info:
        _resolve(lm, "Berlin", option="--foil")
    assert str(info.value) == (
        f"--foil 'Berlin' is 2 tokens for {lm.name}: Ber + lin (ids 24814, 2815); ' Berlin' with its leading "
        "space is one token (·Berlin, id 11307), or --first-token to take the first")
    with pytest.raises(UsageError, match=r"'much more' is 2 tokens .*: much \+ ·more \(ids 29482, 517\); give "
                                         r"exactly one token, e\.g\. ' much' with its space, or --first-token"):
        _resolve(lm, "much more")


def test_first_token_takes_the_first_and_says_so(tiny_lm):
    lm = tiny_lm("gpt2")
    tid, notes = _resolve(lm, "Berlin", first_token=True)
    assert tid == 24814
    assert notes == ["note: --target 'Berlin' is 2 tokens (Ber + lin); --first-token takes Ber (24814); "
                     "' Berlin' would be one token (·Berlin, 11307)"]


def test_ids_and_bad_choices(tiny_lm):
    lm = tiny_lm("gpt2")
    assert _resolve(lm, id=881) == (881, [])
    assert _resolve(lm, id=50256)[0] == 50256
    with pytest.raises(UsageError, match=r"--target-id 50257 is outside .* vocabulary \(ids 0\.\.50256\)"):
        _resolve(lm, id=50257)
    assert targets.choice(None, None) is None
    with pytest.raises(UsageError, match="both --target and --target-id were given"):
        targets.choice(" much", 881)
    with pytest.raises(UsageError, match="--foil is empty"):
        targets.choice("", option="--foil")
    with pytest.raises(UsageError, match="negative"):
        targets.choice(None, -1)


def test_first_token_needs_a_text_to_apply_to():
    targets.check_first_token(False)
    targets.check_first_token(True, targets.choice(" much here", first_token=True))
    targets.check_first_token(True, None, targets.choice(" x", option="--foil"), options="--target or --foil")
    with pytest.raises(UsageError, match="^--first-token applies to a --target TEXT of several tokens, and none"):
        targets.check_first_token(True, None)
    with pytest.raises(UsageError, match="--target or --foil TEXT"):
        targets.check_first_token(True, targets.choice(None, 881), None, options="--target or --foil")


@pytest.mark.parametrize("command", ["next", "trace", "lens", "dla", "ablate", "patch"])
def test_first_token_alone_is_a_usage_error_before_any_load(command):
    # dla, ablate and patch need a token: give it by id, which --first-token cannot apply to either
    extra = {"patch": ["x", "--target-id", "5"], "dla": ["--target-id", "5"], "ablate": ["--target-id", "5"]}
    result = runner.invoke(app, [command, "Thank you very", *extra.get(command, []), "--first-token",
                                 "--model", "gpt2"])  # nothing loads: the check comes first
    assert result.exit_code == 2 and result.stderr.startswith("error: --first-token applies to a --target")
    assert result.stderr.count("\n") == 1
    help_text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
    assert ("--foil TEXT of several tokens" in help_text) == (command in ("dla", "ablate", "patch"))


def test_encoder_targets_leave_out_cls_and_sep(tiny_lm):
    lm = tiny_lm("bert")
    tid, _ = _resolve(lm, "paris")
    assert lm.tokenizer.hf.convert_ids_to_tokens(tid) == "paris"


# ---------------------------------------------------------------- through the CLI

def invoke(*args):
    return runner.invoke(app, list(args))


@pytest.mark.usefixtures("cached_load")
def test_next_target_id_equals_target_text_and_notes_go_to_stderr(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    by_text = invoke("next", PROMPT, "--model", model, "--format", "json", "--target", " much")
    by_id = invoke("next", PROMPT, "--model", model, "--format", "json", "--target-id", "881")
    assert by_text.exit_code == 0 and by_id.exit_code == 0, by_id.stderr
    assert json.loads(by_text.stdout)["target"] == json.loads(by_id.stdout)["target"]
    assert json.loads(by_id.stdout)["target"]["token"] == "·much"
    spaced = invoke("next", PROMPT, "--model", model, "--format", "json", "--target", "much")
    assert spaced.exit_code == 0 and json.loads(spaced.stdout)["target"]["token_id"] == 29482
    assert "note: --target 'much' is much (29482)" in spaced.stderr and "note" not in spaced.stdout
    both = invoke("next", PROMPT, "--model", model, "--target", " much", "--target-id", "881")
    assert both.exit_code == 2 and "both --target and --target-id were given" in both.stderr


def test_a_bad_target_fails_before_the_weights_load(tiny_model_dir, tmp_path):
    # A directory with config and tokenizer but no weights: only a check made before the weight
    # load can answer with the target's error instead of a checkpoint error.
    import shutil

    src = tiny_model_dir("gpt2")
    for f in src.iterdir():
        if not f.name.endswith((".safetensors", ".bin")):
            shutil.copy(f, tmp_path / f.name)
    for args in (["next", PROMPT, "--target", "Berlin"], ["trace", PROMPT, "--target-id", "99999"],
                 ["lens", PROMPT, "--target", "much more"], ["dla", PROMPT, "--target", " much", "--foil", "Berlin"]):
        result = invoke(*args, "--model", str(tmp_path))
        assert result.exit_code == 2, (args, result.stderr)
        assert "--target" in result.stderr or "--foil" in result.stderr
