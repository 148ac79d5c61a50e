"""The `anatomy serve` server: keeps models loaded and runs forwarded command lines on them.

Each request is a command line; the server runs it through the same Typer app as the console script,
with the client's working directory, environment, terminal facts and stdin, and returns the bytes it
wrote to stdout and stderr and its exit code. So a forwarded command prints exactly what it prints
in-process, and every command (tables, json, --plot) works through the server with no second code path.

Requests run one at a time on one worker thread (a queue): the forward engine, the working directory and
``sys.stdout`` are process-wide. Connections are accepted on their own threads, so a slow or vanished
client never blocks others. Models are cached by what was asked for (spec, device, dtype, init, ...),
least recently used first out when ``max_bytes`` is passed; ``tokens --model`` tokenizers by their
source. After every request the server checks that no hook is left on any cached model (and removes
one if a bug left it).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import os
import queue
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from anatomy_cli.models import local
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.serve import protocol


class _Tty(io.TextIOWrapper):
    """A captured stream that answers ``isatty()`` as the client's stream did."""

    def __init__(self, encoding: str, tty: bool):
        super().__init__(io.BytesIO(), encoding=encoding, errors="strict", write_through=True)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty

    def value(self) -> bytes:
        self.flush()
        return self.buffer.getvalue()  # type: ignore[attr-defined]


class ModelCache:
    """Loaded models by request key, least recently used evicted first beyond ``max_bytes``."""

    def __init__(self, load: Callable[..., Any], max_bytes: int | None):
        self._load = load
        self.max_bytes = max_bytes
        self.models: OrderedDict[tuple, Any] = OrderedDict()
        self.sizes: dict[tuple, int] = {}
        self.lock = threading.Lock()

    def key(self, spec: ModelSpec) -> tuple:
        args = spec.to_dict()
        path = Path(spec.model).expanduser()
        if local.is_named(spec.model):  # ollama:/lmstudio: names: keyed by the file they name now
            path = Path(check_path(spec.model).ref)
        if path.exists():  # a relative path means the client's directory: key by the absolute one
            args["model"] = f"{path.resolve()}@{path.stat().st_mtime_ns}"
        return tuple(sorted((k, str(v)) for k, v in args.items()))

    def load(self, spec: ModelSpec | str, *, before_weights: Callable[[Any, Any], None] | None = None,
             **options: Any) -> Any:
        """``engine.load`` with the cache in front; the same signature."""
        spec = spec if isinstance(spec, ModelSpec) else ModelSpec(str(spec), **options)
        key = self.key(spec)
        with self.lock:
            lm = self.models.get(key)
            if lm is not None:
                self.models.move_to_end(key)
        if lm is not None:
            if before_weights is not None:  # the request's own checks still run, as they would before a load
                before_weights(lm.tokenizer, lm.model.config)
            # Named as this request names it (headings, titles), not as the first request did.
            return dataclasses.replace(lm, name=spec.model)
        lm = self._load(spec, before_weights=before_weights)
        with self.lock:
            self.models[key] = lm
            self.sizes[key] = _model_bytes(lm)
            self._evict()
        return lm

    def _evict(self) -> None:
        while self.max_bytes is not None and len(self.models) > 1 and sum(self.sizes.values()) > self.max_bytes:
            old, _ = self.models.popitem(last=False)
            del self.sizes[old]

    def summary(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"model": dict(k)["model"].split("@")[0], "dtype": dict(k).get("dtype"),
                     "device": dict(k).get("device"), "init": dict(k).get("init"), "bytes": self.sizes[k]}
                    for k in reversed(self.models)]


