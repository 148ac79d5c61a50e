"""Helpers for the `anatomy serve` tests: real client processes, real or in-thread servers, raw sockets."""

from __future__ import annotations

import base64
import os
import pty
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from typer.testing import CliRunner

from anatomy_cli.cli.app import click_command
from anatomy_cli.cli.main import app
from anatomy_cli.serve import client
from anatomy_cli.serve import lifecycle
from anatomy_cli.serve import protocol

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}
ENV.pop("COLUMNS", None)
ENV.pop(protocol.ENV_SOCKET, None)


def anatomy(*args: str, sock: Path | None, stdin: str | None = None, timeout: float = 180,
            extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the `anatomy` console script in a new process (forwarded to ``sock`` when given)."""
    env = {**ENV, **(extra_env or {})}
    if sock is not None:
        env[protocol.ENV_SOCKET] = str(sock)
    return subprocess.run([sys.executable, "-m", "anatomy_cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=timeout)


def in_process(args: list[str], stdin: str | None = None, stderr: bool = False) -> tuple:
    """The in-process twin: exit code and stdout (and stderr) of the same command line, loading from disk
    (an in-thread server hands its cache to its own worker thread only)."""
    from anatomy_cli.engine.loader import DIRECT
    from anatomy_cli.engine.loader import using_loader

    with using_loader(DIRECT):
        result = CliRunner().invoke(app, args, input=stdin)
    return (result.exit_code, result.stdout, result.stderr) if stderr else (result.exit_code, result.stdout)


def fresh_copy(model: Path, tmp_path: Path, name: str = "m") -> Path:
    """A copy of a model directory under a new path: a server must load it (nothing cached under it)."""
    import shutil

    return Path(shutil.copytree(model, tmp_path / name))


def private_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def start_server(sock: Path, *args: str, log: Path | None = None, wait: float = 120) -> subprocess.Popen:
    """A foreground `anatomy serve --socket SOCK ARGS` process, returned once it answers a handshake."""
    log = log or sock.parent / "server.log"
    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "serve", "--socket", str(sock), *args],
                                env=ENV, stdout=subprocess.DEVNULL, stderr=f)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()}")
        if lifecycle.hello(sock, wait=1.0) is not None:
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start")


def stop(proc: subprocess.Popen, sock: Path) -> None:
    if proc.poll() is None:
        try:
            lifecycle.stop(sock, wait=20)
        except (OSError, protocol.ProtocolError):
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def thread_server(path: Path, **options) -> tuple:
    """An in-process Server serving on a thread: ``(server, thread)``."""
    from anatomy_cli.serve.server import Server
    from anatomy_cli.tasks.notes import cancellable

    srv = Server(path, commands=options.pop("commands", click_command), log=options.pop("log", lambda msg: None),
                 cancellable=cancellable, **options)
    srv.bind()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    return srv, thread


def raw_run(sock: Path, argv: list[str], *, hello: bool = True, timeout: float = 120, stdin: str = "",
            **fields) -> list[dict]:
    """Every message the server sends for one ``run`` request (statuses, then the answer), over a raw socket;
    streamed stderr is folded into the answer's ``stderr``, keep-alives are dropped."""
    conn = protocol.connect(sock)
    conn.settimeout(timeout)
    try:
        if hello:
            protocol.send(conn, {"op": "hello", **protocol.identity()})
            assert protocol.receive(conn)["op"] == "hello"
        request = {**client.build_request(argv, stdin.encode()), **fields}
        protocol.send(conn, request)
        messages, streamed = [], b""
        while not messages or "status" in messages[-1] or "note" in messages[-1]:
            message = protocol.receive(conn)
            if "stream" in message:  # stderr as it was written: folded into the answer's stderr below
                assert message["stream"] == "stderr"
                streamed += base64.b64decode(message["data"])
            elif "keepalive" in message:  # the job still waits or runs (when it took long enough to need one)
                assert set(message) == {"keepalive"}
            else:
                messages.append(message)
        if streamed and "stderr" in messages[-1]:
            messages[-1]["stderr"] = base64.b64encode(streamed + base64.b64decode(messages[-1]["stderr"])).decode()
        return messages
    finally:
        conn.close()


def decoded(answer: dict) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of an answer, with line ends as click's test runner reports them."""
    text = [base64.b64decode(answer[k]).decode().replace("\r\n", "\n") for k in ("stdout", "stderr")]
    return answer["exit_code"], text[0], text[1]


def run_with_tty_stderr(args: list[str], sock: Path, timeout: float = 120) -> tuple[int, str, str]:
    """Run the console script with stderr on a pseudo-terminal (stdout piped): exit code, stdout, stderr."""
    master, slave = pty.openpty()
    env = {**ENV, protocol.ENV_SOCKET: str(sock), "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", *args], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the slave side closed: the process is done
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read().decode()
    proc.wait(timeout=10)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")
