"""Exit codes, one-line errors and quiet SIGPIPE for the CLI as a whole."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from anatomy_cli import __version__
from anatomy_cli.cli.main import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"anatomy {__version__}\n"


def test_the_root_help_summarises_what_the_tool_does_now():
    # issue 61 item 10: the summary listed only the first commands (parameters ... LayerNorm)
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0
    summary = " ".join(result.stdout.split("Options:")[0].split())
    for topic in ("attribution", "patching", "SAEs and transcoders", "circuits", "corpus", "serve", "lens"):
        assert topic in summary, topic
    assert "word drift, tokens and LayerNorm" not in summary


def test_unknown_option_is_a_one_line_usage_error():
    result = runner.invoke(app, ["--bogus"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: No such option: --bogus")
    assert result.stderr.count("\n") == 1


def test_unknown_command_is_a_usage_error():
    result = runner.invoke(app, ["frobnicate"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")


def test_every_command_has_help_with_an_example():
    names = [c.name for c in app.registered_commands]
    assert {"params", "trace", "next", "drift", "tokens", "layernorm"} <= set(names)
    for name in names:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.stderr)
        assert "Example" in result.stdout, name


def _run(args, **kw):
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "anatomy_cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, **kw)


def test_broken_pipe_is_quiet():
    # `anatomy layernorm ... | head -1`: the reader closes the pipe after one line.
    proc = subprocess.Popen(f"{sys.executable} -m anatomy_cli layernorm 1 2 3 4 --format tsv | head -c 1",
                            shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert out and err == b""


def test_a_reader_that_closes_the_pipe_early_ends_it_quietly_with_exit_0():
    """`anatomy tokens ... | head -1` (a new user's trial: exit 141 through SIGPIPE, which the README's exit codes do
    not list): the reader takes two lines and closes the pipe while the command still writes; it ends with exit 0
    and nothing on stderr, in the plain formats (click's own answer is exit 1) and the table (rich's is exit 1)."""
    from conftest import build_gpt2_tokenizer

    word = build_gpt2_tokenizer().encode(" word")
    assert len(word) == 1
    text = " word" * 6000  # 6,000 rows: more than a pipe's buffer holds
    for fmt in ("tsv", "table"):
        proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "tokens", text, "--format", fmt],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, NO_COLOR="1"))
        lines = [proc.stdout.readline() for _ in range(2)]
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0 and err == b"", (fmt, proc.returncode, err)
        if fmt == "tsv":  # the header, then the first token's row: its id is the GPT-2 tokenizer's
            assert lines[0].split(b"\t")[:2] == [b"index", b"token_id"]
            assert lines[1].split(b"\t")[:2] == [b"0", str(word[0]).encode()]


def test_debug_shows_a_traceback_and_default_does_not():
    plain = _run(["layernorm", "x"])
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("error: ") and plain.stderr.count("\n") == 1
    debug = _run(["--debug", "layernorm", "x"])
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    after = _run(["layernorm", "x", "--debug"])  # after the command, as users type it (it once was no option)
    assert after.returncode == 2 and "Traceback" in after.stderr and "No such option" not in after.stderr
    assert after.stderr.splitlines()[-1] == debug.stderr.splitlines()[-1]


def test_an_argument_that_is_not_utf8_is_a_usage_error_before_any_server(tmp_path):
    """Bytes that are not UTF-8 on the command line: one line, exit 2, no traceback (the serve protocol is JSON and
    used to crash on them) and nothing loaded."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # no server there: the check comes first anyway
    for args in ([b"tokens", b"ab\xffcd"], [b"next", b"ab\xffcd", b"--model", b"gpt2"], [b"trace", b"x", b"--target", b"\xff"]):
        proc = subprocess.run([sys.executable, b"-m", b"anatomy_cli", *args], capture_output=True, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == b""
        assert proc.stderr.decode().startswith("error: argument ") and proc.stderr.count(b"\n") == 1, proc.stderr
        assert b"not valid UTF-8" in proc.stderr
    # The byte counts from 1, as stdin's and a corpus file's do: b"ab\xffcd" is bad at its third byte.
    proc = subprocess.run([sys.executable, b"-m", b"anatomy_cli", b"tokens", b"ab\xffcd"], capture_output=True, env=env)
    assert proc.stderr == b"error: argument 2 is not valid UTF-8 (byte 3: b'\\xff'); pass text as UTF-8, or a prompt on stdin with '-'\n"
