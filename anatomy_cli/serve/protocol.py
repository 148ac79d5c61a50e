"""The wire between client and server: where the socket lives, how messages are framed, who may connect.

Standard library only: the client imports this before anything heavy.

A message is an 8-byte big-endian length followed by that many bytes of UTF-8 JSON. The socket is a Unix
domain socket in a directory only its owner can enter (0700); the socket itself is 0600, and the server
checks each peer's uid (SO_PEERCRED) against its own.

A conversation starts with a handshake: the client sends ``{"op": "hello", ...}`` with :func:`identity`
(protocol version, package version, install location, a digest of the package's source) and the server
answers with its own plus its pid. A client runs a command on the server only when both identities agree
(:func:`mismatch`). Then ``run`` streams zero or more ``{"status": TEXT}`` messages (what the command is
doing now, for a terminal's status line) before the one answer, and while the job waits or runs a
``{"keepalive": SECONDS}`` at least every :func:`keepalive_interval` seconds (SECONDS: how long the job has
been queued), which the client does not print: so a client waits as long as its job runs, whatever its
stderr is, and gives up only on a server that sends nothing at all for :func:`timeout` seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict
from typing import final

from anatomy_cli import __version__

PROTOCOL = 3                   # bump when a message changes meaning (3: keep-alives)
ENV_SOCKET = "ANATOMY_SERVER"
ENV_TIMEOUT = "ANATOMY_SERVER_TIMEOUT"
DEFAULT_TIMEOUT = 600.0        # seconds a client waits for a message (not the answer: a job runs as long as it runs)
KEEPALIVE_S = 10.0             # the longest a running job's client waits between two messages
MIN_KEEPALIVE_S = 0.2          # the shortest interval a client may ask for (the server looks this often)
MAX_MESSAGE = 256 * 1024 * 1024
_HEADER = struct.Struct(">Q")


class RunRequest(TypedDict, total=False):
    """A ``run`` request as the client sends it (serve/client.py ``build_request``) and the server reads it once
    checked (serve/session.py ``check_run``: no other field, each of this type)."""

    op: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    stdout_isatty: bool
    stderr_isatty: bool
    stdout_encoding: str
    stderr_encoding: str
    stdout_errors: str
    stderr_errors: str
    stdin: str  # base64
    stream_stderr: bool
    keepalive_s: float  # seconds: a JSON number


class ModelRow(TypedDict):
    """One model of ``serve --status``' table (serve/cache.py ``ModelCache.summary``, the server's queued ones):
    ``state`` ready, loading or queued; ``device`` where it runs; ``bytes`` None until loaded; ``spec``: the
    ModelSpec's JSON form."""

    model: str
    state: str
    dtype: str
    device: str
    init: str
    bytes: int | None
    reloads: int
    last_reload: str | None
    spec: dict[str, object]


class JobRow(TypedDict):
    """One run request of ``serve --status`` and ``serve --cancel`` (serve/jobs.py ``Job.row``): ``state``
    running or queued since ``since`` (local ISO time), ``for_s`` seconds ago."""

    id: int
    command: str
    state: str
    since: str
    for_s: float
    cancelling: bool


class Status(TypedDict):
    """The answer to ``status`` (serve/server.py ``Server.status``)."""

    pid: int
    socket: str
    uptime_s: float
    requests: int
    peak_rss_bytes: int
    max_bytes: int | None
    idle_timeout_s: float | None
    version: object
    location: object
    digest: object
    models: list[ModelRow]
    jobs: list[JobRow]


@final  # no other key: `"error" in answer` tells a Refusal from it
class RunAnswer(TypedDict):
    """The answer to ``run``: the command's stdout and stderr bytes (base64) and its exit code."""

    stdout: str
    stderr: str
    exit_code: int


@final
class Refusal(TypedDict):
    """A request refused or failed: the one-line message (printed as ``error: …``) and the exit code."""

    error: str
    exit_code: int


class Cancelled(TypedDict):
    """The answer to ``cancel``: the jobs cancelled and the ids not found."""

    cancelled: list[JobRow]
    not_found: list[int]


class Stopped(TypedDict):
    stopped: bool
    pid: int


Answer = Status | Stopped | Cancelled | RunAnswer | Refusal  # what the server answers a request


class ProtocolError(Exception):
    """The peer closed the connection or sent something that is not a message."""


class Closed(ProtocolError):
    """The peer closed the connection between two messages."""


