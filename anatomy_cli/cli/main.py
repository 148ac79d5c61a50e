"""Entry point: the `anatomy` console script.

Each command lives in ``anatomy_cli/cli/commands/<module>.py`` (its record's ``module``,
anatomy_cli/declare/commands.py) and registers itself on :data:`anatomy_cli.cli.app.app` when
imported. Command modules import torch and transformers lazily (inside the command body) so ``anatomy --help``
and ``anatomy tokens`` start without them.
"""

from __future__ import annotations

import importlib
import signal

from anatomy_cli.cli.app import app
from anatomy_cli.declare.commands import COMMANDS

# Each record's CLI module registers its command on the app when imported (cli/declared.py's `command`); in the
# order of their names, which `anatomy --help` lists.
for _record in sorted(COMMANDS, key=lambda c: c.name):
    importlib.import_module(f"anatomy_cli.cli.commands.{_record.module}")

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry: default SIGPIPE so `| head -1` ends quietly."""
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    app()

