"""README says what a new user needs (issue 32, item 7): what `·` means, once, where the tour first shows a
token; and every command line it shows is one the app parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_leading_space_dot_is_explained_once_where_the_tour_first_shows_a_token():
    tour = README[README.index("## A tour"):]
    first = tour.index("·")  # the first token the tour shows
    explained = [m.start() for m in re.finditer(r"`·` is a leading space", tour)]
    assert len(explained) == 1
    # between the first token shown and the explanation there is at most the rest of that code block
    assert tour.count("```", first, explained[0]) == 1


def _readme_command_lines() -> list[str]:
    """Every ``anatomy ...`` line in the README's bash blocks (continuation lines joined)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("anatomy "):
                lines.append(line)
    return lines


def test_every_command_line_in_the_readme_parses(tmp_path, monkeypatch):
    # Each example names a command of the app, and its options and arguments parse as the app reads them
    # (click's own parser, no command run): a renamed option or a dropped command fails here.
    from anatomy_cli.cli import app as app_module
    from anatomy_cli.cli import main  # noqa: F401  (registers every command on the app)

    group = app_module.click_command()
    app_module._hide_aliases(group)
    lines = _readme_command_lines()
    monkeypatch.chdir(tmp_path)  # the files the examples name, as placeholders (options check that they exist)
    for line in lines:
        for arg in shlex.split(line, comments=True):
            if arg.endswith(".gguf"):
                (tmp_path / arg).write_bytes(b"GGUF")  # the magic: what parsing the options checks
            elif arg.startswith("./") or arg.endswith("/"):
                (tmp_path / arg).mkdir(parents=True, exist_ok=True)
    names = {shlex.split(line, comments=True)[1] for line in lines}
    assert len(lines) >= 25 and {"trace", "lens", "patch", "corpus", "serve"} <= names
    for line in lines:
        name, *args = shlex.split(line, comments=True)[1:]
        assert name in group.commands, f"README: {line!r}: no command {name!r}"
        command = group.commands[name]
        try:
            command.make_context(name, list(args))
        except Exception as exc:  # click's UsageError and friends: the message names the option
            raise AssertionError(f"README: {line!r} does not parse: {exc}") from None


# ---------------------------------------------------------------- issue 61 item 11

ROOT = Path(__file__).resolve().parents[1]
# The options whose argument is a file or folder the command writes (and the shell's redirection).
WRITES = ("--out", "-o", "--to", "--plot", "--save-control-vector", "--json", ">")


def _doc_command_lines(text: str) -> list[str]:
    """The ``anatomy ...`` lines (a ``$ `` prompt dropped, continuation lines joined) of a Markdown file's code
    blocks."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").strip()
            if line.startswith("anatomy "):
                lines.append(line)
    return lines


def _paths_the_docs_make() -> set[str]:
    """What the README's tour and docs/commands/*.md tell a user to write or make in the clone, relative to it:
    each output option's argument, and each folder a Python snippet saves a model to (route.md's tiny MoE)."""
    texts = [README] + [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs" / "commands").glob("*.md"))]
    found = set()
    for text in texts:
        for line in _doc_command_lines(text):
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                words = line.split("#")[0].split()
            for option, value in zip(words, words[1:]):
                if option in WRITES:
                    found.add(value)
        found |= set(re.findall(r'save_pretrained\("([^"]+)"\)', text))
    placeholder = re.compile(r"^[A-Z]+(\.[a-z]+)?$")  # DIR, FILE, FILE.html, C.pt
    return {p.removeprefix("./").rstrip("/") for p in found
            if p != "-" and not p.startswith(("docs/", "/", "~", "$")) and not placeholder.match(p)}


def test_what_the_docs_tell_a_user_to_make_in_the_clone_is_ignored_by_git():
    """`my-moe/` (route.md's tiny MoE), `tc/` (circuit.md's transcoders), the tour's and the command pages'
    outputs: following the docs from a clone leaves `git status` clean."""
    import shutil
    import subprocess

    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    paths = _paths_the_docs_make()
    assert {"my-moe", "tc", "my-sae", "source", "run1", "report.html", "graph.pt", "graph.json"} <= paths
    for path in sorted(paths):
        probe = path if "." in path else f"{path}/x"  # a file (it has a suffix), else a file in the folder
        done = subprocess.run([git, "check-ignore", "-q", "--no-index", probe], cwd=ROOT, check=False)
        assert done.returncode == 0, f"{path}: the docs make it in the clone, and .gitignore does not cover it"


def test_the_plot_list_names_every_command_that_draws():
    # issue 61 item 11: the README's `--plot` sentence omitted route, generate and circuit (and sae, verify)
    from anatomy_cli.cli import app as app_module
    from anatomy_cli.cli import main  # noqa: F401  (registers every command on the app)

    group = app_module.click_command()
    drawing = {name for name, command in group.commands.items()
               if any("--plot" in getattr(p, "opts", ()) for p in command.params)}
    assert {"lens", "route", "generate", "circuit"} <= drawing
    paragraph = next(p for p in README.split("\n\n") if "draw what they print with `--plot FILE`" in p)
    named = set(re.findall(r"`([a-z-]+)`", paragraph))
    assert drawing <= named, f"the README's --plot list lacks {sorted(drawing - named)}"
