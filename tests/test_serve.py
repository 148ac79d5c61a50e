"""`anatomy serve`: forwarded commands print exactly what they print in-process.

One real server subprocess (tiny GPT-2) serves the module; clients are real `anatomy` processes.
Fault cases use small in-process servers or fake peers so they need no second model load.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.app import click_command
from anatomy_cli.cli.main import app
from anatomy_cli.serve import client
from anatomy_cli.serve import protocol

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}
ENV.pop("COLUMNS", None)


def anatomy(*args: str, sock: Path | None, stdin: str | None = None, timeout: float = 120,
            extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, **(extra_env or {})}
    env.pop(protocol.ENV_SOCKET, None)
    if sock is not None:
        env[protocol.ENV_SOCKET] = str(sock)
    return subprocess.run([sys.executable, "-m", "anatomy_cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=timeout)


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read()}")
        try:
            protocol.connect(path, timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("server did not start")


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    """``(socket path, model dir)``: a real `anatomy serve` subprocess with the tiny GPT-2 preloaded."""
    model = tiny_model_dir("gpt2")
    folder = tmp_path_factory.mktemp("serve")
    os.chmod(folder, 0o700)
    sock = folder / "run" / "anatomy.sock"
    env = {k: v for k, v in ENV.items() if k != protocol.ENV_SOCKET}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "serve", "--socket", str(sock), "--model",
                             str(model), "--idle-timeout", "10"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(sock, proc)
        yield sock, model
    finally:
        if proc.poll() is None:
            anatomy("serve", "--stop", "--socket", str(sock), sock=None)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


runner = CliRunner()


def in_process(args: list[str], stdin: str | None = None):
    result = runner.invoke(app, args, input=stdin)
    return result.exit_code, result.stdout


def mixed_commands(model: Path) -> list[tuple[list[str], str | None]]:
    m = ["--model", str(model)]
    return [
        (["trace", "Thank you very", *m], None),
        (["trace", "Thank you very", *m, "--format", "json"], None),
        (["next", "The capital of France is", *m, "--k", "3"], None),
        (["next", "-", *m, "--format", "jsonl"], "Thank you very\nOne, two, three,\n"),
        (["tokens", "Hello world", *m], None),
        (["drift", "bank", *m, "--format", "json"], None),
        (["trace", "a b c d", *m, "--position", "1", "--format", "csv"], None),
        (["next", "x", *m, "--target", "much more"], None),   # a usage error: exit 2, stdout empty
    ]


# ---------------------------------------------------------------- the socket and its permissions

def test_socket_and_directory_are_private(server):
    sock, _ = server
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_ISSOCK(sock.stat().st_mode)


def test_open_directory_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(PermissionError, match="open to other users"):
        protocol.private_dir(open_dir)


def test_other_users_are_refused(monkeypatch, tmp_path):
    from anatomy_cli.serve.server import Server

    srv = Server(tmp_path / "s.sock", commands=click_command)
    monkeypatch.setattr(protocol, "peer_uid", lambda conn: os.getuid() + 1)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    worker = threading.Thread(target=srv._handle, args=(ours,))
    worker.start()
    answer = protocol.receive(theirs)  # refused before any request is read
    worker.join(5)
    assert answer == {"error": "refused: this anatomy server serves its own user only", "exit_code": 1}


# ---------------------------------------------------------------- forwarded == in-process

def test_forwarded_output_is_byte_identical(server, cached_load):
    sock, model = server
    for args, stdin in mixed_commands(model):
        remote = anatomy(*args, sock=sock, stdin=stdin)
        code, out = in_process(args, stdin)
        assert (remote.returncode, remote.stdout) == (code, out), args
    err = anatomy("next", "x", "--model", str(model), "--target", "much more", sock=sock)
    assert err.returncode == 2 and err.stderr.count("\n") == 1
    assert err.stderr.startswith("error: --target 'much more' is 2 tokens")


def test_bad_requests_fail_as_in_process(server):
    sock, model = server
    for args in (["trace", "", "--model", str(model)], ["trace", "x", "--model", str(model / "missing")]):
        remote = anatomy(*args, sock=sock)
        local = anatomy(*args, "--no-server", sock=sock)
        assert (remote.returncode, remote.stdout, remote.stderr) == (local.returncode, local.stdout, local.stderr)
        assert remote.returncode in (1, 2) and remote.stderr.startswith("error: ")


def test_sixteen_concurrent_clients(server, cached_load):
    sock, model = server
    jobs = mixed_commands(model) * 2
    with ThreadPoolExecutor(16) as pool:
        remote = list(pool.map(lambda job: anatomy(*job[0], sock=sock, stdin=job[1]), jobs))
    for (args, stdin), got in zip(jobs, remote):
        assert (got.returncode, got.stdout) == in_process(args, stdin), args


def test_no_hooks_survive_an_intervention(server):
    sock, model = server
    m = ["--model", str(model)]
    first = anatomy("trace", "Thank you very", *m, "--format", "json", sock=sock)
    if "ablate" in app.registered_commands.__repr__() or any(c.name == "ablate" for c in app.registered_commands):
        ablate = anatomy("ablate", "Thank you very", *m, "--target", " much", sock=sock)
        assert ablate.returncode == 0, ablate.stderr
    # A command that raises mid-forward must not leave hooks either.
    anatomy("trace", "x" * 10, *m, "--position", "99", sock=sock)
    again = anatomy("trace", "Thank you very", *m, "--format", "json", sock=sock)
    assert first.returncode == 0 and again.stdout == first.stdout


def test_status_lists_the_loaded_model(server):
    sock, model = server
    anatomy("trace", "x", "--model", str(model), sock=sock)  # the preload has finished once this is answered
    out = anatomy("serve", "--status", "--socket", str(sock), "--format", "json", sock=None)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["pid"] > 0 and status["uptime_s"] >= 0 and status["requests"] >= 1
    assert [m["model"] for m in status["models"]] == [str(model.resolve())]
    row = status["models"][0]
    assert row["bytes"] == 4 * 1_635_744   # tiny GPT-2 (tests/models.py), fp32
    # Where it actually runs, not the option's value ("auto"); the spec in its JSON form.
    assert (row["state"], row["device"], row["reloads"]) == ("ready", "cpu", 0)
    assert row["spec"] == {"model": str(model), "device": "auto", "dtype": "fp32", "init": "pretrained",
                           "trust_remote_code": False, "device_map": None, "max_memory": None, "offload_folder": None}
    assert status["version"] == protocol.identity()["version"] and status["digest"] == protocol.identity()["digest"]


def test_client_path_imports_no_torch(server):
    sock, model = server
    code = ("import sys\nfrom anatomy_cli.cli.entry import main\n"
            f"sys.argv = ['anatomy', 'trace', 'Thank you very', '--model', {str(model)!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'typer', 'rich') if m in sys.modules)\n"
            "print('HEAVY', heavy, code, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**ENV, protocol.ENV_SOCKET: str(sock)}, timeout=60)
    assert "HEAVY [] 0" in out.stderr, out.stderr
    assert out.stdout.startswith("layer\tcos_to_embedding")


# ---------------------------------------------------------------- faults

def _fake_server(path: Path, behaviour: str) -> threading.Thread:
    """A peer that accepts one request and then closes (``die``) or never answers (``hang``)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        protocol.receive(conn)
        if behaviour == "hang":
            time.sleep(3)
        conn.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("behaviour", ["die", "hang"])
