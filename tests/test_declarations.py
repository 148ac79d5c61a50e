"""One declaration per command (issue 59): the records (anatomy_cli/declare/commands.py) are the only list of
commands, and each option is one field of its command's options dataclass, from which the CLI, the API and a
served command are generated. Enumerates every option of every command and compares what each front end
offers: flags, defaults, limits; a drift (an API default of 8 against the CLI's 32) fails here."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
from pathlib import Path

import pytest
from test_task_parity import options_class
from test_task_parity import task_modules

from anatomy_cli.declare.commands import COMMANDS
from anatomy_cli.declare.commands import Needs
from anatomy_cli.declare.fields import build
from anatomy_cli.declare.fields import every
from anatomy_cli.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def click_commands() -> dict:
    """The app's click commands, built once (typer builds the whole tree on each ``click_command()``)."""
    import anatomy_cli.cli.main  # noqa: F401  registers every command
    from anatomy_cli.cli.app import click_command

    return dict(click_command().commands)


@functools.cache
def shown_commands() -> dict:
    """The app's commands after the help passes (aliases hidden, declared limits put on the parameters): a tree of
    their own, built once."""
    from anatomy_cli.cli.app import _hide_aliases
    from anatomy_cli.cli.app import click_command
    from anatomy_cli.cli.app import show_limits

    group = click_command()
    _hide_aliases(group)
    show_limits(group)
    return dict(group.commands)


def declared_commands() -> list[tuple[str, type]]:
    tasks = task_modules()
    return [(c.name, options_class(tasks[c.name])) for c in COMMANDS if c.name in tasks]


def test_the_records_are_the_apps_commands_with_their_files():
    assert sorted(click_commands()) == sorted(c.name for c in COMMANDS)
    assert len({c.name for c in COMMANDS}) == len(COMMANDS)
    tasks = task_modules()
    for c in COMMANDS:
        own = (ROOT / "anatomy_cli" / "cli" / "commands" / f"{c.module}.py").is_file()
        assert own is (c.view is None), f"{c.name}: a CLI file of its own exactly when the driver does not run it"
        assert c.docs is not None and (ROOT / c.docs).is_file(), c.name
        assert c.name in tasks and tasks[c.name].__name__.endswith(f".{c.module}"), c.name


def test_a_driven_command_is_its_record_its_task_module_and_its_view():
    """The prompt driver's commands (a record with a ``view``) are written in their task module (the hooks of
    anatomy_cli/tasks/driven.py) and their view, nowhere else: no CLI module, no API wrapper."""
    tasks = task_modules()
    driven = [c for c in COMMANDS if c.view is not None]
    assert driven
    for c in driven:
        task = tasks[c.name]
        assert (ROOT / "anatomy_cli" / "output" / "views" / f"{c.view}.py").is_file(), c.name
        assert task.OPTIONS is options_class(task), c.name
        assert callable(task.check) and callable(task.run) and task.HELP.strip(), c.name
        assert c.api is None or (c.api[0] == "_driven" and task.API_HELP.strip()), c.name


def test_every_weight_loading_command_is_forwarded_or_says_why_not():
    from anatomy_cli.serve import client

    for c in COMMANDS:
        if c.needs not in (Needs.nothing, Needs.config):
            assert c.forwarded or c.not_forwarded, f"{c.name} loads weights: forward it or say why not"
    assert client.FORWARDED == tuple(c.name for c in COMMANDS if c.forwarded)
    assert client.wants_server(["circuit", "x"]) and not client.wants_server(["layernorm", "1"])


def test_the_api_exports_every_records_function():
    from anatomy_cli import api

    for c in COMMANDS:
        if c.api is not None:
            assert c.api[1] in api.__all__ and callable(getattr(api, c.api[1])), c.name


def _same(a, b) -> bool:
    if isinstance(a, enum.Enum):
        a = a.value
    if isinstance(b, enum.Enum):
        b = b.value
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


