"""The `anatomy` console script: forward to a running `anatomy serve`, else run in-process.

Imports nothing heavy before it knows it must: a forwarded command never imports typer, rich,
torch or transformers.
"""

from __future__ import annotations

import signal
import sys


def main() -> None:
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head -1` ends quietly
    argv = sys.argv[1:]
    from anatomy_cli.serve.client import NO_SERVER, forward

    code = forward(argv)
    if code is not None:
        sys.exit(code)
    if NO_SERVER in argv[1:]:
        # Accepted anywhere on the line; the root option is what `--help` documents.
        command_at = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
        argv = [a for i, a in enumerate(argv) if not (a == NO_SERVER and i > command_at)]
    from anatomy_cli.cli.main import app

    app(args=argv)
