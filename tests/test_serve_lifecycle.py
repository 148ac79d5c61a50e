"""`anatomy serve` can be trusted (issue 27): the right server answers, it is ready when started, it ends
cleanly, and a client prints what in-process prints, with the server's progress shown while it happens.

Most cases use an in-thread server (this process already has torch; clients are real `anatomy` processes);
start-up and shutdown use real server processes, which import nothing heavy until their worker starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest
from serve_helpers import anatomy
from serve_helpers import decoded
from serve_helpers import fresh_copy
from serve_helpers import in_process
from serve_helpers import private_dir
from serve_helpers import raw_run
from serve_helpers import run_with_tty_stderr
from serve_helpers import start_server
from serve_helpers import stop
from serve_helpers import thread_server

from anatomy_cli.serve import lifecycle
from anatomy_cli.serve import protocol


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    """``(socket, tiny GPT-2 dir, server)``: an in-thread server with the tiny GPT-2 preloaded."""
    model = tiny_model_dir("gpt2")
    sock = private_dir(tmp_path_factory.mktemp("lifecycle")) / "s.sock"
    srv, thread = thread_server(sock)
    srv.preload([str(model)])
    yield sock, model, srv
    srv.stopping.set()
    thread.join(10)


# ---------------------------------------------------------------- 1. the right server, or none

def test_a_server_of_another_build_is_not_used(tmp_path, tiny_model_dir):
    model = tiny_model_dir("gpt2")
    sock = private_dir(tmp_path) / "old.sock"
    srv, thread = thread_server(sock)
    srv.identity = {**srv.identity, "version": "0.0.9", "digest": "0123456789abcdef", "location": "/old/anatomy_cli"}
    try:
        args = ["trace", "Thank you very", "--model", str(model), "--format", "json"]
        out = anatomy(*args, sock=sock)
        assert (out.returncode, out.stdout) == in_process(args)
        ours = protocol.identity()
        assert out.stderr == (f"anatomy serve at {sock} is version 0.0.9 from /old/anatomy_cli (source 0123456789abcdef), "
                              f"not this version {ours['version']} from {ours['location']} (source {ours['digest']}); "
                              f"running in-process\n")
        assert srv.requests == 0  # it never ran the command
    finally:
        srv.stopping.set()
        thread.join(10)


def test_a_server_without_a_handshake_is_not_used(tmp_path, tiny_model_dir):
    """What a server from before the handshake answers to one: an error. The client runs in-process."""
    sock = private_dir(tmp_path) / "older.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(1)

    def old_server():
        conn, _ = listener.accept()
        with conn:
            protocol.receive(conn)
            protocol.send(conn, {"error": "unknown request 'hello'", "exit_code": 2})

    threading.Thread(target=old_server, daemon=True).start()
    args = ["tokens", "Hello world", "--model", str(tiny_model_dir("gpt2"))]
    out = anatomy(*args, sock=sock)
    listener.close()
    code, stdout, stderr = in_process(args, stderr=True)
    assert (out.returncode, out.stdout) == (code, stdout)
    assert out.stderr == f"anatomy serve at {sock} answers no handshake (an older anatomy); running in-process\n" + stderr


def test_a_run_without_a_handshake_is_refused(served):
    sock, model, _ = served
    [answer] = raw_run(sock, ["trace", "x", "--model", str(model)], hello=False)
    assert answer == {"error": "this anatomy server needs a handshake first (an older anatomy client?); rerun with "
                               "--no-server", "exit_code": 1}


def test_answered_by_shows_on_a_terminal_only(served):
    sock, model, srv = served
    args = ["trace", "Thank you very", "--model", str(model)]
    piped = anatomy(*args, sock=sock)
    assert (piped.returncode, piped.stdout, piped.stderr) == in_process(args, stderr=True)  # nothing extra
    code, out, err = run_with_tty_stderr(args, sock)
    assert (code, out) == in_process(args)
    assert f"\x1b[2manswered by anatomy serve (pid {os.getpid()})\x1b[0m" in err


# ---------------------------------------------------------------- 5. progress while it happens, clean output

def test_status_reaches_the_client_while_the_model_loads(served, tmp_path):
    sock, model, _ = served
    copy = fresh_copy(model, tmp_path)  # not cached: this request loads it
    args = ["trace", "Thank you very", "--model", str(copy)]
    messages = raw_run(sock, args, stderr_isatty=True)
    # the two phases (opening, then loading the weights), before the answer, not replayed after it
    statuses = [m.get("status") for m in messages[:-1]]
    assert statuses[0] == f"opening {copy}" and statuses.index(f"loading {copy}") > 0
    assert messages[-2] == {"status": ""}                # the line cleared when the load ended
    code, out, err = decoded(messages[-1])
    assert (code, out) == in_process(args)
    # Only what the command itself printed: no spinner frames, no transformers bar, no status text.
    assert "loading" not in err and "Loading" not in err and "\r" not in err and "\x1b" not in err


def test_transformers_bars_never_reach_a_client(served, tmp_path):
    from test_gguf import write_tiny_gguf

    sock, _, _ = served
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    args = ["next", "Thank you very", "--model", str(gguf)]
    messages = raw_run(sock, args, stderr_isatty=True)
    assert {"status": f"loading {gguf}"} in messages[:-1]
    code, out, err = decoded(messages[-1])  # (equal to in-process: the other tests; a GGUF vocabulary is slow)
    assert code == 0 and out.startswith("rank\ttoken\ttoken_id\tprobability\tlogprob\n1\t")
    assert "Converting" not in err and "it/s" not in err and "\r" not in err


def test_a_piped_client_prints_what_in_process_prints(served, tmp_path):
    sock, model, _ = served
    copy = fresh_copy(model, tmp_path)
    args = ["next", "The capital of France is", "--model", str(copy), "--k", "3"]
    remote = anatomy(*args, sock=sock)
    assert (remote.returncode, remote.stdout, remote.stderr) == in_process(args, stderr=True)


# ---------------------------------------------------------------- 3. ready when started

def test_status_answers_while_a_model_loads_and_requests_wait(tmp_path, tiny_model_dir):
    from anatomy_cli.engine.loader import DIRECT

    model = fresh_copy(tiny_model_dir("gpt2"), tmp_path)
    gate, loads = threading.Event(), []

    class SlowLoader:  # the server is handed a loader: this one waits at the weights
        open = staticmethod(DIRECT.open)

        @staticmethod
        def load_weights(opened):
            loads.append(opened.spec)
            assert gate.wait(60)
            return DIRECT.load_weights(opened)

    sock = private_dir(tmp_path) / "s.sock"
    srv, thread = thread_server(sock, loader=SlowLoader())
    srv.preload([str(model)])
    try:
        t0 = time.monotonic()
        while not loads:
            assert time.monotonic() - t0 < 30
            time.sleep(0.02)
        status = protocol.request(sock, {"op": "status"}, wait=5)
        assert [(m["model"], m["state"]) for m in status["models"]] == [(str(model), "loading")]
        args = ["trace", "Thank you very", "--model", str(model)]
        got: list = []
        client = threading.Thread(target=lambda: got.append(raw_run(sock, args, stderr_isatty=True)))
        client.start()
        time.sleep(0.5)
        assert not got  # waiting for the load, not loading a copy of its own
        gate.set()
        client.join(60)
        assert got[0][0] == {"status": f"waiting for the server to load {model}…"}
        assert len(loads) == 1
        assert decoded(got[0][-1])[:2] == in_process(args)
    finally:
        gate.set()
        srv.stopping.set()
        thread.join(10)


def test_detach_returns_once_listening_and_the_server_answers(tmp_path, tiny_model_dir):
    model = tiny_model_dir("gpt2")
    sock = private_dir(tmp_path) / "d.sock"
    started = anatomy("serve", "-d", "--model", str(model), "--socket", str(sock), "--idle-timeout", "5", sock=None)
    assert started.returncode == 0, started.stderr
    pid = int(started.stderr.split("(pid ")[1].split(",")[0])
    try:
        assert started.stderr == (f"anatomy server listening on {sock} (pid {pid}, log {sock.parent / 'anatomy.log'}); "
                                  f"stop it with `anatomy serve --stop`\n")
        status = json.loads(anatomy("serve", "--status", "--socket", str(sock), "--format", "json", sock=None).stdout)
        assert status["pid"] == pid and [m["model"] for m in status["models"]] == [str(model)]
        args = ["trace", "Thank you very", "--model", str(model), "--format", "json"]
        out = anatomy(*args, sock=sock)
        assert (out.returncode, out.stdout) == in_process(args)
        assert protocol.request(sock, {"op": "status"})["requests"] == 1  # answered by the server
    finally:
        anatomy("serve", "--stop", "--socket", str(sock), sock=None)
    assert not lifecycle.pid_alive(pid) and not sock.exists()


# ---------------------------------------------------------------- 4. clean shutdown

@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "--stop", "--idle-timeout"])
def test_shutdown_removes_the_socket_and_a_new_server_starts_at_once(tmp_path, how):
    from anatomy_cli.serve.server import Server

    sock = private_dir(tmp_path) / "s.sock"
    proc = start_server(sock, "--idle-timeout", "0.03" if how == "--idle-timeout" else "30")
    try:
        if how.startswith("SIG"):
            proc.send_signal(getattr(signal, how))
            proc.wait(timeout=30)
        elif how == "--stop":
            out = anatomy("serve", "--stop", "--socket", str(sock), sock=None)
            assert out.returncode == 0 and out.stderr.startswith("stopped the anatomy server")
            assert proc.poll() is not None  # --stop returned once the server had exited
        else:
            proc.wait(timeout=60)
    finally:
        stop(proc, sock)
    assert not sock.exists()
    logged: list[str] = []
    again = Server(sock, commands=lambda: None, log=logged.append)
    again.bind()  # at once: no live server, no stale socket in the way
    again.close()
    assert logged == []


def test_detach_beside_a_live_server_is_one_error_line(served):
    sock, _, _ = served
    out = anatomy("serve", "-d", "--socket", str(sock), sock=None)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"error: cannot serve at {sock}: an anatomy server is already listening at {sock}\n"
