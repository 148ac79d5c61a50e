"""The Typer application and the one place that turns errors into exit codes.

Exit codes: 0 success, 1 runtime error (:class:`AnatomyError`), 2 usage error
(click's usage errors and :class:`UsageError`). Expected errors print one line
``error: ...`` on stderr; ``--debug`` (or ``ANATOMY_DEBUG=1``) adds the traceback.
A closed stdout (``| head -1``) ends the process quietly, exit 0 (:meth:`AnatomyGroup.invoke`).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any

import typer
from typer.core import TyperCommand
from typer.core import TyperGroup

from anatomy_cli.tasks.notes import using_notes

# Typer >= 0.20 vendors click as typer._click; its exception classes live there.
if TYPE_CHECKING:  # checked against the vendored click
    from typer._click import exceptions as _cx
    from typer._click.core import Command
    from typer._click.core import Context

    from anatomy_cli.declare.fields import Opt
else:
    try:
        from typer._click import exceptions as _cx
    except ImportError:  # older typer on real click
        from click import exceptions as _cx

import difflib

from typer.main import get_command

from anatomy_cli import __version__
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import quiet_broken_pipe
from anatomy_cli.output.sink import STDERR
from anatomy_cli.output.sink import error_line
from anatomy_cli.output.sink import info
from anatomy_cli.output.sink import status  # noqa: F401  (the one stderr sink)
from anatomy_cli.output.sink import warn  # noqa: F401  (the one stderr sink)
from anatomy_cli.output.sink import wrote  # noqa: F401  (the one stderr sink)

_state = {"debug": bool(os.environ.get("ANATOMY_DEBUG"))}


def debug_enabled() -> bool:
    return _state["debug"]


class LensValueOptional(TyperCommand):
    """A command whose ``--lens`` may be given bare (click's ``flag_value``, which typer's parser lacks): a bare
    ``--lens``, last or before another option, is ``--lens logit``; ``--lens tuned:DIR`` names a fitted lens."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self.bare_lens(args))

    @staticmethod
    def bare_lens(args: list[str]) -> list[str]:
        """``args`` with a bare ``--lens`` written ``--lens=logit`` (what the parser then reads)."""
        out = list(args)
        for i, arg in enumerate(out):
            if arg == "--":
                break
            if arg == "--lens" and (i + 1 == len(out) or out[i + 1].startswith("-") and len(out[i + 1]) > 1):
                out[i] = "--lens=logit"
        return out


def _plain_metavars(command: Any) -> None:
    """Help shows ``PROMPT``, ``TEXT``, ``N``, ``PATH`` rather than typer's ``<str>``, ``<int range>``, ``{PROMPT}``.

    Arguments: their upper-case name (or metavar), ``[NAME]`` when optional, ``NAME...`` for
    several; options without a metavar: one from their type (choices keep ``<a|b|c>``).
    """
    for sub in getattr(command, "commands", {}).values():
        _plain_metavars(sub)
    for param in getattr(command, "params", ()):
        desc = getattr(param, "type_descriptor", None)
        if desc is None:  # not typer's parameter classes: nothing to fix
            continue
        if param.param_type_name == "argument":
            label = param.metavar or param.name.upper()
            optional = not param.required and not label.startswith("[")
            usage = (f"[{label}]" if optional else label) + ("..." if param.nargs != 1 else "")
            param.metavar = label
            # Instance attributes shadow typer's methods: the name alone, no type after it.
            param.display_type_rich = lambda ctx: None
            param._usage_display_name = lambda usage=usage: usage
        elif param.metavar is None and not getattr(param, "is_flag", False) and not desc.is_choice:
            param.metavar = _metavar(desc)


def _metavar(desc: Any) -> str:
    if desc.is_path:
        return "PATH"
    kind = getattr(desc, "ranged_type_name", None) if desc.is_ranged else None
    annotation = desc.annotation
    if kind == "int" or annotation is int:
        return "N"
    if kind == "float" or annotation is float:
        return "NUMBER"
    return "TEXT"


