"""Running a command in-process with stderr on a pseudo-terminal, as a user's shell shows it."""

from __future__ import annotations

import io
import os
import pty
import re
import sys
import threading

from anatomy_cli.cli.main import app

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(args, monkeypatch) -> tuple[str, str]:
    """Run ``args`` in-process with stdout captured and stderr on a pseudo-terminal: (stdout, what the terminal
    showed, its control sequences kept: ``ANSI`` strips them). Undoes ``monkeypatch`` at the end."""
    master, slave = pty.openpty()
    seen = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    out = io.StringIO()
    with os.fdopen(slave, "w", buffering=1, encoding="utf-8") as terminal:
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", terminal)
        app(args, standalone_mode=False)
        monkeypatch.undo()
    reader.join(timeout=10)
    os.close(master)
    return out.getvalue(), seen.decode(errors="replace")
