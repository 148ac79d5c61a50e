"""The server's run requests as jobs: what `serve --status` lists, `serve --cancel` ends, and a waiting client
is told about; and how a server notices that a client has gone.

Standard library only (the server listens before torch is imported).
"""

from __future__ import annotations

import contextlib
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field

from anatomy_cli.serve.protocol import JobRow

POLL_S = 0.2       # how often a connection's thread looks at its client while the job waits or runs
NOTE_AFTER_S = 2.0  # a client whose stderr is not a terminal is told it waits once it has waited this long
SHOWN_CHARS = 120   # a command line in a message is cut to this many characters


@dataclass
class Job:
    """One run request: its ``id``, command line, when it was queued and started (``time.time()``), and the
    reason it was cancelled (None: it was not)."""

    id: int
    argv: list[str]
    queued: float = field(default_factory=time.time)
    started: float | None = None
    cancel: str | None = None
    shown: str = ""       # the "waiting for …" status line shown to its client (cleared as it starts)
    noted: bool = False   # the one "waiting for …" line written to a piped stderr
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def command(self, limit: int | None = None) -> str:
        text = shlex.join(["anatomy", *self.argv])
        return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"

    def row(self) -> JobRow:
        since = self.started if self.started is not None else self.queued
        return {"id": self.id, "command": self.command(), "state": "running" if self.started else "queued",
                "since": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since)),
                "for_s": round(time.time() - since, 1), "cancelling": self.cancel is not None}

    def waiting_text(self) -> str:
        """What a client queued behind this (running) job is told."""
        ran = time.time() - (self.started or self.queued)
        return (f"waiting for job {self.id}, `{self.command(SHOWN_CHARS)}`, running for {ran:.0f} s "
                f"(`anatomy serve --cancel {self.id}` ends it)")


def client_gone(conn: socket.socket) -> bool:
    """True when the client closed its end (or it broke): after its request a client sends nothing more, so a
    readable socket that yields no byte is one that was closed."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


@contextlib.contextmanager
def never_cancelled(check: Callable[[], str | None]) -> Iterator[None]:
    """The default ``cancellable`` hook: a server handed none cannot stop a running command (a queued job that
    is cancelled still never runs)."""
    yield