class _NoDeprecations(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "deprecated" not in str(record.msg).lower()


# Modules whose deprecation notices reach users through our own calls (``torch_dtype is deprecated``
# when a config is read); they are about library internals, not about anything the user typed.
_LIBRARY_LOGGERS = ("transformers.configuration_utils", "transformers.modeling_utils",
                    "transformers.tokenization_utils_base", "transformers.utils.generic", "accelerate.utils.modeling")


def quiet_library_warnings() -> None:
    """Silence library warnings that say nothing to the user (deprecations, future changes).

    Python's DeprecationWarning/FutureWarning, and deprecation notices that transformers logs.
    ``--debug`` (ANATOMY_DEBUG) keeps them. Imports no library: the filters sit on the loggers by name.
    """
    if _state["debug"]:
        return
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)
    for name in _LIBRARY_LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _NoDeprecations) for f in log.filters):
            log.addFilter(_NoDeprecations())


# {command name: {parameter name: its declaration}}, filled by cli/declared.py as the commands register.
DECLARED: dict[str, dict[str, Opt]] = {}


def show_limits(group: Command) -> None:
    """Put each declared limit on its click parameter (``--help`` reads ``min``/``max`` for ``x>=1``); parsing
    does not check them, the options class does (anatomy_cli/declare/fields.py)."""
    for name, sub in getattr(group, "commands", {}).items():
        for param in getattr(sub, "params", ()):
            declared = DECLARED.get(name, {}).get(param.name)
            if declared is not None and hasattr(param, "min"):
                param.min, param.max = declared.min, declared.max


def _hide_aliases(command: Any) -> None:
    """One spelling per option in ``--help``: an option shows its first long and first short name; any
    later spelling in its declaration (``typer.Option("--top", "-k", "--k")``) is a hidden alias that
    still parses (kept in ``param.aliases``). Idempotent: the server runs it on every request."""
    for sub in getattr(command, "commands", {}).values():
        _hide_aliases(sub)
    for param in getattr(command, "params", ()):
        if param.param_type_name != "option" or hasattr(param, "aliases"):
            continue
        longs = [o for o in param.opts if o.startswith("--")]
        shorts = [o for o in param.opts if not o.startswith("--")]
        param.aliases = longs[1:] + shorts[1:]
        if param.aliases:
            param.opts = [o for o in param.opts if o not in param.aliases]
            param.add_to_parser = _parsing_aliases(param)


def _parsing_aliases(param: Any) -> Any:
    original = type(param).add_to_parser

    def add_to_parser(parser: Any, ctx: Any) -> None:
        shown = param.opts
        param.opts = [*shown, *param.aliases]  # the parser knows every spelling; help reads opts afterwards
        try:
            original(param, parser, ctx)
        finally:
            param.opts = shown

    return add_to_parser


def suggest_options(typed: str, command: Command) -> list[str]:
    """The options of ``command`` a mistyped ``typed`` most likely meant, as ``git`` suggests commands.

    Names are compared without their dashes (``--top`` and ``--bos`` share only ``--``), by difflib's
    ratio (at least 0.6) or as a prefix of at least 3 characters (``--pos`` -> ``--position``); hidden
    aliases count and are answered with the shown name (``--kk`` -> ``--top`` through ``--k``).
    Best match first, at most 3.
    """
    word = typed.lstrip("-")
    canonical: dict[str, str] = {}
    for param in getattr(command, "params", ()):
        if param.param_type_name != "option" or getattr(param, "hidden", False):
            continue
        names = [*param.opts, *getattr(param, "aliases", ()), *getattr(param, "secondary_opts", ())]
        shown = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        for name in names:
            if name.startswith("--"):
                canonical.setdefault(name[2:], name if name in param.secondary_opts else shown)
    if not word or not canonical:
        return []
    scored = {name: difflib.SequenceMatcher(None, word, name).ratio() for name in canonical}
    for name in canonical:
        if len(word) >= 3 and (name.startswith(word) or word.startswith(name) and len(name) >= 3):
            scored[name] = max(scored[name], 0.75)
    best = sorted((n for n, r in scored.items() if r >= 0.6), key=lambda n: -scored[n])
    return list(dict.fromkeys(canonical[n] for n in best))[:3]


