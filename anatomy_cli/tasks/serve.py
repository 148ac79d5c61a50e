"""`serve`: a local server that keeps models loaded (the command's options; the server is anatomy_cli/serve).
The job ids of ``--cancel`` are the command's positional arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError

COMMAND = "serve"


@dataclass(frozen=True)
class ServeOptions(Declared):
    """``models``: loaded once listening; ``socket``: where to listen (None: $ANATOMY_SERVER, else the
    default); ``max_memory_gb``: the loaded weights' budget (None: no limit); ``idle_timeout``: minutes without
    a request before it stops. ``status``, ``stop``, ``cancel`` and ``detach``: what to do instead of serving in
    the foreground, at most one."""

    models: tuple[str, ...] = option(
        (), "--model", "-m", metavar="MODEL", show_default=False, cli=Optional[list[str]],
        help="Load this model once listening (repeatable); others load on first use.")
    socket: Path | None = option(
        None, "--socket", metavar="PATH", show_default=False,
        help="Socket to listen on. Default: $ANATOMY_SERVER, else $XDG_RUNTIME_DIR/anatomy/anatomy.sock, "
             "else /tmp/anatomy-UID/anatomy.sock.")
    max_memory_gb: float | None = option(
        None, "--max-memory-gb", metavar="GB", min=0.0, show_default=False,
        help="Keep loaded models under this many GB of weights; the least recently used goes first. "
             "Default: no limit.")
    idle_timeout: float = option(30.0, "--idle-timeout", metavar="MINUTES", min=0.0,
                                 help="Stop after this many minutes without a request.")
    status: bool = option(False, "--status",
                          help="Show the running server's models, memory and uptime, then exit.")
    stop: bool = option(False, "--stop", help="Stop the running server; returns once it has exited.")
    cancel: bool = option(False, "--cancel",
                          help="End the server's running and queued commands (those IDs only, from serve "
                          "--status): a queued one never runs, a running one stops at its next step.")
    detach: bool = option(False, "--detach", "-d",
                          help="Run the server in the background (its log: anatomy.log beside the socket); "
                          "return as soon as it listens, before the models have loaded.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if sum((self.status, self.stop, self.detach, self.cancel)) > 1:
            raise UsageError("--status, --stop, --cancel and --detach exclude each other")
