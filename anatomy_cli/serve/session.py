"""One forwarded request inside the server: the client's cwd, environment, stdin and terminal, for its length.

The command writes into :class:`Captured` streams that answer ``isatty()`` as the client's streams did.
A client that asks for it (``"stream_stderr": true``) gets stderr as it is written (``{"stream": "stderr",
"data": BASE64}`` messages, in order): notes, warnings and cost lines arrive while the command runs, as
in-process; the answer then carries only stdout. A status line (``cli.app.status``) on a captured terminal
stderr goes to the client at once through ``remote_status`` instead of being drawn into the captured bytes:
the client shows it while the work happens, and the answer carries only what the command printed.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import functools
import io
import os
import sys
import threading
import time
import typing
from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.serve import protocol
from anatomy_cli.serve.client import ENV_KEYS

if TYPE_CHECKING:
    import socket


class _Bytes(io.BytesIO):
    """Collects the bytes written, or hands each write to ``sink`` as it comes (then keeps none)."""

    def __init__(self, sink: Callable[[bytes], None] | None = None):
        super().__init__()
        self.sink = sink

    def write(self, data: Any) -> int:
        if self.sink is None:
            return super().write(data)
        chunk = bytes(data)
        if chunk:
            self.sink(chunk)
        return len(chunk)


class Captured(io.TextIOWrapper):
    """A captured stream that answers ``isatty()`` as the client's stream did.

    ``notify(text)`` sends a status line to the client (``""`` clears it); :meth:`remote_status` is what
    ``cli.app.status`` uses in place of its spinner when it finds it on ``sys.stderr``. ``sink(data)``: each
    write's bytes go there at once (streamed to the client) rather than into :meth:`value`.
    """

    def __init__(self, encoding: str, tty: bool, notify: Callable[[str], None] | None = None,
                 errors: str = "strict", sink: Callable[[bytes], None] | None = None):
        raw = _Bytes(sink)
        super().__init__(raw, encoding=encoding, errors=errors, write_through=True)
        self._raw = raw
        self._tty = tty
        self._notify = notify or (lambda text: None)
        self._shown: list[str] = []

    def isatty(self) -> bool:
        return self._tty

    def value(self) -> bytes:
        self.flush()
        return self._raw.getvalue()

    @contextlib.contextmanager
    def remote_status(self, message: str) -> Iterator[Callable[[str], None]]:
        """Show ``message`` on the client's status line while the block runs; nested calls stack. Yields
        ``show(text)``, which replaces this block's line (progress)."""
        self._shown.append(message)
        self._notify(message)
        depth = len(self._shown)

        def show(text: str) -> None:
            self._shown[depth - 1] = text
            if len(self._shown) == depth:
                self._notify(text)

        try:
            yield show
        finally:
            self._shown.pop()
            self._notify(self._shown[-1] if self._shown else "")


class BadRequest(ValueError):
    """A request the server cannot run as sent (its message is the one-line answer)."""


def check_run(req: dict[str, object]) -> protocol.RunRequest:
    """``req`` as a ``run`` request; BadRequest for one with unknown fields or fields of the wrong type."""
    fields = {name: (int, float) if kind is float else typing.get_origin(kind) or kind
              for name, kind in typing.get_type_hints(protocol.RunRequest).items()}
    unknown = sorted(set(req) - set(fields))
    if unknown:
        raise BadRequest(f"unknown field(s) in the request: {', '.join(unknown)}")
    for name, kind in fields.items():
        if name in req and not isinstance(req[name], kind):
            what = kind.__name__ if isinstance(kind, type) else "number"
            raise BadRequest(f"request field '{name}' must be a JSON {what}")
    run = typing.cast(protocol.RunRequest, req)
    every = run.get("keepalive_s", 1)
    if isinstance(every, bool) or not every > 0:
        raise BadRequest("request field 'keepalive_s' must be a positive number of seconds")
    if not all(isinstance(a, str) for a in run.get("argv") or []):
        raise BadRequest("request field 'argv' must be a list of strings")
    cwd = run.get("cwd")
    if cwd is not None and not (os.path.isdir(cwd) and os.access(cwd, os.X_OK)):
        raise BadRequest(f"the client's working directory {cwd} is not a directory the server can enter")
    for name, encoding in (("stdout_encoding", run.get("stdout_encoding")),
                           ("stderr_encoding", run.get("stderr_encoding"))):
        try:
            "".encode(encoding or "utf-8")
        except LookupError:
            raise BadRequest(f"unknown encoding {encoding!r} in '{name}'") from None
    for name, handler in (("stdout_errors", run.get("stdout_errors")), ("stderr_errors", run.get("stderr_errors"))):
        try:
            codecs.lookup_error(handler or "strict")
        except LookupError:
            raise BadRequest(f"unknown error handler {handler!r} in '{name}'") from None
    try:
        base64.b64decode(run.get("stdin") or "", validate=True)
    except ValueError:
        raise BadRequest("request field 'stdin' is not base64") from None
    return run


