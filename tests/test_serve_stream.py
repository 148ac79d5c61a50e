"""`anatomy serve` streams a forwarded command's stderr as it is written (new-user trial: a forwarded `fit-lens`
printed its "expected cost" line only with its result, 5 minutes late)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

import click
import pytest
from serve_helpers import ENV
from serve_helpers import anatomy
from serve_helpers import private_dir
from serve_helpers import thread_server

from anatomy_cli.serve import protocol


def _first_line(pipe, seconds: float) -> tuple[bytes, float]:
    """The first line read from ``pipe`` within ``seconds`` and when it arrived (``time.monotonic()``)."""
    data, deadline = b"", time.monotonic() + seconds
    while b"\n" not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([pipe], [], [], 0.1)
        if ready:
            chunk = os.read(pipe.fileno(), 4096)
            if not chunk:
                break
            data += chunk
    return data, time.monotonic()


def test_stderr_reaches_the_client_before_the_command_ends(tmp_path):
    # The server runs a command that writes a note, then blocks until the test releases it: the client's stderr
    # has the note while the command still runs (its process has not exited), stdout follows at the end.
    release, started = threading.Event(), threading.Event()

    @click.command(context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def blocking(args):
        started.set()
        print("note: expected cost: 5 min", file=sys.stderr, flush=True)
        assert release.wait(60), "the test never released the command"
        print("warning: a second line", file=sys.stderr)
        print("the result")

    sock = private_dir(tmp_path) / "s.sock"
    srv, thread = thread_server(sock, commands=lambda: blocking)
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "trace", "x", "--model", "m"],
                            env={**ENV, protocol.ENV_SOCKET: str(sock)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        line, _ = _first_line(proc.stderr, 90)
        assert line == b"note: expected cost: 5 min\n"
        assert started.is_set() and not release.is_set() and proc.poll() is None  # the command still runs
        release.set()
        out, rest = proc.communicate(timeout=60)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
        srv.stopping.set()
        thread.join(10)
    assert proc.returncode == 0
    assert out == b"the result\n"
    assert rest == b"warning: a second line\n"


@pytest.mark.usefixtures("cached_load")
def test_served_stderr_is_the_in_process_stderr(tmp_path, tiny_model_dir):
    # A normal command with a note on stderr: the same bytes, served and in-process, on both streams.
    model = tiny_model_dir("gpt2")
    sock = private_dir(tmp_path) / "s.sock"
    srv, thread = thread_server(sock)
    try:
        args = ["next", "Thank you very", "--model", str(model), "--target", "much", "--k", "3"]
        served = anatomy(*args, sock=sock)
        local = anatomy(*args, "--no-server", sock=None)
        assert srv.requests == 1  # the first was answered by the server
    finally:
        srv.stopping.set()
        thread.join(10)
    assert local.returncode == 0 and "note: --target 'much' is much (29482)" in local.stderr
    assert (served.returncode, served.stdout, served.stderr) == (local.returncode, local.stdout, local.stderr)
