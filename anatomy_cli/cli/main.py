"""The app with every command registered (the `anatomy` console script is :mod:`anatomy_cli.cli.entry`).

A record that names a ``view`` (anatomy_cli/declare/commands.py) is registered by the prompt driver
(``anatomy_cli/cli/driver.py``) from its task module and view; any other command lives in
``anatomy_cli/cli/commands/<module>.py`` (its record's ``module``) and registers itself on
:data:`anatomy_cli.cli.app.app` when imported. Commands import torch and transformers lazily (inside the
command body) so ``anatomy --help`` and ``anatomy tokens`` start without them.
"""

from __future__ import annotations

import importlib

from anatomy_cli.cli import driver
from anatomy_cli.cli.app import app
from anatomy_cli.declare.commands import COMMANDS

# Each record's command registers on the app (cli/declared.py's `command`): the driver's from the record, the others
# when their CLI module is imported; in the order of their names, which `anatomy --help` lists.
for _record in sorted(COMMANDS, key=lambda c: c.name):
    if _record.view is not None:
        driver.register(_record)
    else:
        importlib.import_module(f"anatomy_cli.cli.commands.{_record.module}")


__all__ = ["app"]  # the console script is anatomy_cli.cli.entry:main