def identity() -> dict[str, object]:
    """This install: ``{"protocol", "version", "location", "digest"}``.

    ``location`` is the package's directory; ``digest`` the first 16 hex digits of a SHA-256 over every
    ``.py`` file of the package (relative path and bytes), so an edited or rebuilt source is a different
    server even under the same version number. About 10 ms.
    """

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return {"protocol": PROTOCOL, "version": __version__, "location": str(root),
            "digest": digest.hexdigest()[:16]}


def mismatch(ours: dict[str, object], theirs: dict[str, object]) -> str | None:
    """Why a peer's identity would answer differently from ours (one phrase), or None when it would not.

    Protocol, package version and source digest must agree; two installs of the same source may serve
    each other.
    """
    if theirs.get("protocol") != ours["protocol"]:
        return f"speaks protocol {theirs.get('protocol', 1)}, not {ours['protocol']}"
    if theirs.get("version") != ours["version"] or theirs.get("digest") != ours["digest"]:
        return (f"is version {theirs.get('version')} from {theirs.get('location')} (source {theirs.get('digest')}), "
                f"not this version {ours['version']} from {ours['location']} (source {ours['digest']})")
    return None


def default_socket() -> Path:
    """``$XDG_RUNTIME_DIR/anatomy/anatomy.sock``, else ``/tmp/anatomy-<uid>/anatomy.sock``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "anatomy" if runtime else Path(f"/tmp/anatomy-{os.getuid()}")
    return base / "anatomy.sock"


def socket_path() -> tuple[Path, bool]:
    """``(path, explicit)``: ``$ANATOMY_SERVER`` (explicit) or the default socket."""
    env = os.environ.get(ENV_SOCKET)
    return (Path(env).expanduser(), True) if env else (default_socket(), False)


def private_dir(path: Path) -> None:
    """Create the socket's directory 0700, or check an existing one is ours and 0700.

    Raises PermissionError when the directory belongs to another user or others can enter it:
    a socket there could be someone else's.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(path)


def check_private(path: Path) -> None:
    """Raise PermissionError unless ``path`` is owned by us and closed to group and others."""
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
                              f"it must be 0700")


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid (Linux SO_PEERCRED); None where the platform cannot say."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


def send(conn: socket.socket, message: Mapping[str, object]) -> None:
    """Write one framed JSON message."""
    data = json.dumps(message, ensure_ascii=False).encode("utf-8")
    # MSG_NOSIGNAL: a peer that went away is a BrokenPipeError here, not a SIGPIPE that ends the process.
    conn.sendall(_HEADER.pack(len(data)) + data, getattr(socket, "MSG_NOSIGNAL", 0))


def receive(conn: socket.socket) -> dict[str, object]:
    """Read one framed JSON message. Raises ProtocolError on EOF or garbage, socket.timeout on a timeout."""
    (size,) = _HEADER.unpack(_read(conn, _HEADER.size, first=True))
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes is over the {MAX_MESSAGE}-byte limit")
    try:
        message = json.loads(_read(conn, size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not a JSON message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    return message


def _read(conn: socket.socket, n: int, first: bool = False) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise Closed("connection closed") if first and not chunks else ProtocolError("connection closed "
                                                                                         "mid-message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def connect(path: Path, timeout: float = 2.0) -> socket.socket:
    """A connected client socket. Raises OSError (FileNotFoundError, ConnectionRefusedError, ...)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        raise
    return conn


def timeout() -> float:
    """Seconds a client waits for a message from the server (a running job sends keep-alives, so this bounds
    a server that stopped answering, not a long job): ``$ANATOMY_SERVER_TIMEOUT`` or 600. Raises ValueError
    if invalid."""
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{ENV_TIMEOUT}={raw!r} is not a positive number of seconds")
    return value


def keepalive_interval(wait: float) -> float:
    """How often a client that gives up after ``wait`` silent seconds asks to hear from the server while its
    job waits or runs: every :data:`KEEPALIVE_S` seconds, or a quarter of ``wait`` when that is shorter."""
    return max(min(KEEPALIVE_S, wait / 4), MIN_KEEPALIVE_S)


def request(path: Path, message: Mapping[str, object], wait: float | None = None) -> dict[str, object]:
    """Send one request and wait ``wait`` seconds for its answer (default :func:`timeout`)."""
    conn = connect(path)
    try:
        conn.settimeout(wait if wait is not None else timeout())
        send(conn, message)
        return receive(conn)
    finally:
        conn.close()

