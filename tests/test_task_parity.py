"""Every CLI option of a command has an API keyword of the same name, and vice versa (issue 47): both are the
fields of the command's task options dataclass (anatomy_cli/tasks/<command>.py).

The three lists are derived, not written down: the CLI's from the click command the app registers
(``anatomy_cli.cli.app.click_command()``), the API's from ``inspect.signature`` of its function, the task's from
``dataclasses.fields``. Left out on every side: the model (``spec``, the model option group), the prompt options
(``prompts``: --bos/--no-bos, --allow-special, --truncate, --chat), ``--format`` and ``--plot``, the view-only
``--detail`` (verify: the table's rows instead of its one-line-per-section summary; the JSON and the API's result
are the same either way, so it is no API keyword and no task field), and the command's
positional arguments (PROMPT, CLEAN CORRUPT, ...: the API's positional parameters). A command without a task
module yet is skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pkgutil

import pytest

import anatomy_cli.tasks
from anatomy_cli.declare.commands import COMMANDS

# The API function of a command: its record's (anatomy_cli/declare/commands.py).
API_NAME = {c.name: c.api[1] for c in COMMANDS if c.api is not None}
NOT_A_TASK = {"notes", "session", "records"}  # the task layer's shared modules
PROMPT_FIELDS = {"bos", "allow_special", "truncate", "chat"}  # the prompt option group, wherever it is kept


def task_modules() -> dict[str, object]:
    """``{command: task module}`` for every module of anatomy_cli/tasks/ with a ``COMMAND``."""
    out = {}
    for info in pkgutil.iter_modules(anatomy_cli.tasks.__path__):
        if info.name.startswith("_") or info.name in NOT_A_TASK:
            continue
        module = importlib.import_module(f"anatomy_cli.tasks.{info.name}")
        if hasattr(module, "COMMAND"):
            out[module.COMMAND] = module
    return out


def options_class(module) -> type:
    """The module's options dataclass: the frozen dataclass named ``...Options`` it defines, or its companion
    module ``tasks/_<module>_options.py`` defines (where a fragment the task imports reads the options too)."""
    package, _, leaf = module.__name__.rpartition(".")
    own = (module.__name__, f"{package}._{leaf}_options")
    found = [v for k, v in vars(module).items() if k.endswith("Options") and dataclasses.is_dataclass(v)
             and isinstance(v, type) and v.__module__ in own]
    named = [c for c in found if c.__name__.lower() == module.COMMAND.replace("-", "") + "options"]
    found = named or found
    assert len(found) == 1, f"{module.__name__}: one ...Options dataclass, found {[c.__name__ for c in found]}"
    assert found[0].__dataclass_params__.frozen, f"{found[0].__name__} is not frozen"
    return found[0]


@functools.cache
def commands() -> dict[str, object]:
    import anatomy_cli.cli.main  # noqa: F401  registers every command
    from anatomy_cli.cli.app import click_command

    return dict(click_command().commands)


def model_group_helps() -> dict[str, str]:
    """``{parameter: help}`` of the model option group's declarations (cli/options.py)."""
    import typing

    from anatomy_cli.cli.options import MODEL_OPTIONS

    return {name: typing.get_args(kind)[1].help for name, kind, _ in MODEL_OPTIONS}


def in_model_group(param) -> bool:
    """True when ``param`` is the model group's option, declared as the group declares it; a command's own
    option of the same name (params' --dtype and --max-memory, tokens' --model) is not."""
    helps = model_group_helps()
    return param.name in helps and param.help == helps[param.name]


def cli_names(command) -> tuple[set[str], set[str]]:
    """The command's option names (python names, ``target_id``) without the shared groups, and its arguments
    (``param_type_name``: typer carries its own copy of click, whose classes are not ``click.Option``)."""
    from anatomy_cli.cli.options import PROMPT_OPTIONS

    shared = {o[0] for o in PROMPT_OPTIONS} | {"fmt", "format", "plot", "detail"}
    options = {p for p in command.params if p.param_type_name == "option" and p.name not in shared
               and not in_model_group(p)
               and p.name not in {"output"}}  # report's -o FILE: where the page goes, as --plot
    arguments = {p.name for p in command.params if p.param_type_name == "argument"}
    return options, arguments


def spellings(param) -> list[str]:
    """The option as the user types it, each spelling as a python name: ``--top``/``-k`` → ``top``, ``k``;
    ``--target-id`` → ``target_id``; a flag ``--no-lens`` is the field ``lens``; a repeatable ``--feature``
    fills the field ``features``."""
    names = [*param.opts, *getattr(param, "aliases", ()), *getattr(param, "secondary_opts", ())]
    out = [n.lstrip("-").removeprefix("no-").replace("-", "_") for n in names]
    if getattr(param, "multiple", False):
        out += [n + "s" for n in out]
    return out


def matched(options, fields: set[str]) -> set[str]:
    """Each option by the spelling that names a field (else its first)."""
    return {next((n for n in spellings(p) if n in fields), spellings(p)[0]) for p in options}


def fields_of(cls) -> set[str]:
    """The options dataclass's fields, a nested options dataclass (generate's sampling, steering) by its own."""
    out = set()
    for f in dataclasses.fields(cls):
        if not f.init:  # derived in __post_init__ (steer's sides)
            continue
        kind = f.type if isinstance(f.type, type) else getattr(importlib.import_module(cls.__module__), str(f.type),
                                                                None)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out |= fields_of(kind)
        else:
            out.add(f.name)
    return out


def api_names(function, arguments: set[str]) -> set[str]:
    params = list(inspect.signature(function).parameters.values())[1:]  # after the model
    return {p.name for p in params if p.name not in {"prompts", "spec"} | arguments
            and p.kind is not inspect.Parameter.POSITIONAL_ONLY}


ALL = sorted(commands())


@pytest.mark.parametrize("name", ALL)
def test_cli_options_api_keywords_and_task_fields_are_one_list(name):
    tasks = task_modules()
    if name not in tasks:
        pytest.skip(f"`{name}` has no task module (anatomy_cli/tasks/) yet")
    # A task's INPUTS are the command's inputs, not options: {field: the CLI option that reads it, or None for a
    # positional argument} (drift's WORD and CONTEXT..., verify's --prompts FILE → prompt).
    inputs = getattr(tasks[name], "INPUTS", {})
    fields = fields_of(options_class(tasks[name])) - set(inputs) - PROMPT_FIELDS
    params, arguments = cli_names(commands()[name])
    options = matched([p for p in params if not set(spellings(p)) & set(inputs.values())], fields)
    assert options == fields, (f"`anatomy {name}`: CLI options without a field {sorted(options - fields)}, "
                               f"fields without a CLI option {sorted(fields - options)}")
    from anatomy_cli import api as anatomy

    api = API_NAME.get(name)
    if api is None:
        pytest.skip(f"`{name}` has no API function")
    # the model group's options the CLI has (explain's explainer: device, dtype, ...) are no task field in the API
    # either, where a function loads its own model instead of taking one
    model_group = {p.name for p in commands()[name].params if in_model_group(p)}
    keywords = api_names(getattr(anatomy, api), arguments | set(inputs)) - PROMPT_FIELDS - model_group
    assert keywords == fields, (f"anatomy.{api}: keywords without a field {sorted(keywords - fields)}, "
                                f"fields without a keyword {sorted(fields - keywords)}")


def test_next_has_its_task():
    # the exemplar: the parity test is not vacuous
    assert "next" in task_modules() and "next" in ALL
