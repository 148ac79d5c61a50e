"""The client side of `anatomy serve`: forward a command line to a running server.

Standard library only, so a forwarded command starts without typer, rich, torch or transformers.
The console script (:mod:`anatomy_cli.cli.entry`) calls :func:`forward` first; it returns None when the
command should run in-process: ``--no-server`` was given, the command loads no weights, or no server
answers on the default socket, or the server that answers is another build (the handshake). With
``$ANATOMY_SERVER`` set, a server that does not answer is an error.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import sys
from typing import cast

from anatomy_cli.declare.commands import BY_NAME
from anatomy_cli.declare.commands import COMMANDS
from anatomy_cli.declare.commands import forwarded
from anatomy_cli.errors import quiet_broken_pipe
from anatomy_cli.serve import protocol

# Which commands a running server answers is each command's record (anatomy_cli/declare/commands.py: its
# needs and Serve policy); `anatomy serve --help` names them, tests/test_serve.py checks docs/serve.md against it.
FORWARDED = tuple(c.name for c in forwarded())
NO_SERVER = "--no-server"
INTERRUPTED = 130  # Ctrl-C's exit code, as in-process (cli/app.py)
PROGRESS = ("status", "stream", "note", "keepalive")  # the messages before a run's answer
_ROOT_FLAGS = {"--debug", NO_SERVER}
# What rendering and loading read from the environment; the server runs each request under the client's.
ENV_KEYS = ("COLUMNS", "LINES", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "ANATOMY_DEBUG", "ANATOMY_STATUS",
            "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "TIKTOKEN_CACHE_DIR",
            "ANATOMY_CACHE_DIR", "PYTHONIOENCODING", "ANATOMY_MODEL", "ANATOMY_CONFIG_DIR", "XDG_CONFIG_HOME")


def command_of(argv: list[str]) -> str | None:
    """The subcommand name in ``argv`` (after root flags such as --debug), or None."""
    for arg in argv:
        if arg in _ROOT_FLAGS:
            continue
        return None if arg.startswith("-") else arg
    return None


def wants_server(argv: list[str]) -> bool:
    """True when ``argv`` names a command a server answers (its record), without --no-server or --help."""
    command = command_of(argv)
    record = BY_NAME.get(command or "")
    if record is None or NO_SERVER in argv or "--help" in argv or "-h" in argv:
        return False
    return record.forwards({a.split("=", 1)[0] for a in argv})


def not_forwarded() -> list[str]:
    """``corpus --ray: its Ray workers load their own copies of the model``: what a server never answers."""
    return [line for line in (c.not_forwarded for c in COMMANDS) if line]


def forwarded_names() -> str:
    """``trace, next, ..., attribute and tokens --model``: the forwarded commands in words, for help text."""
    names = [c.forwarded_name for c in forwarded()]
    return ", ".join(names[:-1]) + " and " + names[-1]


def build_request(argv: list[str], stdin: bytes | None = None,
                  wait: float = protocol.DEFAULT_TIMEOUT) -> protocol.RunRequest:
    """The ``run`` request: arguments, working directory, terminal facts, environment and stdin (for '-';
    read from this process's stdin unless given), and how often the server must send a keep-alive meanwhile
    (for a client that gives up after ``wait`` silent seconds)."""
    env = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
    stdout_tty = sys.stdout.isatty()
    if stdout_tty and "COLUMNS" not in env:
        # In-process, rich asks the terminal; the server has none, so it gets the answer instead.
        size = shutil.get_terminal_size()
        env["COLUMNS"], env["LINES"] = str(size.columns), str(size.lines)
    if stdin is None:
        stdin = sys.stdin.buffer.read() if "-" in argv[1:] and not sys.stdin.isatty() else b""
    return {"op": "run", "argv": argv, "cwd": os.getcwd(), "env": env,
            "stdout_isatty": stdout_tty, "stderr_isatty": sys.stderr.isatty(),
            "stdout_encoding": sys.stdout.encoding or "utf-8", "stderr_encoding": sys.stderr.encoding or "utf-8",
            # What the streams do with a character their encoding lacks (stderr: backslashreplace): the server's
            # captured streams do the same, so the bytes are the in-process ones.
            "stdout_errors": sys.stdout.errors or "strict", "stderr_errors": sys.stderr.errors or "strict",
            "stdin": base64.b64encode(stdin).decode("ascii"),
            # stderr as the command writes it (notes, warnings, the cost line), not only with the answer.
            "stream_stderr": True,
            # A message at least this often while the job waits or runs (printed or not: a keep-alive is not).
            "keepalive_s": protocol.keepalive_interval(wait)}


def forward(argv: list[str]) -> int | None:
    """Run ``argv`` on the server and write its output here; the exit code, or None to run in-process.

    In-process (None) when the command loads no weights, ``--no-server`` was given, no server answers on the
    default socket, or the server that answers is another build (:func:`protocol.mismatch`; one line on
    stderr says so). Ctrl-C ends it as it ends an in-process command: ``interrupted`` on stderr, exit 130;
    the connection closes, so the server cancels the job (at its next step).
    """
    if not wants_server(argv):
        return None
    try:
        return _forward(argv)
    except KeyboardInterrupt:  # the connection is closed by now (_forward's finally): the server cancels
        with contextlib.suppress(OSError):
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        return INTERRUPTED


def _forward(argv: list[str]) -> int | None:
    path, explicit = protocol.socket_path()
    try:
        if not explicit:
            protocol.check_private(path.parent)
        conn = protocol.connect(path)
    except (OSError, PermissionError) as exc:
        if not explicit:
            return None  # no server (or a stale socket): run in-process
        print(f"error: no anatomy server answers at {path} ({protocol.ENV_SOCKET}): {exc.strerror or exc}; "
              f"start one with `anatomy serve` or unset {protocol.ENV_SOCKET}", file=sys.stderr)
        return 1
    try:
        timeout = protocol.timeout()
    except ValueError as exc:
        conn.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    line = StatusLine(sys.stderr)
    try:
        conn.settimeout(min(timeout, 30.0))
        ours = protocol.identity()
        protocol.send(conn, {"op": "hello", **ours})
        theirs = protocol.receive(conn)
        why = protocol.mismatch(ours, theirs) if theirs.get("op") == "hello" else "answers no handshake (an " \
            "older anatomy)"
        if why:
            print(f"anatomy serve at {path} {why}; running in-process", file=sys.stderr)
            return None
        # The timeout is for a server that went silent: while the job waits or runs, a keep-alive comes at
        # least every keepalive_interval(timeout) seconds, so a long job never runs into it.
        conn.settimeout(timeout)
        protocol.send(conn, build_request(argv, wait=timeout))
        answer = _await_answer(conn, line)
    except TimeoutError:
        line.clear()
        print(f"error: the anatomy server at {path} sent nothing for {timeout:g} s ({protocol.ENV_TIMEOUT}), "
              f"not even a keep-alive: is it hung? rerun with --no-server", file=sys.stderr)
        return 1
    except (protocol.ProtocolError, OSError):
        line.clear()
        print(f"error: the anatomy server at {path} closed the connection before answering (did it stop or "
              f"crash?); rerun with --no-server", file=sys.stderr)
        return 1
    finally:
        line.clear()
        conn.close()
    if "error" in answer:
        print(f"error: {answer['error']}", file=sys.stderr)
        return int(answer.get("exit_code", 1))
    code = write_answer(answer)
    line.note(f"answered by anatomy serve (pid {theirs.get('pid')})")
    return code


def _await_answer(conn: socket.socket, line: StatusLine) -> protocol.RunAnswer | protocol.Refusal:
    """Show the server's progress messages until the answer comes (the handshake said the server is this
    anatomy: its answer is what serve/connections.py ``_await`` returns)."""
    answer = protocol.receive(conn)
    while any(key in answer for key in PROGRESS):
        if "status" in answer:  # what the server is doing for us now: a terminal's status line
            line.show(str(answer["status"]))
        elif "stream" in answer:  # what the command wrote to stderr just now
            line.write(base64.b64decode(str(answer.get("data") or "")))
        elif "note" in answer:  # a line that stays (waiting behind another command, said off a terminal)
            line.clear()
            print(str(answer["note"]), file=sys.stderr, flush=True)
        # else a keep-alive: the job still waits or runs; nothing to print
        answer = protocol.receive(conn)
    return cast("protocol.RunAnswer | protocol.Refusal", answer)


class StatusLine:
    """One dim, self-erasing line on a terminal's stderr; nothing at all when stderr is not a terminal."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self.dim = ("\x1b[2m", "\x1b[0m") if not os.environ.get("NO_COLOR") else ("", "")
        self.shown = False
        self.text = ""  # the line's text, shown again below what the command writes meanwhile

    def show(self, text: str) -> None:
        self.text = text
        if not self.tty:
            return
        width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be erased with \r
        text = text if len(text) <= width else text[:max(width - 1, 0)] + "…"
        self.stream.write(f"\r\x1b[2K{self.dim[0]}{text}{self.dim[1]}" if text else "\r\x1b[2K")
        self.stream.flush()
        self.shown = bool(text)

    def clear(self) -> None:
        if self.shown:
            self.show("")

    def write(self, data: bytes) -> None:
        """Bytes the command wrote to stderr, above the status line (drawn again after a whole line)."""
        if self.shown:
            self.stream.write("\r\x1b[2K")
            self.shown = False
        try:
            self.stream.flush()
            self.stream.buffer.write(data)
            self.stream.buffer.flush()
        except BrokenPipeError:
            return
        if self.tty and self.text and data.endswith(b"\n"):
            self.show(self.text)

    def note(self, text: str) -> None:
        """A dim line that stays (after the answer)."""
        if self.tty:
            self.stream.write(f"{self.dim[0]}{text}{self.dim[1]}\n")
            self.stream.flush()


def write_answer(answer: protocol.RunAnswer) -> int:
    """Write the server's stdout and stderr bytes here; the command's exit code."""
    for text, stream in ((answer.get("stdout"), sys.stdout), (answer.get("stderr"), sys.stderr)):
        data = base64.b64decode(text or "")
        if data:
            try:
                stream.flush()
                stream.buffer.write(data)
                stream.buffer.flush()
            except BrokenPipeError:
                quiet_broken_pipe()
                return 0
    return int(answer.get("exit_code", 1))
