"""The `anatomy` console script: forward to a running `anatomy serve`, else run in-process.

Imports nothing heavy before it knows it must: a forwarded command never imports typer, rich,
torch or transformers.
"""

from __future__ import annotations

import sys

from anatomy_cli.errors import quiet_broken_pipe
from anatomy_cli.serve.client import NO_SERVER
from anatomy_cli.serve.client import forward


def main() -> None:
    """Run the command; a reader that closed the pipe early (``| head -1``) ends it quietly, exit 0 (Python's own
    SIGPIPE setting: a write raises BrokenPipeError, which the app and the serve client answer, and the last flush
    here, where Python's exit would otherwise print "Exception ignored")."""
    code: str | int | None
    try:
        code = _run(sys.argv[1:])
    except SystemExit as done:
        code = done.code
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_broken_pipe()
    sys.exit(code)


def _run(argv: list[str]) -> int | None:
    bad = _not_utf8(argv)
    if bad is not None:  # before the server: its protocol is JSON (UTF-8), and in-process text must be too
        print(f"error: {bad}", file=sys.stderr)
        return 2
    code = forward(argv)
    if code is not None:
        return code
    if NO_SERVER in argv[1:]:
        # Accepted anywhere on the line; the root option is what `--help` documents.
        command_at = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
        argv = [a for i, a in enumerate(argv) if not (a == NO_SERVER and i > command_at)]
    from anatomy_cli.cli.main import app

    app(args=argv)  # exits (SystemExit) with the command's code
    return None


def _not_utf8(argv: list[str]) -> str | None:
    """The message for the first argument that is not valid UTF-8 (the OS hands its bytes to Python as
    surrogate escapes), else None. Bytes count from 1, as for stdin lines and corpus files."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raw = arg.encode("utf-8", "surrogateescape")
            return (f"argument {i} is not valid UTF-8 (byte {exc.start + 1}: {raw[exc.start:exc.start + 1]!r}); "
                    f"pass text as UTF-8, or a prompt on stdin with '-'")
    return None
