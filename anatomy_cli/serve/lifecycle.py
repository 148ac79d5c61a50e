"""Starting a server in the background and stopping one: both return when the change has happened.

Standard library only (no torch): ``serve --detach`` and ``serve --stop`` are as quick as the server allows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from anatomy_cli.serve import protocol


def hello(path: Path, wait: float = 2.0) -> dict[str, object] | None:
    """The handshake answer of the server listening at ``path``, or None when none answers."""
    try:
        conn = protocol.connect(path, timeout=wait)
    except OSError:
        return None
    try:
        protocol.send(conn, {"op": "hello", **protocol.identity()})
        answer = protocol.receive(conn)
    except (OSError, protocol.ProtocolError):
        return None
    finally:
        conn.close()
    return answer if answer.get("op") == "hello" else None


def detach(argv: list[str], path: Path, log: Path, wait: float = 120.0) -> int:
    """Run ``anatomy ARGV`` (a foreground ``serve``) in its own session, its stderr appended to ``log``;
    return its pid once it answers a handshake at ``path`` (it listens before it loads anything).

    Raises RuntimeError with the server's last log line when it exits first or does not answer in ``wait`` s.
    """
    protocol.private_dir(path.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", *argv], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=fd, start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(_last_line(log) or f"the server exited with code {proc.returncode}")
        answer = hello(path, wait=1.0)
        if answer is not None and answer.get("pid") == proc.pid:
            return proc.pid
        time.sleep(0.05)
    raise RuntimeError(f"the server (pid {proc.pid}) did not listen within {wait:g} s; see {log}")


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].removeprefix("error: ") if lines else ""


def stop(path: Path, wait: float = 30.0) -> dict[str, object]:
    """Ask the server at ``path`` to stop and wait until its process has exited; its answer.

    Raises OSError or ProtocolError when no server answers.
    """
    conn = protocol.connect(path)
    try:
        conn.settimeout(wait)
        protocol.send(conn, {"op": "stop"})
        answer = protocol.receive(conn)
        try:
            protocol.receive(conn)  # the server closes the connection once it has shut down
        except (protocol.ProtocolError, OSError):
            pass
    finally:
        conn.close()
    pid = answer.get("pid")
    deadline = time.monotonic() + wait
    while isinstance(pid, int) and pid != os.getpid() and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return answer


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie, exited but not yet reaped by its parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def on_sigterm(stop: Callable[[], None]) -> Callable[[], None]:
    """Make SIGTERM call ``stop`` (from the main thread only; elsewhere nothing); returns what puts it back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop())

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
