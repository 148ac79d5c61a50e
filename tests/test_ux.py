"""Issue 14, what a new user and public bug reports found: output encodings, special tokens, SentencePiece
pieces, fail-fast checks, status line, narrow terminals, CJK words, help text, small things.

CLI tests run in-process on the tiny random GPT-2 (``cached_load``); values are checked against the
tokenizer, tiktoken or a UTF-8 run, never against the code's own output alone.
"""

from __future__ import annotations

import io
import json
import logging
import re
import shlex

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

PLAIN_ENDOFTEXT = [64, 27, 91, 437, 1659, 5239, 91, 29, 65]  # 'a<|endoftext|>b' as text (tiktoken gpt2)
PROMPT = "café ↵\nnaïve"  # non-ASCII letters, a symbol, and a newline token shown as ↵


def invoke(*args, charset="utf-8", env=None):
    return CliRunner(charset=charset).invoke(app, [str(a) for a in args], env=env)


@pytest.fixture
def gpt2_dir(tiny_model_dir, cached_load, tiktoken_cache):
    return str(tiny_model_dir("gpt2"))


# ---- 1. output encodings: every command on an ascii stdout -------------------------------------------------

# One entry per command: its arguments after the command name ({m} = the tiny GPT-2 directory). A new
# command gets a line here; the test runs it in every format on an ascii stdout and on a UTF-8 one.
COMMANDS = {
    "tokens": ["tokens", PROMPT],
    "tokens-hf": ["tokens", PROMPT, "--model", "{m}"],
    "layernorm": ["layernorm", "1", "2", "4", "--gamma", "1,2,3"],
    "params": ["params", "{m}"],
    "trace": ["trace", PROMPT, "-m", "{m}", "-k", "20"],
    "next": ["next", PROMPT, "-m", "{m}", "-k", "50"],
    "drift": ["drift", "café", "-c", "un café ↵ noir", "-c", "le café au lait", "-m", "{m}"],
    "attn": ["attn", PROMPT, "-m", "{m}", "--layer", "0", "--head", "0"],
    "heads": ["heads", PROMPT, "-m", "{m}", "--seq-len", "8"],
    "lens": ["lens", PROMPT, "-m", "{m}"],
    "dla": ["dla", PROMPT, "-m", "{m}", "--target", " the"],
    "ablate": ["ablate", PROMPT, "-m", "{m}", "--target", " the"],
    "patch": ["patch", "The cat ↵\nnaïve", "The dog ↵\nnaïve", "-m", "{m}", "--target", " the"],
}


def _args(name, gpt2_dir):
    return [a.replace("{m}", gpt2_dir) for a in COMMANDS[name]]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_on_an_ascii_stdout(name, gpt2_dir):
    args = _args(name, gpt2_dir)
    if args[0] not in {c.name for c in app.registered_commands}:
        pytest.skip(f"no {args[0]} command")
    for fmt in ("json", "table", "tsv", "csv"):
        result = invoke(*args, "--format", fmt, charset="ascii")
        assert result.exit_code == 0, f"{fmt}: {result.stderr}"
        assert "internal error" not in result.stderr and result.stdout.isascii()
        if fmt == "table":
            continue
        utf8 = invoke(*args, "--format", fmt)
        if fmt == "json":  # the same document, with \u escapes
            assert json.loads(result.stdout) == json.loads(utf8.stdout)
        else:  # exactly the UTF-8 output with what ASCII lacks escaped (↵ -> \u21b5)
            assert result.stdout == utf8.stdout.encode("ascii", "backslashreplace").decode("ascii")


def test_escapes_are_exact_for_tokens(tiktoken_cache):
    result = invoke("tokens", "a\n😀 é", "--format", "tsv", charset="ascii")
    assert result.exit_code == 0 and result.stdout.isascii()
    rows = [line.split("\t") for line in result.stdout.splitlines()[1:]]
    assert rows[1][2] == "\\u21b5"  # the newline token
    assert rows[-1][2] == "\\xb7\\xe9"  # "·é": both outside ASCII, as Python escapes
    table = invoke("tokens", "a\n", "--format", "table", charset="ascii")
    assert table.exit_code == 0 and "\\u21b5" in table.stdout and table.stdout.isascii()
    cp1252 = CliRunner(charset="cp1252").invoke(app, ["tokens", "é↵", "--format", "csv"])
    assert cp1252.exit_code == 0 and "é" in cp1252.stdout  # cp1252 has é: not escaped


# ---- 2. special-token text: one rule everywhere; --bos keeps one BOS ----------------------------------------