def test_server_gone_mid_request_is_one_line(tmp_path, behaviour):
    sock = tmp_path / "fake.sock"
    _fake_server(sock, behaviour)
    out = anatomy("trace", "hello", sock=sock, extra_env={protocol.ENV_TIMEOUT: "1"})
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: the anatomy server at ")
    assert ("sent nothing for 1 s (ANATOMY_SERVER_TIMEOUT), not even a keep-alive" if behaviour == "hang"
            else "closed the connection") in out.stderr


def test_explicit_server_that_is_not_there(tmp_path):
    out = anatomy("trace", "hello", sock=tmp_path / "none.sock")
    assert out.returncode == 1 and out.stderr.startswith("error: no anatomy server answers at ")


def test_client_that_vanishes_does_not_stop_the_server(server):
    sock, model = server
    half = protocol.connect(sock)
    half.sendall(b"\x00\x00\x00\x00\x00\x00\x01\x00{")  # a header promising 256 bytes, then gone
    half.close()
    gone = protocol.connect(sock)
    protocol.send(gone, client.build_request(["trace", "Thank you very", "--model", str(model)]))
    gone.close()  # before the answer
    out = anatomy("trace", "Thank you very", "--model", str(model), sock=sock)
    assert out.returncode == 0 and out.stdout.startswith("layer\t")