class TokenizerCache:
    """``tokens --model`` tokenizers by source (a local path also by its modification time), the
    ``max_items`` most recently used kept: building one from a GGUF file's vocabulary takes seconds."""

    def __init__(self, load: Callable[..., Any], max_items: int = 8):
        self._load = load
        self.max_items = max_items
        self.items: OrderedDict[tuple, Any] = OrderedDict()

    def load(self, source: Any, **options: Any) -> Any:
        path = Path(source.ref)
        stamp = path.stat().st_mtime_ns if source.kind in ("dir", "gguf") and path.exists() else None
        key = (source.kind, str(path.resolve()) if stamp is not None else source.ref, stamp,
               tuple(sorted((k, str(v)) for k, v in options.items())))
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        tok = self._load(source, **options)
        self.items[key] = tok
        while len(self.items) > self.max_items:
            self.items.popitem(last=False)
        return tok


def _model_bytes(lm: Any) -> int:
    model = getattr(lm, "model", None)
    if model is None:
        return 0
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")


def _clear_stray_hooks(cache: ModelCache) -> int:
    """Remove anatomy hooks a request left behind (there should be none); how many were removed.

    Only anatomy's own: transformers installs output-capturing hooks once per model and relies on them.
    """
    removed = 0
    for lm in list(cache.models.values()):
        for module in lm.model.modules():
            for hooks in (module._forward_hooks, module._forward_pre_hooks):
                for key, fn in list(hooks.items()):
                    if getattr(getattr(fn, "func", fn), "__module__", "").startswith("anatomy_cli"):
                        del hooks[key]
                        removed += 1
    return removed


@contextlib.contextmanager
def _client_context(req: dict[str, Any]):
    """The client's cwd, environment, stdin and stdout/stderr for the length of one request."""
    out = _Tty(req.get("stdout_encoding") or "utf-8", bool(req.get("stdout_isatty")))
    err = _Tty(req.get("stderr_encoding") or "utf-8", bool(req.get("stderr_isatty")))
    stdin = io.TextIOWrapper(io.BytesIO(base64.b64decode(req.get("stdin") or "")), encoding="utf-8")
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved = sys.stdin, sys.stdout, sys.stderr
    from anatomy_cli.serve.client import ENV_KEYS

    try:
        for key in ENV_KEYS:
            os.environ.pop(key, None)
        os.environ.update({k: str(v) for k, v in (req.get("env") or {}).items() if k in ENV_KEYS})
        os.chdir(req.get("cwd") or saved_cwd)
        sys.stdin, sys.stdout, sys.stderr = stdin, out, err
        yield out, err
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