@pytest.mark.parametrize("command", ["next", "trace"])
def test_special_token_text_is_plain_text_unless_allowed(command, gpt2_dir):
    plain = json.loads(invoke(command, "a<|endoftext|>b", "-m", gpt2_dir, "-f", "json").stdout)
    assert plain["token_ids"] == PLAIN_ENDOFTEXT
    tokens = json.loads(invoke("tokens", "a<|endoftext|>b", "-f", "json").stdout)
    assert plain["token_ids"] == [t["token_id"] for t in tokens["tokens"]]  # the same rule as `tokens`
    special = json.loads(invoke(command, "a<|endoftext|>b", "-m", gpt2_dir, "-f", "json", "--allow-special").stdout)
    assert special["token_ids"] == [64, 50256, 65]


def test_drift_reads_special_text_as_text(gpt2_dir):
    args = ["drift", "b", "-c", "a<|endoftext|> b", "-c", "c b", "-m", gpt2_dir, "-f", "json"]
    data = json.loads(invoke(*args).stdout)
    assert data["contexts"][0]["positions"] == [8]  # a < | end of text | > then ' b'
    allowed = json.loads(invoke(*args, "--allow-special").stdout)
    assert allowed["contexts"][0]["positions"] == [2]  # a <|endoftext|> ' b'


def test_bos_on_a_prompt_starting_with_bos_warns_and_keeps_one(gpt2_dir):
    result = invoke("next", "<|endoftext|>Hi", "-m", gpt2_dir, "--bos", "--allow-special", "-f", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["token_ids"] == [50256, 17250]
    assert result.stderr == ("warning: prompt already starts with the BOS token <|endoftext|>: "
                             "--bos adds no second one\n")
    once = invoke("next", "Hi", "-m", gpt2_dir, "--bos", "-f", "json")
    assert json.loads(once.stdout)["token_ids"] == [50256, 17250] and once.stderr == ""


# ---- 3. SentencePiece pieces --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sentencepiece_dir(tmp_path_factory):
    """A Llama-2-style tokenizer: ▁ for spaces, a prepended ▁, byte fallback for what is not in its vocabulary."""
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", "a", "b", "▁a", "▁b"]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁", "b")], byte_fallback=True,
                               unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    out = tmp_path_factory.mktemp("sp-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>") \
        .save_pretrained(out)
    return out


def test_sentencepiece_bare_space_piece_is_shown_as_itself(sentencepiece_dir):
    data = json.loads(invoke("tokens", "😀", "--model", sentencepiece_dir, "-f", "json").stdout)
    toks = data["tokens"]
    # HF maps the prepended ▁ onto the emoji (offsets (0, 1)); it is its own piece, covering no character.
    assert [t["token"] for t in toks] == ["·", "<f0>", "<9f>", "<98>", "<80>"]
    assert [(t["start"], t["end"]) for t in toks] == [(0, 0), (0, 1), (0, 1), (0, 1), (0, 1)]
    assert bytes.fromhex(" ".join(t["bytes"] for t in toks[1:])) == "😀".encode()
    inner = json.loads(invoke("tokens", "a 😀b", "--model", sentencepiece_dir, "-f", "json").stdout)["tokens"]
    assert [t["token"] for t in inner[:2]] == ["·a", "·"] and (inner[1]["start"], inner[1]["end"]) == (1, 2)


def test_engine_offsets_of_the_prepended_space_are_empty(sentencepiece_dir):
    from transformers import AutoTokenizer

    from anatomy_cli.text.tokenization import Tokenizer

    enc = Tokenizer(AutoTokenizer.from_pretrained(sentencepiece_dir)).encode(["😀"])[0]
    assert enc.offsets[0] == (0, 0) and enc.pieces[0] == "·" and b"".join(enc.token_bytes) == " 😀".encode()


# ---- 5. fail fast: arguments checked before any weight loads ------------------------------------------------

@pytest.fixture
def no_weights(monkeypatch, tiny_model_dir, tiktoken_cache):
    """engine.load for real (no cache) but weights must never load: the check has to come first."""
    import importlib

    load_module = importlib.import_module("anatomy_cli.engine.loading")

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(load_module, "_load_weights", refuse)
    return str(tiny_model_dir("gpt2"))


@pytest.mark.parametrize(("args", "message"), [
    (["trace", "Thank you very", "--position", "99"],
     "error: --position 99 is out of range: the prompt has 3 tokens (use 0..2, or -3..-1 from the end)"),
    (["trace", "Hi", "--position", "-2"],
     "error: --position -2 is out of range: the prompt has 1 token (use 0..0, or -1..-1 from the end)"),
    (["next", "Thank you very", "--target", "much more"], "error: --target 'much more' is 2 tokens"),
    (["drift", "bank", "-c", "the bank", "-c", "a bank", "--matrix", "99"], "error: --matrix 99 is out of range: this model has blocks 0..1"),
    (["drift", "bank", "-c", "the bank", "-c", "a river"], "error: 'bank' does not occur as a whole word in context 2"),
])
def test_bad_arguments_fail_before_the_weights_load(no_weights, args, message):
    result = invoke(*args, "-m", no_weights)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