def _did_you_mean(exc: _cx.NoSuchOption) -> str:
    """click's NoSuchOption message with our suggestions instead of its own (difflib on the raw names)."""
    message = exc.message
    if exc.ctx is None or not exc.option_name.startswith("--"):
        return exc.format_message()
    found = suggest_options(exc.option_name, exc.ctx.command)
    if found:
        message += f" (did you mean {' or '.join(found)}?)"
    return message


def _usage_message(message: str) -> str:
    # typer validates with pydantic, whose messages carry its error class ("Value error, 'x' is not one of ...").
    message = message.replace("Value error, ", "").rstrip(".")
    word = message.removeprefix("No such option: ")
    if word != message and _is_number(word):
        message += (f": a negative number is a value, not an option; put -- before it, after every option "
                    f"(-- {word})")
    return message


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _debug_first(args: list[str]) -> list[str]:
    """``--debug`` is the group's option, and users put it after the command too (as the internal-error hint reads):
    every ``--debug`` before a ``--`` moves to the front, once."""
    end = args.index("--") if "--" in args else len(args)
    if "--debug" not in args[:end]:
        return args
    return ["--debug", *(a for a in args[:end] if a != "--debug"), *args[end:]]


class AnatomyGroup(TyperGroup):
    """Runs click non-standalone and maps every outcome to one exit code."""

    def invoke(self, ctx: Context) -> Any:
        """The command; a reader that closed stdout early (``| head -1``) took what it wanted: exit 0, quietly (click
        would answer its BrokenPipeError with exit 1)."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            quiet_broken_pipe()
            return 0

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        args = _debug_first(list(sys.argv[1:] if args is None else args))
        _state["debug"] = bool(os.environ.get("ANATOMY_DEBUG")) or args[:1] == ["--debug"]
        quiet_library_warnings()
        _plain_metavars(self)
        _hide_aliases(self)
        show_limits(self)

        try:
            with using_notes(STDERR):  # what the tasks below say goes to stderr
                rv = super().main(args=args, prog_name=prog_name or "anatomy", complete_var=complete_var,
                                  standalone_mode=False, windows_expand_args=windows_expand_args, **extra)
            code = rv if isinstance(rv, int) else 0
        except _cx.NoArgsIsHelpError as exc:
            # typer raises this (exit 2) for a bare `anatomy`; show help on stderr.
            info(exc.ctx.get_help() if exc.ctx else str(exc))
            code = 2
        except _cx.UsageError as exc:
            if _state["debug"]:
                traceback.print_exc()
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            text = _did_you_mean(exc) if isinstance(exc, _cx.NoSuchOption) else exc.format_message()
            error_line(_usage_message(text) + hint)
            code = exc.exit_code
        except _cx.ClickException as exc:
            error_line(exc.format_message())
            code = exc.exit_code
        except typer.Abort:
            info("aborted")
            code = 130
        except AnatomyError as exc:
            if _state["debug"]:
                traceback.print_exc()
            error_line(str(exc))
            code = exc.exit_code
        except BrokenPipeError:
            quiet_broken_pipe()
            code = 0
        except KeyboardInterrupt:
            info("interrupted")
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
    help="Inspect the anatomy of transformer language models: parameters and tokens, the residual stream and "
    "its lenses (logit, tuned, Jacobian), attention heads, attribution, patching and ablation, steering, MoE "
    "routing, SAEs and transcoders, attribution circuits, runs over a corpus, quantized models against their "
    "source; `anatomy serve` keeps models loaded between commands.",
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
    no_server: Annotated[bool, typer.Option(
        "--no-server", help="Run in this process even when `anatomy serve` is running (also accepted after the "
        "command name).")] = False,
) -> None:
    if debug:
        _state["debug"] = True


def click_command() -> Command:
    """The app as one click command, with every command registered by then: the registry that
    `anatomy serve` runs forwarded command lines on (handed to :class:`anatomy_cli.serve.server.Server`,
    which imports no CLI module)."""
    return get_command(app)
