"""The prompt driver: the CLI command of every record that names a ``view`` (anatomy_cli/declare/commands.py),
generated from the record, its task module (:mod:`anatomy_cli.tasks.driven` lists what that declares) and its view
(``anatomy_cli/output/views/<view>.py``: ``report(lm, enc, result)``, and ``figure(lm, enc, result)`` where the
command draws). Such a command has no file under cli/commands/.

Its signature is the task's arguments (``TAKES``: PROMPT by default; patch's CLEAN CORRUPT, drift's WORD and
``--context``), the options of its options class (``cli.declared.command``), the model options, the prompt
options, then ``--plot FILE`` (when the view draws) and ``--format``; its help is the task's ``HELP``. Its body,
the same for every such command: the texts (stdin's lines for ``-``), open the model and tokenize them (no
weights), ``check``, load the weights, ``run``, then each result's picture and report (the view's hooks:
:mod:`anatomy_cli.output.views.driven`).
"""

from __future__ import annotations

import inspect
from typing import Annotated
from typing import Any

import typer

from anatomy_cli.cli.commands._common import draw_each
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import Command
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.inputs import REQUIRED
from anatomy_cli.declare.inputs import Arg
from anatomy_cli.declare.inputs import Inputs
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import resolve_format
from anatomy_cli.output.views import driven as views
from anatomy_cli.tasks import driven
from anatomy_cli.tasks import notes
from anatomy_cli.text.inputs import read_prompts
from anatomy_cli.text.options import PromptOptions


def draws(rec: Command) -> bool:
    """True when the command's view draws a picture (``figure``): the command has ``--plot``. Imports the view
    (no torch, no plotting library)."""
    return hasattr(when_run(f"output.views.{rec.view}"), "figure")


def parameter(arg: Arg) -> inspect.Parameter:
    """The Typer parameter of one declared argument: positional, or an option where it has flags."""
    info = (typer.Option(*arg.flags, metavar=arg.metavar, show_default=False, help=arg.help) if arg.flags
            else typer.Argument(metavar=arg.metavar, show_default=False, help=arg.help))
    default = inspect.Parameter.empty if arg.default is REQUIRED else arg.default
    return inspect.Parameter(arg.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                             annotation=Annotated[arg.cli, info])


def read(takes: Inputs, given: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the task reads them: a prompts argument as its list of texts (stdin's non-empty lines for
    ``-``; ``[]`` when an optional one is left out)."""
    return {a.name: ([] if given[a.name] is None else read_prompts(given[a.name])) if a.prompts else given[a.name]
            for a in takes.arguments}


def register(rec: Command) -> None:
    """Register the command of ``rec`` (a record with a ``view``) on the app."""
    task = driven.task_of(rec)
    takes = driven.takes(task)

    def prompt_command(opts: Any = None, spec: ModelSpec = ModelSpec(), prompts: PromptOptions = PromptOptions(),
                       out: Output = Output(), **given: Any) -> None:
        view = when_run(f"output.views.{rec.view}")
        stdin = any(a.prompts and given[a.name] == "-" for a in takes.arguments)
        opts, texts = driven.texts(task, opts, read(takes, given))
        with notes.recorded() as warned:  # the task's run may carry them (driven.run)
            opened, encoded = (open_texts(texts, spec, prompts, what=takes.what, truncate_hint=takes.truncate)
                               if texts else (open_model(spec), []))
            plan = driven.check(task, opened, opts, encoded)
            lm = load_weights(opened)
        how = views.Shown(opts, plan, resolve_format(out.fmt), out.plot)
        results = driven.run(task, lm, encoded, opts, plan, warned, **views.run_kwargs(view, how))
        units = driven.units(task, encoded, results)
        steps = [lambda: draw_each(rec.name, out.plot, "-" if stdin else None,
                                   (views.figure(view, lm, enc, r, how) for enc, r in units)),
                 lambda: emit_prompts([views.report(view, lm, enc, r, how) for enc, r in units], how.fmt,
                                      from_stdin=stdin)]
        for step in reversed(steps) if views.report_first(view) else steps:
            step()

    own = inspect.signature(prompt_command).parameters
    params = [*(parameter(a) for a in takes.arguments), *(own[n] for n in ("opts", "spec", "prompts", "out"))]
    prompt_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    prompt_command.__annotations__ = {p.name: p.annotation for p in params}
    prompt_command.__doc__ = task.HELP
    prompt_command.__name__ = prompt_command.__qualname__ = f"{rec.module}_command"
    groups = prompt_options(truncate=takes.truncate)(output_options(plot=draws(rec))(prompt_command))
    command(rec.name, task.OPTIONS)(model_options()(groups))