POSITION_99 = "error: --position 99 is out of range: the prompt has 3 tokens (use 0..2, or -3..-1 from the end)"


@pytest.mark.parametrize("args", [
    ["trace", "Thank you very"], ["dla", "Thank you very", "--target", " much"],
    ["attn", "Thank you very", "--layer", "0"], ["ablate", "Thank you very", "--target", " much"],
])
def test_every_command_says_an_out_of_range_position_the_same_way(no_weights, args):
    result = invoke(*args, "--position", "99", "-m", no_weights)
    assert result.exit_code == 2 and result.stderr == POSITION_99 + "\n"


def test_too_long_prompt_fails_before_the_weights_load(no_weights):
    result = invoke("next", " ".join(["w"] * 70), "-m", no_weights)  # the tiny model's context is 64
    assert result.exit_code == 2 and "takes at most 64" in result.stderr


# ---- 6. status line on a terminal, nothing otherwise; no blank line before the table ------------------------

class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_status_line_only_on_a_terminal(monkeypatch):
    from anatomy_cli.cli import app as app_module

    quiet = io.StringIO()
    monkeypatch.setattr("sys.stderr", quiet)
    with app_module.status("loading gpt2"):
        pass
    assert quiet.getvalue() == ""
    tty, out = _Tty(), io.StringIO()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.setattr("sys.stdout", out)
    with app_module.status("loading gpt2"), app_module.status("running 1 prompt"):  # nested: one line
        app_module.warn("careful")
    assert "loading gpt2" in tty.getvalue() and "careful" in tty.getvalue()
    assert out.getvalue() == ""  # stdout untouched


