"""Entry point: the `anatomy` console script.

Each command lives in ``anatomy_cli/cli/commands/<name>.py`` and registers itself on
:data:`anatomy_cli.cli.app.app` when imported. Command modules import torch and
transformers lazily (inside the command body) so ``anatomy --help`` and
``anatomy tokens`` start without them.
"""

from __future__ import annotations

import signal

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands import ablate  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import attn  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import attribute  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import circuit  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import convert  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import corpus  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import diff  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import dla  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import drift  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import fit_lens  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import fit_sae  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import generate  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import heads  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import layernorm  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import lens  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import lens_eval  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import models  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import next_token  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import params  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import patch  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import report  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import route  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import sae  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import serve  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import steer  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import tokens  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import trace  # noqa: F401  (registration by import)
from anatomy_cli.cli.commands import verify  # noqa: F401  (registration by import)

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry: default SIGPIPE so `| head -1` ends quietly."""
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    app()

