"""The API functions of the prompt driver's commands (the records that name a ``view``,
anatomy_cli/declare/commands.py): ``anatomy.trace``, ``anatomy.next_token``, ... generated from the record and the
task module's hooks (:mod:`anatomy_cli.tasks.driven`), as the CLI's ``cli/driver.py`` generates the command.

Each is ``fn(model, <the task's arguments: prompt, or clean, corrupt, ...>, *, <the options as keywords>,
prompts=PromptOptions())`` (``api._declared.command``);
its docstring is the task's ``API_HELP``; its body :func:`~anatomy_cli.api._run.run_prompts`. A function is made
on first use (PEP 562) and kept. No torch at import time; nothing from cli/.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from anatomy_cli.api._declared import command
from anatomy_cli.api._results import Result
from anatomy_cli.api._run import run_prompts
from anatomy_cli.declare.commands import COMMANDS
from anatomy_cli.declare.commands import Command
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.inputs import REQUIRED
from anatomy_cli.tasks import driven
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]

# {API function name: its record}: the driven records with an API function.
DRIVEN = {c.api[1]: c for c in COMMANDS if c.view is not None and c.api is not None}


def signature(rec: Command) -> inspect.Signature:
    """``(model, <the task's arguments>, opts, *, prompts=PromptOptions()) -> One`` (``Result`` where no argument
    reads several prompts), annotations as text as in the API's own modules."""
    takes = driven.takes(driven.task_of(rec))
    p = inspect.Parameter
    given = [p(a.name, p.POSITIONAL_OR_KEYWORD, annotation=a.api,
               default=p.empty if a.default is REQUIRED else a.default) for a in takes.arguments]
    return inspect.Signature([p("model", p.POSITIONAL_OR_KEYWORD, annotation="Model"), *given,
                              p("opts", p.POSITIONAL_OR_KEYWORD, default=None, annotation="Any"),
                              p("prompts", p.KEYWORD_ONLY, default=PromptOptions(), annotation="PromptOptions")],
                             return_annotation="One" if takes.many else "Result")


def function(rec: Command) -> Callable[..., One]:
    """The API function of record ``rec``."""
    task = driven.task_of(rec)
    sig = signature(rec)

    def fn(*args: Any, **kwargs: Any) -> One:
        given = sig.bind(*args, **kwargs)
        given.apply_defaults()
        values = dict(given.arguments)
        view = when_run(f"output.views.{rec.view}")
        arguments = {a.name: values[a.name] for a in driven.takes(task).arguments}
        return run_prompts(task, view, values["model"], arguments, values["opts"], values["prompts"])

    assert rec.api is not None
    fn.__name__ = fn.__qualname__ = rec.api[1]
    fn.__doc__ = task.API_HELP
    fn.__signature__ = sig  # type: ignore[attr-defined]
    return command(task.OPTIONS)(fn)


def __getattr__(name: str) -> Any:
    rec = DRIVEN.get(name)
    if rec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = function(rec)
    globals()[name] = made
    return made