class Server:
    """Listens on a Unix socket; see the module docstring. ``serve_forever`` blocks until stop or idle."""

    def __init__(self, path: Path, *, commands: Callable[[], Any], max_bytes: int | None = None,
                 idle_timeout: float = 1800.0, log: Callable[[str], None] | None = None):
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        from anatomy_cli import engine

        hf_logging.disable_progress_bar()  # the server's stderr is a log, not a terminal to animate
        disable_progress_bars()
        self.path = Path(path)
        self.idle_timeout = idle_timeout
        self.log = log or (lambda msg: print(msg, file=sys.__stderr__, flush=True))
        self.cache = ModelCache(engine.load, max_bytes)
        from anatomy_cli.models import model_files

        self.tokenizers = TokenizerCache(model_files.load_tokenizer)
        self.started = time.time()
        self.last_activity = time.monotonic()
        self.requests = 0
        self.jobs: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.sock: socket.socket | None = None
        self._commands = commands  # the registry: returns the click command that runs a command line
        self._command: Any = None

    # -------------------------------------------------------------- lifecycle

    def bind(self) -> None:
        """Create the private directory and the 0600 socket; replace a stale socket from a crashed server.

        Raises OSError (EADDRINUSE) when a live server already listens there, PermissionError for a
        directory that is not private.
        """
        protocol.private_dir(self.path.parent)
        if self.path.exists() or self.path.is_symlink():
            try:
                protocol.connect(self.path, timeout=1.0).close()
            except OSError:
                self.log(f"replacing a stale socket at {self.path}")
                self.path.unlink()
            else:
                raise OSError(98, f"an anatomy server is already listening at {self.path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        sock.settimeout(0.5)
        self.sock = sock

    def preload(self, specs: list[str]) -> None:
        for spec in specs:
            t0 = time.perf_counter()
            self.cache.load(ModelSpec(spec))
            self.log(f"loaded {spec} in {time.perf_counter() - t0:.1f} s")

    def serve_forever(self) -> None:
        """Accept until stopped, idle for ``idle_timeout`` s, or interrupted; then remove the socket."""
        from anatomy_cli import engine
        from anatomy_cli.models import model_files

        real_load, real_tokenizer = engine.load, model_files.load_tokenizer
        engine.load = self.cache.load  # every command loads through engine.load
        model_files.load_tokenizer = self.tokenizers.load  # and `tokens --model` through this
        worker = threading.Thread(target=self._work, name="anatomy-worker", daemon=True)
        worker.start()
        try:
            while not self.stopping.is_set():
                if self.jobs.empty() and time.monotonic() - self.last_activity > self.idle_timeout:
                    self.log(f"idle for {self.idle_timeout:g} s: stopping")
                    break
                try:
                    conn, _ = self.sock.accept()  # type: ignore[union-attr]
                except TimeoutError:
                    continue
                except OSError:
                    if self.stopping.is_set():
                        break
                    raise
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        finally:
            self.stopping.set()
            self.jobs.put(None)
            worker.join(timeout=5)  # a request in flight finishes (or is abandoned) before the process ends
            engine.load, model_files.load_tokenizer = real_load, real_tokenizer
            self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -------------------------------------------------------------- requests

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                uid = protocol.peer_uid(conn)
                if uid is not None and uid != os.getuid():
                    self.log(f"refused a connection from uid {uid}")
                    protocol.send(conn, {"error": "refused: this anatomy server serves its own user only",
                                         "exit_code": 1})
                    return
                conn.settimeout(30)
                req = protocol.receive(conn)
                conn.settimeout(None)
                self.last_activity = time.monotonic()
                op = req.get("op")
                if op == "status":
                    answer = self.status()
                elif op == "stop":
                    self.stopping.set()
                    answer = {"stopped": True, "pid": os.getpid()}
                elif op == "run":
                    done: Future = Future()
                    self.jobs.put((req, done))
                    answer = done.result()
                else:
                    answer = {"error": f"unknown request '{op}'", "exit_code": 2}
                protocol.send(conn, answer)
            except (protocol.ProtocolError, OSError) as exc:
                # A client that went away mid-request: its answer has nowhere to go; others carry on.
                self.log(f"a client connection ended early: {exc}")
            finally:
                self.last_activity = time.monotonic()

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            req, done = job
            try:
                done.set_result(self.run(req))
            except BaseException as exc:  # never let the worker die: answer with the failure
                done.set_result({"error": f"internal error in the server: {type(exc).__name__}: {exc}",
                                 "exit_code": 1})

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one command line as the console script would; stdout/stderr bytes and the exit code."""
        if self._command is None:
            # Built once: typer rebuilds the click command on every app() call (~0.1 s).
            self._command = self._commands()
        argv = [str(a) for a in req.get("argv") or []]
        with _client_context(req) as (out, err):
            try:
                code = self._command.main(args=argv, prog_name="anatomy", standalone_mode=False)
            except SystemExit as exc:  # typer.Exit paths that escape the group
                code = exc.code if isinstance(exc.code, int) else 1
            code = code if isinstance(code, int) else 0
        self.requests += 1
        stray = _clear_stray_hooks(self.cache)
        if stray:
            self.log(f"removed {stray} hook(s) left on a model by: {' '.join(argv)}")
        return {"stdout": base64.b64encode(out.value()).decode("ascii"),
                "stderr": base64.b64encode(err.value()).decode("ascii"), "exit_code": code}

    def status(self) -> dict[str, Any]:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"pid": os.getpid(), "socket": str(self.path), "uptime_s": round(time.time() - self.started, 1),
                "requests": self.requests, "peak_rss_bytes": rss, "max_bytes": self.cache.max_bytes,
                "idle_timeout_s": self.idle_timeout, "models": self.cache.summary()}
