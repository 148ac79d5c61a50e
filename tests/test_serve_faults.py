"""`anatomy serve` survives faults and bad input (issue 27): a killed client, a killed server, malformed
requests. Each gives the documented behaviour, and the next request gets a correct answer."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
from serve_helpers import ENV
from serve_helpers import anatomy
from serve_helpers import decoded
from serve_helpers import fresh_copy
from serve_helpers import in_process
from serve_helpers import private_dir
from serve_helpers import raw_run
from serve_helpers import start_server
from serve_helpers import stop
from serve_helpers import thread_server

from anatomy_cli.serve import client
from anatomy_cli.serve import protocol


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    model = tiny_model_dir("gpt2")
    sock = private_dir(tmp_path_factory.mktemp("faults")) / "s.sock"
    srv, thread = thread_server(sock)
    srv.preload([str(model)])
    yield sock, model, srv
    srv.stopping.set()
    thread.join(10)


def answered_correctly(sock, model) -> None:
    args = ["trace", "Thank you very", "--model", str(model), "--format", "json"]
    [answer] = raw_run(sock, args)
    assert decoded(answer)[:2] == in_process(args)


def wait_until_loading(sock, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(m["state"] == "loading" for m in protocol.request(sock, {"op": "status"})["models"]):
            return
        time.sleep(0.01)
    raise AssertionError("the server never started loading")


# ---------------------------------------------------------------- bad input on the socket

def framed(payload: bytes) -> bytes:
    return struct.pack(">Q", len(payload)) + payload


def exchange(sock, data: bytes, hello: bool = True) -> dict | None:
    """Send raw bytes (after a handshake); the server's answer, or None when it closed the connection."""
    conn = protocol.connect(sock)
    conn.settimeout(30)
    try:
        if hello:
            protocol.send(conn, {"op": "hello", **protocol.identity()})
            protocol.receive(conn)
        conn.sendall(data)
        return protocol.receive(conn)
    except protocol.ProtocolError:
        return None
    finally:
        conn.close()


@pytest.mark.parametrize("data, error", [
    (framed(b"not json"), "bad request: not a JSON message"),
    (framed(b"\xff\xfe"), "bad request: not a JSON message"),
    (framed(b"[1, 2]"), "bad request: not a JSON object"),
    (struct.pack(">Q", 1 << 40) + b"{}", "bad request: message of 1099511627776 bytes is over the 268435456-byte limit"),
    (framed(b'{"op": 42}'), "unknown request '42'"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "priority": "high"}).encode()),
     "unknown field(s) in the request: priority"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "argv": "trace x"}).encode()),
     "request field 'argv' must be a JSON list"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "argv": ["trace", 1]}).encode()),
     "request field 'argv' must be a list of strings"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "keepalive_s": "5"}).encode()),
     "request field 'keepalive_s' must be a JSON number"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "keepalive_s": 0}).encode()),
     "request field 'keepalive_s' must be a positive number of seconds"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "stdin": "%%%"}).encode()),
     "request field 'stdin' is not base64"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "stdout_encoding": "klingon"}).encode()),
     "unknown encoding 'klingon' in 'stdout_encoding'"),
    (framed(json.dumps({**client.build_request(["trace", "x"]), "cwd": "/no/such/dir"}).encode()),
     "the client's working directory /no/such/dir is not a directory the server can enter"),
])
def test_malformed_requests_get_an_error_and_the_server_carries_on(served, data, error):
    sock, model, _ = served
    answer = exchange(sock, data)
    assert answer is not None and answer["error"].startswith(error) and answer["exit_code"] == 2
    answered_correctly(sock, model)


def test_half_a_message_then_gone(served):
    sock, model, _ = served
    conn = protocol.connect(sock)
    conn.sendall(struct.pack(">Q", 256) + b'{"op"')  # a header promising 256 bytes, then gone
    conn.close()
    conn = protocol.connect(sock)
    conn.sendall(b"\x00\x00")  # not even a header
    conn.close()
    answered_correctly(sock, model)


def test_a_request_naming_files_it_cannot_read(served, tmp_path):
    """Files named in a request are opened by the server as the requesting user (the peer's uid is checked),
    so what the client could not read fails exactly as it fails in-process, and the server carries on."""
    sock, model, _ = served
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    cases = [["trace", "x", "--model", str(tmp_path / "missing")],
             ["trace", "x", "--model", str(tmp_path / "missing.gguf")],
             ["trace", "x", "--model", str(tmp_path / "notes.txt")],
             ["trace", "x", "--model", str(tmp_path / "empty")],
             ["trace", "x", "--model", str(model), "--plot", str(tmp_path / "no" / "such" / "dir" / "p.png")]]
    locked = fresh_copy(model, tmp_path, "locked")
    os.chmod(locked / "config.json", 0)
    if os.getuid() != 0:  # root reads a mode-0 file anyway
        cases.append(["trace", "x", "--model", str(locked)])
    try:
        for args in cases:
            [answer] = raw_run(sock, args)
            code, out, err = decoded(answer)
            assert (code, out, err) == in_process(args, stderr=True), args
            assert code in (1, 2) and err.startswith("error: ") and err.count("\n") == 1, (args, err)
    finally:
        os.chmod(locked / "config.json", 0o644)
    answered_correctly(sock, model)


# ---------------------------------------------------------------- killed processes

def test_a_client_killed_mid_request(served, tmp_path):
    sock, model, srv = served
    copy = fresh_copy(model, tmp_path)  # its load takes long enough to kill the client meanwhile
    env = {**ENV, protocol.ENV_SOCKET: str(sock)}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "trace", "Thank you very", "--model", str(copy)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_loading(sock)
    proc.kill()
    proc.wait()
    answered_correctly(sock, copy)  # the load it started finished and serves the next request
    answered_correctly(sock, model)


def test_a_server_killed_mid_request(tmp_path, tiny_model_dir):
    model = fresh_copy(tiny_model_dir("gpt2"), tmp_path)
    sock = private_dir(tmp_path) / "s.sock"
    server = start_server(sock)
    args = ["trace", "Thank you very", "--model", str(model), "--format", "json"]
    env = {**ENV, protocol.ENV_SOCKET: str(sock)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        wait_until_loading(sock)
        server.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
    # Documented: one line, exit 1, nothing on stdout; the stale socket stays until the next server.
    assert (proc.returncode, out) == (1, "")
    assert err == (f"error: the anatomy server at {sock} closed the connection before answering (did it stop or "
                   f"crash?); rerun with --no-server\n")
    assert sock.exists()
    again = start_server(sock)  # replaces the stale socket at once
    try:
        remote = anatomy(*args, sock=sock)
        assert (remote.returncode, remote.stdout) == in_process(args)
        assert "replacing a stale socket" in (sock.parent / "server.log").read_text()
    finally:
        stop(again, sock)


def test_a_connection_from_a_plain_socket_probe(served):
    """Connecting and closing at once (what `serve` does to find a live server) is not an error."""
    sock, model, _ = served
    for _ in range(3):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(sock))
        probe.close()
    answered_correctly(sock, model)
