"""The `anatomy serve` server: keeps models loaded and runs forwarded command lines on them.

Each request is a command line; the server runs it through the same Typer app as the console script
(the command registry it is handed: it never imports the CLI), with the client's working directory,
environment, terminal facts and stdin (:mod:`.session`), streams what the command writes to stderr as it is
written (when the client asks: ours does), and returns the bytes it wrote to stdout (and any stderr not
streamed) and its exit code. So a forwarded command prints exactly what it prints in-process, and when.

It listens first and loads afterwards: :meth:`Server.serve_forever` answers handshakes and ``status`` at once
while the worker imports torch and preloads. Requests run one at a time on that one worker thread (a
queue): the forward engine, the working directory and ``sys.stdout`` are process-wide. Connections are
handled on their own threads (:mod:`.connections`), so a slow or vanished client never blocks others, and a
request queued behind a load tells its client so (``waiting for the server to load M…``), and one queued behind another
client's command names that command and how long it has run (:mod:`.jobs`). A client that disconnects
cancels its job (queued: it never runs; running: at its next reported step, through the ``cancellable`` hook
the CLI hands in), and ``cancel`` ends jobs by id. Models are cached by spec and
file identity (:mod:`.cache`). SIGTERM, SIGINT, ``stop`` and the idle timeout all end it the same way:
the socket is removed.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import queue
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

from anatomy_cli.engine.loader import DIRECT
from anatomy_cli.engine.loader import using_loader
from anatomy_cli.models import model_files
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.serve import lifecycle
from anatomy_cli.serve import protocol
from anatomy_cli.serve.cache import ModelCache
from anatomy_cli.serve.cache import TokenizerCache
from anatomy_cli.serve.cache import clear_stray_hooks
from anatomy_cli.serve.connections import Connections
from anatomy_cli.serve.jobs import Job
from anatomy_cli.serve.jobs import never_cancelled
from anatomy_cli.serve.session import Channel
from anatomy_cli.serve.session import client_context
from anatomy_cli.serve.session import library_bars_silenced

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from anatomy_cli.engine.loader import Loader
    from anatomy_cli.models.resolve import Source


class CommandLine(Protocol):
    """What the server runs a command line with: the CLI's click command (the server imports no CLI)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, *,
             standalone_mode: bool = True) -> object: ...