def test_stale_socket_is_replaced_and_idle_server_stops(tmp_path):
    from anatomy_cli.serve.server import Server

    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "a.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # a socket file nobody listens on: what a crashed server leaves
    srv = Server(path, commands=click_command, idle_timeout=0.5, log=lambda msg: None)
    srv.bind()
    t0 = time.monotonic()
    srv.serve_forever()
    assert 0.4 < time.monotonic() - t0 < 10
    assert not path.exists()


def test_live_server_is_not_replaced(server):
    from anatomy_cli.serve.server import Server

    sock, _ = server
    with pytest.raises(OSError, match="already listening"):
        Server(sock, commands=click_command, log=lambda msg: None).bind()


def test_which_commands_are_forwarded(monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\ntwo\n")))
    assert client.wants_server(["trace", "x"]) and client.wants_server(["--debug", "next", "x"])
    assert not client.wants_server(["trace", "x", "--no-server"])
    assert not client.wants_server(["params"]) and not client.wants_server(["trace", "--help"])
    assert not client.wants_server(["tokens", "hi"]) and client.wants_server(["tokens", "hi", "--model", "gpt2"])
    assert not client.wants_server(["fit-lens", "jacobian", "--prompts", "p.txt", "--out", "j.pt", "--ray"])
    assert client.wants_server(["fit-lens", "jacobian", "--prompts", "p.txt", "--out", "j.pt"])
    request = client.build_request(["next", "-"])
    assert request["op"] == "run" and base64.b64decode(request["stdin"]) == b"one\ntwo\n"
    assert client.build_request(["next", "x"])["stdin"] == ""  # stdin is read only for '-'


def test_the_forwarded_commands_are_one_list_that_the_docs_and_the_help_name():
    # docs/serve.md names the weight-loading commands a server answers; they are client.FORWARDED, in order.
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text(encoding="utf-8")
    listed = re.search(r"the\s+weight-loading\s+commands\s+\(([^)]*)\)", doc).group(1)
    named = re.findall(r"`([^`]+)`", listed)
    from anatomy_cli.declare.commands import forwarded

    assert named == [c.forwarded_name for c in forwarded()]
    commands = click_command().commands
    assert set(client.FORWARDED) <= set(commands)  # each one is a command of the app
    for c in forwarded():
        only = c.serve.only_with[:1] if c.serve else ()
        assert client.wants_server([c.name, "x", *((only[0], "m") if only else ())])
    assert not any(client.wants_server([c, "x"]) for c in set(commands) - set(client.FORWARDED))
    shown = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    # `serve --help` names them from the list (its wrapping may break a name at its hyphen: lens-eval)
    assert client.forwarded_names() in " ".join(shown.stdout.split()).replace("- ", "-")


def test_tokenizers_are_cached_by_source_and_file_time(tmp_path):
    import os

    from anatomy_cli.models.resolve import Source
    from anatomy_cli.serve.cache import TokenizerCache

    calls = []
    cache = TokenizerCache(lambda source, **kw: calls.append(source.ref) or object(), max_items=2)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    a = cache.load(Source("gguf", "m.gguf", str(f)))
    assert cache.load(Source("gguf", "./m.gguf", str(f))) is a and calls == [str(f)]  # one file, two spellings
    os.utime(f, ns=(1, 1))  # the file changed: build again
    assert cache.load(Source("gguf", "m.gguf", str(f))) is not a and len(calls) == 2
    cache.load(Source("hub", "x/y", "x/y"))
    cache.load(Source("hub", "x/z", "x/z"))
    assert len(cache.items) == 2  # the least recently used went


def test_stop_answers_in_json_when_asked(tmp_path):
    from anatomy_cli.serve.server import Server

    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "s.sock"
    srv = Server(path, commands=click_command, log=lambda msg: None)
    srv.bind()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    result = runner.invoke(app, ["serve", "--stop", "--socket", str(path), "--format", "json"])
    thread.join(timeout=10)
    assert result.exit_code == 0 and not thread.is_alive()
    assert json.loads(result.stdout) == {"stopped": True, "pid": os.getpid(), "socket": str(path)}
    assert result.stderr.startswith("stopped the anatomy server")


def test_every_weight_command_is_answered_as_in_process(server, cached_load, tmp_path, monkeypatch):
    # report, diff, corpus, verify, generate, steer, sae (issue 42 item 5) and fit-lens: served == in-process,
    # stdout and the files they write.
    sock, model = server
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.txt").write_text("Hi there\n", encoding="utf-8")
    (tmp_path / "corpus.txt").write_text("The cat sat on the mat. " * 8, encoding="utf-8")
    (tmp_path / "long.txt").write_text("The cat sat on the mat and looked at the dog that sat by the door. " * 2,
                                       encoding="utf-8")
    sae = Path(__file__).parent / "fixtures" / "sae" / "saelens-standard"
    m = ["--model", str(model)]
    named = Path(shutil.copytree(sae, tmp_path / "named"))  # a dictionary naming the served model: no --model
    cfg = json.loads((named / "cfg.json").read_text())
    (named / "cfg.json").write_text(json.dumps({**cfg, "metadata": {**cfg["metadata"], "model_name": str(model)}}))
    jobs = [
        (["report", "Thank you very", *m, "-o", "page.html", "--sections", "tokens"], ["page.html"]),
        (["diff", str(model), str(model), "Thank you very", "--format", "json"], []),
        (["corpus", "corpus.txt", *m, "--ctx", "16", "--max-tokens", "48", "--format", "json"], []),
        (["verify", *m, "--device", "cpu", "--quick", "--prompts", "one.txt", "--format", "json"], []),
        (["generate", "Once upon a", *m, "--max-new-tokens", "3"], []),
        (["steer", *m, "--positive", "I love it", "--negative", "I hate it", "--layer", "1", "--out", "v.safetensors"],
         ["v.safetensors"]),
        (["sae", "Hi there", "--sae", str(sae), *m], []),
        (["sae", "Hi there", "--sae", "named", "--format", "json"], []),  # the recorded model (the default, gpt2: none)
        (["fit-lens", "jacobian", "--prompts", "long.txt", *m, "--dim-batch", "64", "--out", "j.pt", "--overwrite"],
         []),
    ]
    served_as_in_process(sock, tmp_path, jobs)
    assert not client.wants_server(["corpus", "corpus.txt", *m, "--ray"])  # Ray workers load their own copies
    assert not client.wants_server(["convert", "x.gguf", "--to", "dir"])
    status = anatomy("serve", "--status", "--socket", str(sock), sock=None)
    assert "not forwarded: corpus --ray: its Ray workers load their own copies of the model" in status.stdout + \
        status.stderr


def test_circuit_is_answered_as_in_process(server, cached_load, tiny_lm, tmp_path, monkeypatch):
    # circuit (issue 49): served == in-process, stdout and the graph JSON it writes; --estimate too (it loads
    # nothing, in either place).
    from test_circuit import random_transcoders
    from test_circuit import write_transcoder_set

    sock, model = server
    monkeypatch.chdir(tmp_path)
    write_transcoder_set(tmp_path / "tc", None, random_transcoders(tiny_lm("gpt2")))
    base = ["circuit", "The capital of France is", "--model", str(model), "--transcoders", "tc",
            "--max-feature-nodes", "10", "--batch-size", "4"]
    served_as_in_process(sock, tmp_path, [(base + ["--json", "graph.json", "--format", "json"], ["graph.json"]),
                                          (base + ["--estimate", "--format", "json"], [])])


# fit-sae's figures measured at run time, the only ones a served run may differ in: the wall seconds (the run's,
# the collecting pass', the block's), the FLOP rate measured before training and the seconds estimated from it.
FIT_SAE_MEASURED = ("seconds", "estimated_seconds", "collect_seconds")  # timed on this run: any key so named


def _measured_popped(data):
    """``data`` without the values timed on the run (each a float, asserted), wherever they sit."""
    if isinstance(data, list):
        return [_measured_popped(v) for v in data]
    if not isinstance(data, dict):
        return data
    for key in FIT_SAE_MEASURED:
        if key in data:
            assert isinstance(data.pop(key), float), key
    return {k: _measured_popped(v) for k, v in data.items()}


def test_fit_sae_is_answered_as_in_process(server, cached_load, tmp_path, monkeypatch):
    # fit-sae (issue 51 item 8): forwarded, the same seed writes the same SAE files, byte for byte, and the
    # JSON is in-process' but for FIT_SAE_MEASURED; the tsv has no measured figure: identical.
    sock, model = server
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("The cat sat on the mat and looked at the dog by the door. " * 12,
                                         encoding="utf-8")
    base = ["fit-sae", "corpus.txt", "--model", str(model), "--layer", "1", "--out", "sae", "--ctx", "16",
            "--max-tokens", "64", "--d-sae", "32", "--k", "4", "--epochs", "3", "--batch-size", "16", "--seed", "3",
            "--overwrite"]
    files = ["sae/layers.1/cfg.json", "sae/layers.1/sae.safetensors"]
    served_as_in_process(sock, tmp_path, [(base, files)])
    args = [*base, "--format", "json"]
    assert client.wants_server(args)
    remote = anatomy(*args, sock=sock)
    assert remote.returncode == 0, remote.stderr
    written = {f: (tmp_path / f).read_bytes() for f in files}
    code, out = in_process(args)
    assert code == 0 and written == {f: (tmp_path / f).read_bytes() for f in files}
    served, local = _measured_popped(json.loads(remote.stdout)), _measured_popped(json.loads(out))
    assert served == local


def served_as_in_process(sock: Path, folder: Path, jobs: list[tuple[list[str], list[str]]]) -> None:
    """Each ``(args, files)``: forwarded, it succeeds; run in-process again, its stdout and the files it writes
    in ``folder`` are the same bytes."""
    for args, files in jobs:
        assert client.wants_server(args), args
        remote = anatomy(*args, sock=sock)
        assert remote.returncode == 0, (args, remote.stderr)
        written = {f: (folder / f).read_bytes() for f in files}
        code, out = in_process(args)
        assert (remote.returncode, remote.stdout) == (code, out), args
        assert written == {f: (folder / f).read_bytes() for f in files}, args


# ---------------------------------------------------------------- jobs: a killed client, --status, --cancel

@pytest.fixture(scope="module")
def long_llama(tiny_model_dir, tmp_path_factory):
    """The tiny Llama with a 200,000-token context (RoPE: no parameter grows), so a forwarded `generate
    --max-new-tokens 20000` runs long on any machine."""
    import shutil

    model = Path(shutil.copytree(tiny_model_dir("llama"), tmp_path_factory.mktemp("long") / "llama"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 200_000}))
    return model