def test_no_blank_line_before_or_inside_the_table():
    from anatomy_cli.output.render import Column
    from anatomy_cli.output.render import Format
    from anatomy_cli.output.render import Report
    from anatomy_cli.output.render import Section
    from anatomy_cli.output.render import emit

    out = io.StringIO()
    emit(Report(data=None, sections=[Section([Column("a"), Column("n", kind="int")], [{"a": "x", "n": 5}])]),
         Format.table, out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["a", "n"] and lines[-1].split() == ["x", "5"] and len(lines) == 3


# ---- 7. narrow terminals: numbers are never cut -------------------------------------------------------------

def _numbers(data, keys):
    return [row[k] for row in data for k in keys]


def test_trace_at_60_columns_keeps_every_number_whole(gpt2_dir):
    env = {"COLUMNS": "60"}
    data = json.loads(invoke("trace", "Thank you very", "-m", gpt2_dir, "-f", "json").stdout)
    table = invoke("trace", "Thank you very", "-m", gpt2_dir, "-f", "table", env=env).stdout
    assert "…" not in table
    assert all(len(line) <= 60 for line in table.splitlines() if not line.startswith(("layer 0 =", "prompt")))
    for row in data["layers"]:
        for key, digits in (("cos_to_embedding", 3), ("resid_norm", 2)):
            assert f"{row[key]:.{digits}f}" in table


@pytest.mark.parametrize("columns", [60, 30])
def test_params_at_narrow_widths_keeps_every_number_whole(columns, tiktoken_cache):
    data = json.loads(invoke("params", "gpt2", "-f", "json").stdout)  # the preset: config only, no weights
    table = invoke("params", "gpt2", "-f", "table", env={"COLUMNS": str(columns)}).stdout
    assert "…" not in table
    assert data["total"] == 124_439_808 and "124,439,808" in table
    for row in data["rows"]:
        assert f"{row['parameters']:,}" in table


def test_vertical_layout_when_nothing_fits():
    from rich.console import Console

    from anatomy_cli.output import tables
    from anatomy_cli.output.render import Column
    from anatomy_cli.output.render import Section
    from anatomy_cli.output.render import _human

    cols = [Column(f"n{i}", kind="int") for i in range(6)]
    row = {f"n{i}": 131_072 * (i + 1) for i in range(6)}
    shown = [f"{v:,}" for v in row.values()]

    def render(width):
        out = io.StringIO()
        console = Console(file=out, width=width, markup=False, highlight=False)
        tables.render_section(console, Section(cols, [row]), _human)
        return out.getvalue().splitlines()

    assert render(80)[-1].split() == shown  # fits: one table row
    assert [line.split() for line in render(30)] == [[f"n{i}", v] for i, v in enumerate(shown)]  # a block


# ---- 8. words in scripts without spaces ---------------------------------------------------------------------

def test_drift_finds_a_chinese_word_by_its_characters(gpt2_dir):
    from anatomy_cli.analyses.tokens import tokenize_tiktoken

    contexts = ["我去银行取钱。", "河的银行很美。"]
    result = invoke("drift", "银行", "-c", contexts[0], "-c", contexts[1], "-m", gpt2_dir, "-f", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["match"] == "characters"
    for ctx, text in zip(data["contexts"], contexts):
        # independent: tiktoken's byte pieces and their character spans; the word is characters 2..4
        toks = tokenize_tiktoken(text).tokens
        assert ctx["positions"] == [t.index for t in toks if t.start < 4 and t.end > 2]
        assert (ctx["char_start"], ctx["char_end"]) == (2, 4)
    table = invoke("drift", "银行", "-c", contexts[0], "-c", contexts[1], "-m", gpt2_dir, "-f", "tsv")
    assert "matched as characters" in table.stderr


def test_word_spans_rules():
    from anatomy_cli.analyses.drift import word_spans

    assert word_spans("我去银行取钱。", "银行") == [(2, 4)]
    assert word_spans("ฉันไปธนาคาร", "ธนาคาร") == [(5, 11)]
    assert word_spans("banks bank's (bank) embankment", "bank") == [(6, 10), (14, 18)]
    assert word_spans("银行bank", "bank") == [(2, 6)]  # a neighbour without spaces is a boundary


def test_ignore_case_hint_only_where_case_exists(gpt2_dir):
    cjk = invoke("drift", "银行", "-c", "我去银行取钱。", "-c", "河的很美。", "-m", gpt2_dir)
    assert cjk.exit_code == 2 and "ignore-case" not in cjk.stderr and "does not occur in context 2" in cjk.stderr
    latin = invoke("drift", "Bank", "-c", "the Bank", "-c", "a bank", "-m", gpt2_dir)
    assert latin.exit_code == 2 and "try --ignore-case" in latin.stderr


# ---- 9. small things ----------------------------------------------------------------------------------------

def _examples(command):
    help_text = invoke(command, "--help").stdout
    return [shlex.split(line.strip())[1:] for line in help_text.splitlines()
            if line.strip().startswith(f"anatomy {command} ")]


def test_layernorm_help_examples_all_run():
    examples = _examples("layernorm")
    assert len(examples) == 3
    for args in examples:
        result = invoke(*args)
        assert result.exit_code == 0, (args, result.stderr)


def test_tiny_eps_is_not_shown_as_zero():
    table = invoke("layernorm", "1", "2", "--eps", "1e-12", "-f", "table").stdout
    assert re.search(r"eps\s+1\.00e-12", table)


def test_usage_errors_carry_no_pydantic_prefix():
    result = invoke("layernorm", "1", "--format", "bad")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: Invalid value for '--format' / '-f': 'bad' is not one of 'table'")
    assert "Value error" not in result.stderr
    negative = invoke("tokens", "-5")
    assert negative.exit_code == 2 and "put -- before it, after every option (-- -5)" in negative.stderr


def test_help_shows_plain_metavars_for_every_command():
    for command in app.registered_commands:
        text = invoke(command.name, "--help").stdout
        for python_type in ("<str>", "<int>", "<float>", "<int range>", "<float range>", "<list[", "<path>"):
            assert python_type not in text, (command.name, python_type)
        assert "{" not in text.splitlines()[0], command.name  # typer's {PROMPT} for a required argument
    assert "Usage: anatomy trace [OPTIONS] PROMPT\n" in invoke("trace", "--help").stdout
    assert "-k, --top N " in invoke("trace", "--help").stdout


def test_invisible_characters_are_shown_by_code_point():
    from anatomy_cli.text.display import visible

    assert visible("\ufe0f") == "<U+FE0F>" and visible("a\u200db") == "a<U+200D>b"
    assert visible("\u00a0x") == "<U+00A0>x" and visible(" é\n") == "·é↵"
    data = json.loads(invoke("tokens", "❤️", "-f", "json").stdout)
    assert data["tokens"][-1]["token"] == "<U+FE0F>" and data["tokens"][-1]["text"] == "\ufe0f"


def test_library_deprecation_notices_stay_quiet():
    from anatomy_cli.cli.app import quiet_library_warnings

    quiet_library_warnings()
    log = logging.getLogger("transformers.configuration_utils")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    log.addHandler(handler)
    try:
        log.warning("`torch_dtype` is deprecated! Use `dtype` instead!")
        log.warning("something the user should know")
    finally:
        log.removeHandler(handler)
    assert seen == ["something the user should know"]


# ---- 10. README ---------------------------------------------------------------------------------------------

def test_readme_quotes_jq_filters_and_mentions_cpu_torch_and_double_dash():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    filters = re.findall(r"\| jq (\S+)", readme)
    assert filters and all(f.startswith("'") for f in filters)
    assert "download.pytorch.org/whl/cpu" in readme and "`--` ends the options" in readme
