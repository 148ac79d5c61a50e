"""`anatomy serve`: keep models loaded so a command costs a forward, not a start-up (see docs/serve.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated
from typing import Optional
from typing import cast

import typer

from anatomy_cli.cli.app import click_command
from anatomy_cli.cli.app import info
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.output.render import human_bytes
from anatomy_cli.serve import client
from anatomy_cli.serve import protocol
from anatomy_cli.tasks import serve as task
from anatomy_cli.tasks.notes import cancellable
from anatomy_cli.units import counted

JOB_COLUMNS = (Column("id", "id", "id"), Column("state", "state"), Column("since", "since"),
               Column("for_s", "for (s)", "float", 1), Column("command", "command"))
STATUS_COLUMNS = (Column("model", "model"), Column("state", "state"), Column("dtype", "dtype"),
                  Column("device", "device"), Column("init", "init"), Column("bytes", "memory", "bytes"),
                  Column("reloads", "reloads", "int"), Column("last_reload", "last reload"))


@command("serve", task.ServeOptions)
def serve_command(
    opts: task.ServeOptions,
    ids: Annotated[Optional[list[int]], typer.Argument(
        metavar="[ID]", show_default=False, help="With --cancel: the jobs to end. Default: all.")] = None,
    fmt: FormatOpt = None,
) -> None:
    """Start a local server that keeps models loaded. While it runs, FORWARDED send their work to it and
    print exactly what they print in-process (not forwarded: NOT_FORWARDED); --no-server runs a command
    in-process anyway.

    The server listens only on a Unix socket in a directory only you can enter (0700), the socket is 0600,
    and connections from other users are refused. It listens at once and loads the models after: a command
    for a model still loading waits for it. It runs in the foreground unless --detach: Ctrl-C, SIGTERM or
    `anatomy serve --stop` stops it and removes the socket.

    Examples:

    \b
        anatomy serve -d --model gpt2
        anatomy trace "Thank you very"          # answered by the server
        anatomy serve --status
        anatomy serve --cancel 3               # job 3 of serve --status
        anatomy serve --stop
    """
    lifecycle = when_run("serve.lifecycle")

    path = opts.socket.expanduser() if opts.socket else protocol.socket_path()[0]
    if ids and not opts.cancel:
        raise UsageError("job ids are for --cancel: `anatomy serve --cancel ID`")
    try:
        if opts.cancel:
            answer = protocol.request(path, {"op": "cancel", "ids": ids or None}, wait=30)
            if "error" in answer:
                raise AnatomyError(str(answer["error"]))
            emit(_cancel_report(cast(protocol.Cancelled, answer)), fmt)
        elif opts.status:
            emit(_status_report(cast(protocol.Status, protocol.request(path, {"op": "status"}, wait=30))), fmt)
        elif opts.stop:
            answer = lifecycle.stop(path)
            info(f"stopped the anatomy server at {path} (pid {answer.get('pid')})")
            if fmt is not None:  # asked for a format: the answer as a result too
                row = {"stopped": True, "pid": answer.get("pid"), "socket": str(path)}
                emit(Report(data=row, sections=[Section([Column("stopped"), Column("pid", "pid", "int"),
                                                          Column("socket")], [row])]), fmt)
    except (OSError, protocol.ProtocolError) as exc:
        raise AnatomyError(f"no anatomy server answers at {path} ({getattr(exc, 'strerror', None) or exc})") \
            from None
    if opts.status or opts.stop or opts.cancel:
        return
    limit = None if opts.max_memory_gb is None else int(opts.max_memory_gb * 1e9)
    if opts.detach:
        _detach(path, list(opts.models), opts.max_memory_gb, opts.idle_timeout)
        return
    _run_server(path, list(opts.models), limit, opts.idle_timeout)


# The forwarded commands, named from the one list the client forwards by (serve/client.py).
serve_command.__doc__ = (serve_command.__doc__ or "").replace("NOT_FORWARDED", "; ".join(client.not_forwarded())
                                                            ).replace("FORWARDED", client.forwarded_names())


def _detach(path: Path, models: list[str], max_memory_gb: float | None, idle_minutes: float) -> None:
    lifecycle = when_run("serve.lifecycle")

    argv = ["serve", "--socket", str(path), "--idle-timeout", repr(idle_minutes)]
    argv += [] if max_memory_gb is None else ["--max-memory-gb", repr(max_memory_gb)]
    argv += [a for m in models for a in ("--model", str(Path(m).expanduser().resolve()) if Path(m).expanduser()
                                          .exists() else m)]
    log = path.parent / "anatomy.log"
    try:
        pid = lifecycle.detach(argv, path, log)
    except (OSError, RuntimeError) as exc:  # the server's own error line, when it gave one
        message = str(exc)
        raise AnatomyError(message if message.startswith("cannot serve") else f"cannot serve at {path}: {message}") \
            from None
    info(f"anatomy server listening on {path} (pid {pid}, log {log}); stop it with `anatomy serve --stop`")


def _run_server(path: Path, models: list[str], max_bytes: int | None, idle_minutes: float) -> None:
    Server = when_run("serve.server").Server

    # The server's log is the real stderr: while a request runs, sys.stderr is that client's.
    server = Server(path, commands=click_command, max_bytes=max_bytes, idle_timeout=idle_minutes * 60,
                    cancellable=cancellable)
    try:
        server.bind()
    except PermissionError as exc:
        raise AnatomyError(f"cannot serve at {path}: {exc}") from None
    except OSError as exc:
        raise AnatomyError(f"cannot serve at {path}: {exc.strerror or exc}") from None
    try:
        server.preload(models)  # loaded by the worker once the server listens
        info(f"anatomy server listening on {path} (pid {os.getpid()}); stop it with `anatomy serve --stop` "
             f"or Ctrl-C")
        server.serve_forever()
        info("stopped")
    except KeyboardInterrupt:
        info("stopped (interrupted)")
    finally:
        server.close()
    # The socket is gone and nothing is left to save: skip the interpreter's teardown of torch and
    # transformers (seconds), so `serve --stop`, which waits for this process to exit, returns at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _status_report(answer: protocol.Status) -> Report:
    """``serve --status``' answer (a server from before ``version``, ``jobs`` or the models' state and reloads
    lacks them: read with defaults)."""
    heading = [f"anatomy server {answer.get('version', '?')} · pid {answer['pid']} · {answer['socket']}",
               f"up {answer['uptime_s']:.0f} s · {answer['requests']} requests · peak RSS "
               f"{human_bytes(answer['peak_rss_bytes'])}"]
    # A server from before the handshake lists its models without state or reloads.
    rows = [{"state": "ready", "reloads": None, "last_reload": None, **m} for m in answer["models"]]
    notes = [f"not forwarded: {line}" for line in client.not_forwarded()]
    jobs = answer.get("jobs")  # None: a server from before jobs were listed
    sections = [Section(STATUS_COLUMNS, rows, title="models")]
    if jobs:
        sections.append(Section(JOB_COLUMNS, jobs, title="jobs"))
    elif jobs is not None:
        heading.append("no command running or queued")
    return Report(data={**answer, "not_forwarded": client.not_forwarded()}, sections=sections, heading=heading,
                  notes=notes)


def _cancel_report(answer: protocol.Cancelled) -> Report:
    jobs, missing = answer.get("cancelled", []), answer.get("not_found", [])
    heading = [f"cancelled {counted(len(jobs), 'job')}" + (
        " (a running one stops at its next step)" if any(j["state"] == "running" for j in jobs) else "")]
    notes = [f"no job {i} (it finished, or never was: see serve --status)" for i in missing]
    return Report(data=answer, sections=[Section(JOB_COLUMNS, jobs, title="cancelled")], heading=heading,
                  notes=notes)
