"""README says what a new user needs (issue 32, item 7): what `·` means, once, where the tour first shows a
token; and every command line it shows is one the app parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

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