class Server(Connections):
    """Listens on a Unix socket; see the module docstring. ``serve_forever`` blocks until stop or idle."""

    def __init__(self, path: Path, *, commands: Callable[[], CommandLine], max_bytes: int | None = None,
                 idle_timeout: float = 1800.0, log: Callable[[str], None] | None = None, loader: Loader | None = None,
                 cancellable: Callable[[Callable[[], str | None]], AbstractContextManager[object]] = never_cancelled):
        self.path = Path(path)
        self.idle_timeout = idle_timeout
        self.log = log or (lambda msg: print(msg, file=sys.__stderr__, flush=True))
        self.identity = protocol.identity()  # the source as it is now, before the heavy imports
        # ``loader``: who really opens and loads (None: engine.loader.DIRECT, imported by the worker: the
        # server listens before torch is imported).
        self.cache = ModelCache(loader, max_bytes, self.log)
        self.tokenizers = TokenizerCache(self._load_tokenizer)
        self.started = time.time()
        self.last_activity = time.monotonic()
        self.requests = 0
        self.jobs: queue.Queue = queue.Queue()
        self.queued: list[ModelSpec] = []   # preloads not started yet
        self.busy = False                   # the worker is running a job (or still starting)
        self.stopping = threading.Event()
        self.exited = threading.Event()
        self.sock: socket.socket | None = None
        self._commands = commands  # the registry: returns the click command that runs a command line
        self._command: CommandLine | None = None
        self._tokenizer_load: Callable[..., PreTrainedTokenizerBase] | None = None  # set by the worker
        # ``cancellable(check)``: the context manager under which a command ends at its next step once
        # ``check()`` gives a reason (the CLI hands in tasks.notes.cancellable; the server imports no task).
        self._cancellable = cancellable
        self.active: dict[int, Job] = {}  # the run requests queued or running, by id
        self._ids = itertools.count(1)
        self._active_lock = threading.Lock()

    def _load_tokenizer(self, source: Source, **options: object) -> PreTrainedTokenizerBase:
        assert self._tokenizer_load is not None  # set by the worker before any request runs
        return self._tokenizer_load(source, **options)

    # -------------------------------------------------------------- lifecycle

    def bind(self) -> None:
        """Create the private directory and the 0600 socket and listen; replace a stale socket from a crash.

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
        sock.settimeout(0.2)
        self.sock = sock

    def preload(self, specs: Sequence[ModelSpec | str]) -> None:
        """Queue these models for loading on the worker (after anything queued before); returns at once."""
        for spec in specs:
            spec = spec if isinstance(spec, ModelSpec) else ModelSpec(str(spec))
            self.queued.append(spec)
            self.jobs.put(("preload", spec, None))

    def serve_forever(self) -> None:
        """Accept until stopped, idle for ``idle_timeout`` s, SIGTERM or SIGINT; then remove the socket.

        The worker starts (imports, preloads) while connections are already answered.
        """
        restore = lifecycle.on_sigterm(self.stopping.set)  # SIGINT: Python's KeyboardInterrupt, same finally
        self.busy = True  # until the worker has imported the engine
        worker = threading.Thread(target=self._work, name="anatomy-worker", daemon=True)
        worker.start()
        try:
            while not self.stopping.is_set():
                idle = time.monotonic() - self.last_activity
                if not self.busy and self.jobs.empty() and idle > self.idle_timeout:
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
            self.close()  # first: no new client connects to a server that is going away
            self.jobs.put(None)
            worker.join(timeout=0.5)  # an idle worker puts engine.load back; a busy one is abandoned
            restore()
            self.exited.set()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -------------------------------------------------------------- the worker

    def _work(self) -> None:
        if self.cache.loader is None:
            self.cache.loader = DIRECT
        self._tokenizer_load = model_files.load_tokenizer
        model_files.load_tokenizer = self.tokenizers.load  # `tokens --model` through this
        try:
            with library_bars_silenced(), using_loader(self.cache):  # every command opens and loads through it
                self.busy = False
                while True:
                    job = self.jobs.get()
                    if job is None:
                        return
                    self.busy = True
                    try:
                        self._job(*job)
                    finally:
                        self.busy = False
                        self.last_activity = time.monotonic()
        finally:
            model_files.load_tokenizer = self._tokenizer_load

    def _job(self, kind: str, payload: Any, reply: Any) -> None:
        if kind == "preload":
            t0 = time.perf_counter()
            key = ModelCache.key(payload)
            with self.cache.lock:  # listed as loading before it leaves the queue: never missing from --status
                self.cache.loading[key] = payload
                self.queued.remove(payload)
            try:
                self.cache.load(payload)
                self.log(f"loaded {payload.model} in {time.perf_counter() - t0:.1f} s")
            except Exception as exc:  # a bad --model must not stop the server: say so in its log
                self.log(f"could not load {payload.model}: {exc}")
            finally:
                with self.cache.lock:
                    self.cache.loading.pop(key, None)
            return
        done, channel, job = reply
        try:
            with job.lock:
                if job.cancel is not None:  # cancelled while queued: it never runs
                    done.set_result({"error": f"cancelled {job.cancel} before it started", "exit_code": 130})
                    return
                job.started = time.time()
                if job.shown:
                    channel.status("")  # the "waiting for …" line; the command's own lines follow
            done.set_result(self.run(payload, channel, job))
        except BaseException as exc:  # never let the worker die: answer with the failure
            if not done.done():
                done.set_result({"error": f"internal error in the server: {type(exc).__name__}: {exc}",
                                 "exit_code": 1})
        finally:
            with self._active_lock:
                self.active.pop(job.id, None)

    def run(self, req: protocol.RunRequest, channel: Channel | None = None,
            job: Job | None = None) -> protocol.RunAnswer:
        """Run one command line as the console script would; stdout/stderr bytes and the exit code (``job``:
        it ends at its next step once cancelled; ``channel``: where status lines, and stderr as it is written
        when the request asks for ``stream_stderr``, go meanwhile)."""
        if self._command is None:
            # Built once: typer rebuilds the click command on every app() call (~0.1 s).
            self._command = self._commands()
        argv = [str(a) for a in req.get("argv") or []]
        check = (lambda: job.cancel) if job is not None else (lambda: None)
        notify, stream = (channel.status, channel.stderr) if channel is not None else (None, None)
        with client_context(req, notify, stream) as (out, err), self._cancellable(check):
            try:
                code = self._command.main(args=argv, prog_name="anatomy", standalone_mode=False)
            except SystemExit as exc:  # typer.Exit paths that escape the group
                code = exc.code if isinstance(exc.code, int) else 1
            code = code if isinstance(code, int) else 0
        self.requests += 1
        stray = clear_stray_hooks(self.cache)
        if stray:
            self.log(f"removed {stray} hook(s) left on a model by: {' '.join(argv)}")
        return {"stdout": base64.b64encode(out.value()).decode("ascii"),
                "stderr": base64.b64encode(err.value()).decode("ascii"), "exit_code": code}

    def status(self) -> protocol.Status:
        """Answered on the connection's thread, at once, also while the worker loads."""
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with self.cache.lock:
            waiting = list(self.queued)
        queued: list[protocol.ModelRow] = [
            {"model": s.model, "state": "queued", "dtype": s.dtype, "device": s.device, "init": s.init, "bytes": None,
             "reloads": 0, "last_reload": None, "spec": s.to_dict()} for s in waiting]
        return {"pid": os.getpid(), "socket": str(self.path), "uptime_s": round(time.time() - self.started, 1),
                "requests": self.requests, "peak_rss_bytes": rss, "max_bytes": self.cache.max_bytes,
                "idle_timeout_s": self.idle_timeout, "version": self.identity["version"],
                "location": self.identity["location"], "digest": self.identity["digest"],
                "models": self.cache.summary() + queued, "jobs": self.job_rows()}

    def job_rows(self) -> list[protocol.JobRow]:
        """The run requests now running (first) and queued, oldest first: id, command, state, since, for_s."""
        with self._active_lock:
            jobs = list(self.active.values())
        return [j.row() for j in sorted(jobs, key=lambda j: (j.started is None, j.queued))]