def _jobs(sock: Path) -> list[dict]:
    return protocol.request(sock, {"op": "status"}, wait=30)["jobs"]


def _wait_jobs(sock: Path, ready, what: str, seconds: float = 150) -> list[dict]:
    """The server's jobs once ``ready(jobs)``; fails after ``seconds`` (a generous bound, not a timing claim)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        jobs = _jobs(sock)
        if ready(jobs):
            return jobs
        time.sleep(0.05)
    raise AssertionError(f"the server never had {what}: {_jobs(sock)}")


def _client(args: list[str], sock: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "anatomy_cli", *args], env={**ENV, protocol.ENV_SOCKET: str(sock)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _long(model: Path) -> list[str]:
    return ["generate", "Once upon a", "--model", str(model), "--max-new-tokens", "20000"]


def test_a_killed_client_cancels_its_job(server, long_llama):
    # Issue 51 item 2: the job of a killed client stopped at its next token, the next command answered at
    # once rather than after 20,000 tokens (the timeout below is far shorter than those).
    sock, _ = server
    proc = _client(_long(long_llama), sock)
    try:
        _wait_jobs(sock, lambda jobs: any(j["state"] == "running" for j in jobs), "a running generate")
    finally:
        proc.kill()
        proc.communicate()
    out = anatomy("next", "Hi", "--model", str(long_llama), sock=sock, timeout=90)
    assert out.returncode == 0 and out.stdout.startswith("rank\t"), out.stderr
    assert _jobs(sock) == []


def test_status_lists_the_jobs_and_cancel_ends_them(server, long_llama):
    # Two clients wait behind a running generate: one with a piped stderr (told once, in a line that stays),
    # one on a terminal (a status line); --status lists all three, --cancel ID ends the generate.
    from serve_helpers import run_with_tty_stderr

    from anatomy_cli.serve.jobs import NOTE_AFTER_S

    sock, _ = server
    m = str(long_llama)
    running = _client(_long(long_llama), sock)
    queued = None
    pool = ThreadPoolExecutor(1)
    try:
        first = _wait_jobs(sock, lambda jobs: any(j["state"] == "running" for j in jobs), "a running generate")[0]
        queued = _client(["next", "Hi", "--model", m], sock)
        _wait_jobs(sock, lambda jobs: len(jobs) == 2, "a queued next")
        on_tty = pool.submit(run_with_tty_stderr, ["next", "Hi", "--model", m], sock, 150)
        # Once the queued clients have waited long enough to be told so.
        jobs = _wait_jobs(sock, lambda jobs: len(jobs) == 3 and jobs[2]["for_s"] > NOTE_AFTER_S + 1, "queued nexts")
        assert [(j["id"], j["state"], j["command"]) for j in jobs] == [
            (first["id"], "running", f"anatomy generate 'Once upon a' --model {m} --max-new-tokens 20000"),
            (first["id"] + 1, "queued", f"anatomy next Hi --model {m}"),
            (first["id"] + 2, "queued", f"anatomy next Hi --model {m}")]
        table = anatomy("serve", "--status", "--socket", str(sock), sock=None)
        assert f"\n{first['id']}\trunning\t" in table.stdout and f"\n{first['id'] + 1}\tqueued\t" in table.stdout
        cancel = anatomy("serve", "--cancel", str(first["id"]), "--socket", str(sock), "--format", "json", sock=None)
        assert cancel.returncode == 0, cancel.stderr
        answer = json.loads(cancel.stdout)
        assert [j["id"] for j in answer["cancelled"]] == [first["id"]] and answer["not_found"] == []
        out, err = running.communicate(timeout=90)
        assert running.returncode == 130 and out == b""
        assert err.decode().endswith("error: cancelled by `anatomy serve --cancel`\n")
        out, err = queued.communicate(timeout=90)  # answered once the generate stopped
        assert queued.returncode == 0 and out.decode().startswith("rank\t")
        note, rest = err.decode().split("\n", 1)
        # The command line, cut to jobs.SHOWN_CHARS characters.
        assert note.startswith(f"anatomy serve: waiting for job {first['id']}, `anatomy generate 'Once upon a' "
                               f"--model ") and "`, running for " in note
        assert note.endswith(f" s (`anatomy serve --cancel {first['id']}` ends it)")
        assert rest.startswith("next · llama\n")  # then what the command itself says
        code, out, shown = on_tty.result(timeout=150)
        assert code == 0 and out.startswith("rank\t")
        assert f"waiting for job {first['id']}, `anatomy generate 'Once upon a' --model " in shown  # the status line
        assert "anatomy serve: waiting" not in shown  # and no line that stays
    finally:
        pool.shutdown(wait=False)
        for proc in (running, queued):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    none = anatomy("serve", "--cancel", "999", "--socket", str(sock), "--format", "json", sock=None)
    assert json.loads(none.stdout) == {"cancelled": [], "not_found": [999]}
    said = anatomy("serve", "--cancel", "999", "--socket", str(sock), sock=None)
    assert said.returncode == 0 and said.stderr == ("cancelled 0 jobs\n"
                                                    "no job 999 (it finished, or never was: see serve --status)\n")
    assert _jobs(sock) == []
    usage = anatomy("serve", "7", "--socket", str(sock), sock=None)
    assert usage.returncode == 2 and "job ids are for --cancel" in usage.stderr


def test_a_long_job_keeps_a_piped_client_waiting(server, long_llama):
    # Issue 61 item 1: a forwarded command whose stderr is not a terminal got no message while its job ran, so
    # after $ANATOMY_SERVER_TIMEOUT its client gave up ("did not answer within …", exit 1) and the server
    # cancelled the job. Now the server sends keep-alives (every timeout/4 s here) that the client does not
    # print: the client waits as long as the job runs, and gets its end (here a --cancel) as in-process.
    sock, _ = server
    wait = 2.0  # keep-alives every 0.5 s; the client gives up after 4 missed ones (the test waits 3 timeouts: 6 s)
    env = {**ENV, protocol.ENV_SOCKET: str(sock), protocol.ENV_TIMEOUT: f"{wait:g}"}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", *_long(long_llama)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        jobs = _wait_jobs(sock, lambda jobs: proc.poll() is not None or any(
            j["state"] == "running" and j["for_s"] > 3 * wait for j in jobs), f"a generate running for {3 * wait:g} s")
        assert proc.poll() is None, proc.communicate()  # still waiting, silent stderr and all
        [job] = jobs
        assert protocol.request(sock, {"op": "cancel", "ids": [job["id"]]})["cancelled"]
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out) == (130, b""), err
    assert err.decode() == "error: cancelled by `anatomy serve --cancel`\n"  # and no keep-alive shows
    assert _jobs(sock) == []


def test_ctrl_c_on_a_forwarded_command_is_quiet_and_cancels_its_job(server, long_llama):
    # Issue 61 item 2: Ctrl-C while the client waited printed a KeyboardInterrupt traceback (from its recv).
    # Now it ends as an in-process command does (`interrupted`, exit 130) and the server cancels the job.
    sock, _ = server
    proc = _client(_long(long_llama), sock)
    try:
        _wait_jobs(sock, lambda jobs: any(j["state"] == "running" for j in jobs), "a running generate")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out) == (130, b""), err
    assert err.decode() == "interrupted\n"  # one line, as in-process
    # Cancelled at its next token: gone long before 20,000 tokens (a generous bound, not a timing claim).
    _wait_jobs(sock, lambda jobs: jobs == [], "no job left", seconds=60)


def test_forwarded_output_follows_the_clients_encoding(server):
    # Issue 51 item 3: with PYTHONIOENCODING=ascii, generate's and sae's headings (·) reach stderr escaped,
    # as in-process, instead of an internal UnicodeEncodeError; stdout and stderr byte for byte.
    sock, model = server
    sae = Path(__file__).parent / "fixtures" / "sae" / "saelens-standard"
    m = ["--model", str(model)]
    env = {**ENV, "PYTHONIOENCODING": "ascii"}
    for args in (["generate", "Once upon a", *m, "--max-new-tokens", "3"], ["sae", "Hi there", "--sae", str(sae), *m]):
        remote, local = (subprocess.run([sys.executable, "-m", "anatomy_cli", *args, *extra], capture_output=True,
                                        env={**env, protocol.ENV_SOCKET: str(sock)}, timeout=180)
                         for extra in ((), ("--no-server",)))
        assert remote.returncode == local.returncode == 0, (args, remote.stderr)
        assert (remote.stdout, remote.stderr) == (local.stdout, local.stderr), args
        assert b" \\xb7 " in remote.stderr  # the heading's middle dot, escaped as Python's stderr does


def test_the_cancellation_hook_stops_a_task_at_its_next_step():
    # What the server installs around a command (tasks.notes.cancellable): every status block, update and
    # counter step asks it; outside the block nothing is checked.
    from anatomy_cli.tasks import notes

    reason: list[str | None] = [None]
    with notes.cancellable(lambda: reason[0]):
        with notes.status("work") as line:
            step = line.counter("work", "steps")
            step(1, 3)
            line.update("still working")
            reason[0] = "by a test"
            with pytest.raises(notes.Cancelled, match="^cancelled by a test$") as caught:
                step(2, 3)
            assert caught.value.exit_code == 130
        with pytest.raises(notes.Cancelled):
            notes.check_cancelled()
        with pytest.raises(notes.Cancelled), notes.status("never shown"):
            pass
    notes.check_cancelled()