@contextlib.contextmanager
def client_context(req: protocol.RunRequest, notify: Callable[[str], None] | None = None,
                   stream: Callable[[bytes], None] | None = None):
    """The client's cwd, environment, stdin and stdout/stderr for the length of one request (``stream``: where
    stderr's bytes go as they are written, when the request asks for ``stream_stderr``)."""
    out = Captured(req.get("stdout_encoding") or "utf-8", bool(req.get("stdout_isatty")),
                   errors=req.get("stdout_errors") or "strict")
    err = Captured(req.get("stderr_encoding") or "utf-8", bool(req.get("stderr_isatty")), notify,
                   errors=req.get("stderr_errors") or "backslashreplace",
                   sink=stream if req.get("stream_stderr") else None)
    stdin = io.TextIOWrapper(io.BytesIO(base64.b64decode(req.get("stdin") or "")), encoding="utf-8")
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved = sys.stdin, sys.stdout, sys.stderr
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


@contextlib.contextmanager
def library_bars_silenced() -> Iterator[None]:
    """No tqdm bar (transformers' weight loading, GGUF de-quantizing) draws into a client's stream meanwhile.

    The client sees the command's own status line instead. ``TQDM_DISABLE`` covers tqdm imported later; an
    already imported tqdm gets ``disable=True`` as its default. Both are put back at the end.
    """
    from huggingface_hub.utils import disable_progress_bars
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    saved_env = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    std = sys.modules.get("tqdm.std")
    saved_init = std.tqdm.__dict__["__init__"] if std is not None else None
    if std is not None:
        std.tqdm.__init__ = functools.partialmethod(saved_init, disable=True)
    hf_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        yield
    finally:
        if std is not None:
            std.tqdm.__init__ = saved_init
        if saved_env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = saved_env
        hf_logging.enable_progress_bar()
        enable_progress_bars()


class Channel:
    """What a running request sends its client before the answer, one message at a time (the worker and the
    connection's thread both send): status lines and stderr bytes. A client that went away is not an error
    (its answer is lost)."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.lock = threading.Lock()
        self.sent = time.monotonic()  # when the last message went (or the channel was made)

    def status(self, text: str) -> None:
        """``{"status": text}``: the client's status line (``""`` clears it)."""
        self._send({"status": text})

    def stderr(self, data: bytes) -> None:
        """``{"stream": "stderr", "data": BASE64}``: bytes the command wrote to stderr just now."""
        self._send({"stream": "stderr", "data": base64.b64encode(data).decode("ascii")})

    def note(self, text: str) -> None:
        """``{"note": text}``: a stderr line the client writes at once (waiting behind another command)."""
        self._send({"note": text})

    def keepalive(self, every: float, queued_s: float) -> None:
        """``{"keepalive": queued_s}`` when nothing went to the client for ``every`` seconds (and nothing is
        being sent now): a client does not print it; it tells the client that its job still waits or runs."""
        if time.monotonic() - self.sent < every or not self.lock.acquire(blocking=False):
            return
        try:
            with contextlib.suppress(OSError):
                protocol.send(self.conn, {"keepalive": round(queued_s, 1)})
            self.sent = time.monotonic()
        finally:
            self.lock.release()

    def _send(self, message: dict[str, object]) -> None:
        with self.lock, contextlib.suppress(OSError):
            protocol.send(self.conn, message)
            self.sent = time.monotonic()


def notifier(conn: socket.socket) -> Callable[[str], None]:
    """Send ``{"status": text}`` to a client (:meth:`Channel.status`)."""
    return Channel(conn).status
