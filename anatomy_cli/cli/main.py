"""Entry point: the `anatomy` console script.

Each command lives in ``anatomy_cli/cli/commands/<name>.py`` and registers itself on
:data:`anatomy_cli.cli.app.app` when imported. Command modules import torch and
transformers lazily (inside the command body) so ``anatomy --help`` and
``anatomy tokens`` start without them.
"""

from __future__ import annotations

import signal

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands import (  # noqa: F401  (registration by import)
    ablate,
    attn,
    attribute,
    convert,
    corpus,
    diff,
    dla,
    drift,
    fit_lens,
    generate,
    heads,
    layernorm,
    lens,
    models,
    next_token,
    params,
    patch,
    report,
    route,
    sae,
    serve,
    steer,
    tokens,
    trace,
    verify,
)

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry: default SIGPIPE so `| head -1` ends quietly."""
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    app()

