"""The connection side of `anatomy serve`'s :class:`~anatomy_cli.serve.server.Server`: one thread per client
connection (the handshake, then its requests), the answers to ``status``, ``stop``, ``cancel`` and ``run``,
and, while a ``run`` waits for the worker or runs, what its client hears (the job it waits behind, a
keep-alive whenever it has heard nothing for its ``keepalive_s``) and cancellation when it disconnects. The
server's state (its jobs, cache and worker queue) lives in the Server itself.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.serve import protocol
from anatomy_cli.serve.cache import ModelCache
from anatomy_cli.serve.jobs import NOTE_AFTER_S
from anatomy_cli.serve.jobs import POLL_S
from anatomy_cli.serve.jobs import Job
from anatomy_cli.serve.jobs import client_gone
from anatomy_cli.serve.session import BadRequest
from anatomy_cli.serve.session import Channel
from anatomy_cli.serve.session import check_run

if TYPE_CHECKING:
    from collections.abc import Iterator

    from transformers.tokenization_utils_base import PreTrainedTokenizerBase


class Connections:
    """What the Server does on its connections' threads (a base class of it; the attributes are its own)."""

    log: Callable[[str], None]
    identity: dict[str, object]
    last_activity: float
    stopping: threading.Event
    exited: threading.Event
    jobs: queue.Queue
    queued: list[ModelSpec]
    cache: ModelCache
    active: dict[int, Job]
    _ids: Iterator[int]
    _active_lock: threading.Lock
    _tokenizer_load: Callable[..., PreTrainedTokenizerBase] | None

    def status(self) -> protocol.Status:
        raise NotImplementedError

    def _handle(self, conn: socket.socket) -> None:
        """One connection: a handshake, then requests (``hello`` must come before ``run``)."""
        greeted = False
        with conn:
            try:
                uid = protocol.peer_uid(conn)
                if uid is not None and uid != os.getuid():
                    self.log(f"refused a connection from uid {uid}")
                    protocol.send(conn, {"error": "refused: this anatomy server serves its own user only",
                                         "exit_code": 1})
                    return
                while True:
                    # After the handshake the client reads its stdin (a slow pipe, for '-') before it asks.
                    conn.settimeout(None if greeted else 30)
                    try:
                        req = protocol.receive(conn)
                    except protocol.Closed:
                        return  # the client is done (or only checked that a server listens)
                    conn.settimeout(None)
                    self.last_activity = time.monotonic()
                    op = req.get("op")
                    if op == "hello":
                        greeted = True
                        protocol.send(conn, {**self.identity, "op": "hello", "pid": os.getpid()})
                        continue
                    answer: protocol.Answer
                    if op == "run" and not greeted:
                        answer = {"error": "this anatomy server needs a handshake first (an older anatomy client?); "
                                           "rerun with --no-server", "exit_code": 1}
                    else:
                        answer = self._answer(op, req, conn)
                    protocol.send(conn, answer)
                    if op == "stop":
                        self.exited.wait(30)  # the stopping client returns once the server is gone
                        return
            except (protocol.ProtocolError, OSError) as exc:
                # A client that went away mid-request, or sent garbage: its answer has nowhere to go.
                self.log(f"a client connection ended early: {exc}")
                if isinstance(exc, protocol.ProtocolError):
                    with contextlib.suppress(OSError):
                        protocol.send(conn, {"error": f"bad request: {exc}", "exit_code": 2})
            except Exception as exc:  # a bug here must not end the server, nor reach another client's stderr
                self.log(f"internal error answering a client: {type(exc).__name__}: {exc}")
                with contextlib.suppress(OSError):
                    protocol.send(conn, {"error": f"internal error in the server: {type(exc).__name__}: {exc}",
                                         "exit_code": 1})
            finally:
                self.last_activity = time.monotonic()

    def _answer(self, op: object, req: dict[str, object], conn: socket.socket) -> protocol.Answer:
        if op == "status":
            return self.status()
        if op == "stop":
            self.stopping.set()
            return {"stopped": True, "pid": os.getpid()}
        if op == "cancel":
            return self.cancel(req.get("ids"))
        if op != "run":
            return {"error": f"unknown request '{op}'", "exit_code": 2}
        try:
            run = check_run(req)
        except BadRequest as exc:
            return {"error": str(exc), "exit_code": 2}
        channel = Channel(conn)  # the worker streams the command's stderr and status lines through it too
        tty = bool(run.get("stderr_isatty"))
        waiting = self._waiting_for()
        if waiting and tty:
            channel.status(waiting)
        job = Job(next(self._ids), [str(a) for a in run.get("argv") or []])
        with self._active_lock:
            self.active[job.id] = job
        done: Future[protocol.RunAnswer | protocol.Refusal] = Future()
        self.jobs.put(("run", run, (done, channel, job)))
        every = min(max(float(run.get("keepalive_s") or protocol.KEEPALIVE_S), protocol.MIN_KEEPALIVE_S),
                    protocol.KEEPALIVE_S)
        return self._await(job, done, conn, channel, tty, every)

    def _await(self, job: Job, done: Future[protocol.RunAnswer | protocol.Refusal], conn: socket.socket,
               channel: Channel, tty: bool, every: float = protocol.KEEPALIVE_S
               ) -> protocol.RunAnswer | protocol.Refusal:
        """The answer to ``job``. Meanwhile: a keep-alive whenever the client has heard nothing for ``every``
        seconds (whatever its stderr is: it waits as long as the job waits or runs), cancel the job when its
        client disconnects, and while it waits behind another client's command say so (a terminal: a status
        line; else one stderr line)."""
        shown = ""
        while True:
            try:
                return done.result(timeout=POLL_S)
            except FutureTimeout:
                pass
            if job.cancel is None and client_gone(conn):
                job.cancel = "as its client disconnected"
                self.log(f"cancelling job {job.id} ({job.command()}): its client disconnected")
                return done.result()  # nobody reads it; the worker is free again at the job's next step
            channel.keepalive(every, time.time() - job.queued)
            ahead = self._running()
            with job.lock:  # the worker clears a shown line as the job starts
                if job.started is not None or ahead is None or ahead is job:
                    continue
                text = ahead.waiting_text()
                if tty and text != shown:
                    channel.status(text)
                    shown = job.shown = text
                elif not tty and not job.noted and time.time() - job.queued >= NOTE_AFTER_S:
                    channel.note(f"anatomy serve: {text}")
                    job.noted = True

    def _running(self) -> Job | None:
        with self._active_lock:
            return next((j for j in self.active.values() if j.started is not None), None)

    def cancel(self, ids: object = None) -> protocol.Cancelled | protocol.Refusal:
        """End the queued and running jobs (``ids``: those only): a queued one never runs, a running one
        stops at its next step. Answers the jobs it cancelled and the ids it did not find."""
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            return {"error": "request field 'ids' must be a JSON list of integers", "exit_code": 2}
        with self._active_lock:
            jobs = [j for j in self.active.values() if ids is None or j.id in ids]
            missing = sorted(set(ids or ()) - {j.id for j in jobs})
        for job in jobs:
            if job.cancel is None:
                job.cancel = "by `anatomy serve --cancel`"
                self.log(f"cancelling job {job.id} ({job.command()}) as asked")
        return {"cancelled": [j.row() for j in jobs], "not_found": missing}

    def _waiting_for(self) -> str | None:
        """The status line for a request queued behind a load, or None."""
        with self.cache.lock:
            loading = [s.model for s in self.cache.loading.values()] + [s.model for s in self.queued]
        if loading:
            return f"waiting for the server to load {loading[0]}…"
        if self._tokenizer_load is None:  # the worker has not started
            return "waiting for the server to start…"
        return None
