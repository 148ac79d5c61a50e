"""The prompt driver: the CLI command of every record that names a ``view`` (anatomy_cli/declare/commands.py),
generated from the record, its task module (:mod:`anatomy_cli.tasks.driven` lists what that declares) and its view
(``anatomy_cli/output/views/<view>.py``: ``report(lm, enc, result)``, and ``figure(lm, enc, result)`` where the
command draws). Such a command has no file under cli/commands/.

Its signature is PROMPT, the options of its options class (``cli.declared.command``), the model options, the prompt
options, then ``--plot FILE`` (when the view draws) and ``--format``; its help is the task's ``HELP``. Its body, the
same for every such command: open the model and the prompts (no weights), ``check``, load the weights, ``run``,
then each prompt's picture and report (the view's hooks: :mod:`anatomy_cli.output.views.driven`).
"""

from __future__ import annotations

import importlib
from typing import Any

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_each
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import Command
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import resolve_format
from anatomy_cli.output.views import driven as views
from anatomy_cli.tasks import driven
from anatomy_cli.text.options import PromptOptions


def draws(rec: Command) -> bool:
    """True when the command's view draws a picture (``figure``): the command has ``--plot``. Imports the view
    (no torch, no plotting library)."""
    return hasattr(importlib.import_module(f"anatomy_cli.output.views.{rec.view}"), "figure")


def register(rec: Command) -> None:
    """Register the command of ``rec`` (a record with a ``view``) on the app."""
    task = driven.task_of(rec)

    def prompt_command(prompt: PromptArg, opts: Any, spec: ModelSpec = ModelSpec(),
                       prompts: PromptOptions = PromptOptions(), out: Output = Output()) -> None:
        view = importlib.import_module(f"anatomy_cli.output.views.{rec.view}")
        opened, encoded = open_prompts(prompt, spec, prompts)
        plan = driven.check(task, opened, opts, encoded)
        lm = load_weights(opened)
        how = views.Shown(opts, plan, resolve_format(out.fmt), out.plot)
        results = task.run(lm, encoded, opts, plan, **views.run_kwargs(view, how))
        draw_each(rec.name, out.plot, prompt, (views.figure(view, lm, enc, r, how) for enc, r in zip(encoded, results)))
        emit_prompts([views.report(view, lm, enc, r, how) for enc, r in zip(encoded, results)], how.fmt,
                     from_stdin=prompt == "-")

    prompt_command.__doc__ = task.HELP
    prompt_command.__name__ = prompt_command.__qualname__ = f"{rec.module}_command"
    groups = prompt_options()(output_options(plot=draws(rec))(prompt_command))
    command(rec.name, task.OPTIONS)(model_options()(groups))
