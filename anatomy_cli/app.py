"""The Typer application and the one place that turns errors into exit codes.

Exit codes: 0 success, 1 runtime error (:class:`AnatomyError`), 2 usage error
(click's usage errors and :class:`UsageError`). Expected errors print one line
``error: ...`` on stderr; ``--debug`` (or ``ANATOMY_DEBUG=1``) adds the traceback.
A closed stdout (``| head -1``) ends the process quietly.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

# Typer >= 0.20 vendors click as typer._click; its exception classes live there.
try:
    from typer._click import exceptions as _cx
except ImportError:  # older typer on real click
    from click import exceptions as _cx

from anatomy_cli import __version__
from anatomy_cli.errors import AnatomyError

_state = {"debug": bool(os.environ.get("ANATOMY_DEBUG"))}


def debug_enabled() -> bool:
    return _state["debug"]


def error_line(message: str) -> None:
    """Print ``error: message`` as one line on stderr (newlines folded)."""
    text = " ".join(str(message).split("\n")).strip()
    print(f"error: {text}", file=sys.stderr)


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def info(message: str) -> None:
    """Print an informational line on stderr."""
    print(message, file=sys.stderr)


def _quiet_broken_pipe() -> None:
    # Python flushes stdout at exit; point it at devnull so that flush cannot raise again.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class AnatomyGroup(TyperGroup):
    """Runs click non-standalone and maps every outcome to one exit code."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        _state["debug"] = bool(os.environ.get("ANATOMY_DEBUG"))
        try:
            rv = super().main(args=args, prog_name=prog_name or "anatomy", complete_var=complete_var,
                              standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except _cx.NoArgsIsHelpError as exc:
            # typer raises this (exit 2) for a bare `anatomy`; show help on stderr.
            print(exc.ctx.get_help() if exc.ctx else str(exc), file=sys.stderr)
            code = 2
        except _cx.UsageError as exc:
            if _state["debug"]:
                traceback.print_exc()
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            error_line(exc.format_message() + hint)
            code = exc.exit_code
        except _cx.ClickException as exc:
            error_line(exc.format_message())
            code = exc.exit_code
        except typer.Abort:
            print("aborted", file=sys.stderr)
            code = 130
        except AnatomyError as exc:
            if _state["debug"]:
                traceback.print_exc()
            error_line(str(exc))
            code = exc.exit_code
        except BrokenPipeError:
            _quiet_broken_pipe()
            code = 0
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            code = 130
        except Exception as exc:  # an unexpected failure is still one line unless --debug
            if _state["debug"]:
                traceback.print_exc()
                code = 1
            else:
                error_line(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
                code = 1
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=AnatomyGroup,
    name="anatomy",
    help="Inspect the anatomy of transformer language models: parameters, residual stream, "
    "logit lens, next-token probabilities, word drift, tokens and LayerNorm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"anatomy {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    if debug:
        _state["debug"] = True