@pytest.mark.parametrize("name,cls", declared_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_is_the_same_in_the_cli_the_api_and_its_declaration(name, cls):
    command = shown_commands()[name]
    params = {p.name: p for p in command.params}
    rec = next(c for c in COMMANDS if c.name == name)
    api_params = {}
    if rec.api is not None:
        from anatomy_cli import api

        api_params = inspect.signature(getattr(api, rec.api[1])).parameters
    for _, f, o in every(cls):  # a nested options class's (generate's sampling) too
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # None: required
        p = params.get(f.name)
        assert p is not None, f"{name}: field {f.name} has no CLI option"
        spelled = set(p.opts) | set(getattr(p, "aliases", ())) | set(p.secondary_opts)
        flags = {one for flag in o.flags for one in flag.split("/")}
        assert spelled == flags, f"{name} {f.name}: CLI {sorted(spelled)} declared {sorted(flags)}"
        assert _same(p.default, default), f"{name} {f.name}: CLI default {p.default!r}, declared {default!r}"
        assert (getattr(p, "min", None), getattr(p, "max", None)) == (o.min, o.max), f"{name} {f.name}: limits"
        if rec.api is not None:
            k = api_params.get(f.name)
            assert k is not None and k.kind is inspect.Parameter.KEYWORD_ONLY, f"api {rec.api[1]}: no {f.name}"
            if f.name in _required(cls):  # a required keyword, as the CLI's option
                assert k.default is inspect.Parameter.empty, f"api {rec.api[1]} {f.name}: {k.default!r}, required"
            else:
                assert _same(k.default, default), f"api {rec.api[1]} {f.name}: {k.default!r} declared {default!r}"


def _below(cls) -> list[tuple[str, str, object]]:
    """(field, flag, a value below its declared minimum) for every field with a minimum."""
    return [(f.name, o.flag, o.min - 1) for _, f, o in every(cls) if o.min is not None]


def _required(cls) -> dict[str, str]:
    """``{field: "x"}`` for each field without a default (``sae --sae``, fit-sae's CORPUS): the limits are checked
    first, so any value does."""
    return {f.name: "x" for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING}


@pytest.mark.parametrize("name,cls", declared_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_value_below_a_limit_is_refused_once_in_the_callers_words(name, cls):
    from typer.testing import CliRunner

    from anatomy_cli.cli.app import app
    from anatomy_cli.declare.commands import record

    rec = record(name)
    for field, flag, value in _below(cls):
        with pytest.raises(UsageError) as raised:
            build(cls, {**_required(cls), field: value})
        assert str(raised.value).startswith(f"{flag} takes"), str(raised.value)
        if rec.api is not None:  # the API names the keyword, in the same sentence otherwise
            from anatomy_cli import api

            fn = getattr(api, rec.api[1])
            positional = [p for p in inspect.signature(fn).parameters.values()
                          if p.default is inspect.Parameter.empty and p.kind is not p.KEYWORD_ONLY]
            required = {k: v for k, v in _required(cls).items() if k not in {p.name for p in positional}}
            with pytest.raises(UsageError) as by_api:
                fn(*(["x"] * len(positional)), **{**required, field: value})
            assert str(by_api.value) == str(raised.value).replace(flag, f"{field}=", 1), str(by_api.value)
    if _below(cls):  # the CLI refuses the first with the options class's one message, exit 2, before any model
        field, flag, value = _below(cls)[0]
        command = click_commands()[name]
        arguments = ["x" for p in command.params if p.param_type_name == "argument" and p.required]
        # A required option (fit-lens --out, report -o FILE.html) is given: click asks for it before the callback.
        arguments += [v for p in command.params if p.param_type_name == "option" and p.required
                      for v in (p.opts[0], "x.html")]
        result = CliRunner().invoke(app, ["--no-server", name, *arguments, flag, str(value)])
        assert result.exit_code == 2 and f"error: {flag} takes" in result.stderr, (result.exit_code, result.stderr)


def test_the_docs_index_is_written_from_the_records():
    from anatomy_cli.declare.commands import docs_index

    assert (ROOT / "docs" / "commands" / "README.md").read_text(encoding="utf-8") == docs_index(), \
        "rewrite it: python -m anatomy_cli.declare.commands > docs/commands/README.md"
