"""`anatomy serve`: keep models loaded so a command costs a forward, not a start-up (see docs/serve.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, click_command, info
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.errors import AnatomyError, UsageError
from anatomy_cli.output.render import Column, Report, Section, emit

STATUS_COLUMNS = (Column("model", "model"), Column("dtype", "dtype"), Column("device", "device"),
                  Column("init", "init"), Column("bytes", "memory", "bytes"))


@app.command("serve")
def serve_command(
    model: Annotated[Optional[list[str]], typer.Option(
        "--model", "-m", metavar="MODEL", show_default=False,
        help="Load this model at start (repeatable); others load on first use.")] = None,
    socket_path: Annotated[Optional[Path], typer.Option(
        "--socket", metavar="PATH", show_default=False,
        help="Socket to listen on. Default: $ANATOMY_SERVER, else $XDG_RUNTIME_DIR/anatomy/anatomy.sock, "
             "else /tmp/anatomy-UID/anatomy.sock.")] = None,
    max_memory_gb: Annotated[Optional[float], typer.Option(
        "--max-memory-gb", metavar="GB", min=0.0, show_default=False,
        help="Keep loaded models under this many GB of weights; the least recently used goes first. "
             "Default: no limit.")] = None,
    idle_timeout: Annotated[float, typer.Option(
        "--idle-timeout", metavar="MINUTES", min=0.0,
        help="Stop after this many minutes without a request.")] = 30.0,
    status: Annotated[bool, typer.Option("--status", help="Show the running server's models, memory and "
                                         "uptime, then exit.")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the running server, then exit.")] = False,
    fmt: FormatOpt = None,
) -> None:
    """Start a local server that keeps models loaded. While it runs, trace, next, drift, lens, dla, attn,
    heads, ablate, patch and tokens --model send their work to it and print exactly what they print
    in-process; --no-server runs a command in-process anyway.

    The server listens only on a Unix socket in a directory only you can enter (0700), the socket is 0600,
    and connections from other users are refused. It runs in the foreground: Ctrl-C or
    `anatomy serve --stop` stops it.

    Examples:

    \b
        anatomy serve --model gpt2 &
        anatomy trace "Thank you very"          # answered by the server
        anatomy serve --status
        anatomy serve --stop
    """
    from anatomy_cli.serve import protocol

    path = socket_path.expanduser() if socket_path else protocol.socket_path()[0]
    if status and stop:
        raise UsageError("--status and --stop exclude each other")
    if status or stop:
        try:
            answer = protocol.request(path, {"op": "status" if status else "stop"}, wait=30)
        except (OSError, protocol.ProtocolError) as exc:
            raise AnatomyError(f"no anatomy server answers at {path} ({getattr(exc, 'strerror', None) or exc})") \
                from None
        if stop:
            info(f"stopped the anatomy server at {path} (pid {answer.get('pid')})")
            if fmt is not None:  # asked for a format: the answer as a result too
                row = {"stopped": True, "pid": answer.get("pid"), "socket": str(path)}
                emit(Report(data=row, sections=[Section([Column("stopped"), Column("pid", "pid", "int"),
                                                          Column("socket")], [row])]), fmt)
            return
        emit(_status_report(answer), fmt)
        return
    _run_server(path, model or [], max_memory_gb, idle_timeout)


def _run_server(path: Path, models: list[str], max_memory_gb: float | None, idle_minutes: float) -> None:
    from anatomy_cli.serve.server import Server

    server = Server(path, commands=click_command, max_bytes=None if max_memory_gb is None else int(max_memory_gb * 1e9),
                    idle_timeout=idle_minutes * 60, log=info)
    try:
        server.bind()
    except PermissionError as exc:
        raise AnatomyError(f"cannot serve at {path}: {exc}") from None
    except OSError as exc:
        raise AnatomyError(f"cannot serve at {path}: {exc.strerror or exc}") from None
    try:
        server.preload(models)
        info(f"anatomy server listening on {path} (pid {__import__('os').getpid()}); "
             f"stop it with `anatomy serve --stop` or Ctrl-C")
        server.serve_forever()
    except KeyboardInterrupt:
        info("stopped (interrupted)")
    finally:
        server.close()


def _status_report(answer: dict) -> Report:
    from anatomy_cli.output.render import human_bytes

    heading = [f"anatomy server · pid {answer['pid']} · {answer['socket']}",
               f"up {answer['uptime_s']:.0f} s · {answer['requests']} requests · peak RSS "
               f"{human_bytes(answer['peak_rss_bytes'])}"]
    return Report(data=answer, sections=[Section(STATUS_COLUMNS, answer["models"], title="loaded models")],
                  heading=heading)
