"""The prompt pipeline shared by commands that run prompts through a model (`trace`, `next`, ...).

A command reads its options as two objects (:func:`anatomy_cli.cli.options.model_options` hands it a
``ModelSpec``, :func:`~anatomy_cli.cli.options.prompt_options` a ``PromptOptions``), then, in this order:

1. :func:`open_prompts` (or :func:`open_texts`, :func:`open_model`): the model's config, tokenizer and
   :class:`~anatomy_cli.models.info.ModelInfo`, without any weight (and without torch where the files
   allow); PROMPT (one text, or ``-`` for one prompt per non-empty stdin line) tokenized (special-token
   text is plain text unless ``--allow-special``) and checked against the context length (``--truncate
   left`` cuts, said on stderr);
2. its own checks on ``opened.info`` and ``opened.tokenizer`` (``--layer``, ``--position``, target tokens),
   so bad input fails in a second;
3. :func:`load_weights`: the weights, with a status line on a terminal.

Both phases go through the current :class:`~anatomy_cli.engine.opening.Loader` (``anatomy serve`` hands
its cache). The command runs the engine; :func:`emit_prompts` prints one report per prompt:

* ``jsonl``: one object per prompt, always;
* ``json``: the object for a PROMPT argument, ``{"results": [...]}`` for stdin
  (decided by the source, not by how many lines it had, so scripts get one shape);
* ``tsv``/``csv``: for stdin, each section's rows of all prompts together with a
  leading ``prompt`` column; on stderr the model line once, each prompt's own heading lines and notes
  (each note naming its prompt), then the notes every prompt shares, once;
* ``table``: one report after the other, each with its own heading.

No torch at import time.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import TypeVar

import typer

from anatomy_cli.cli.options import default_model
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.output.render import emit_jsonl
from anatomy_cli.output.render import resolve_format
from anatomy_cli.tasks.session import bos_text  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import describe  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import dtype_name  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import load_model  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import load_weights  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import model_label  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import open_model  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import open_prompts  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import open_texts  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import placement_line  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import prompt_line  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import prompt_record  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.tasks.session import warn_cost  # noqa: F401  (the pipeline lives in the task layer)
from anatomy_cli.text.inputs import read_prompts

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.output.views.protocol import DrawnView
    from anatomy_cli.output.views.protocol import FigureArgs

PromptArg = Annotated[str, typer.Argument(
    metavar="PROMPT", show_default=False,
    help="The prompt text, or '-' to read one prompt per non-empty line of stdin.")]


def read_prompts_file(path: str) -> list[str]:
    """``--prompts FILE``: one prompt per non-empty line of FILE (``-``: stdin). Raises UsageError for a missing
    file, no prompt, invalid UTF-8."""
    if path == "-":
        return read_prompts("-")
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--prompts {path}: no such file")
    try:
        with file.open("rb") as f:
            return read_prompts("-", stdin=f)
    except UsageError as exc:  # the reader names stdin: name the file
        raise UsageError(f"--prompts {path}: " + str(exc).replace("stdin line", "line").replace(
            "no prompts on stdin", "no prompts in the file")) from None


R = TypeVar("R")


def draw_and_emit(command: str, view: DrawnView[R], lm: LoadedModel, encoded: Sequence[Encoded], results: Sequence[R],
                  plot: Path | None, fmt: Format | None, prompt: str) -> None:
    """``--plot``'s picture of each prompt (``view.figure``; one numbered file per prompt from stdin), then the
    reports (``view.report``) as :func:`emit_prompts` prints them."""
    draw_each(command, plot, prompt, (view.figure(lm, enc, r) for enc, r in zip(encoded, results)))
    emit_prompts([view.report(lm, enc, r) for enc, r in zip(encoded, results)], fmt, from_stdin=prompt == "-")


def emit_prompts(reports: Sequence[Report], fmt: Format | None, *, from_stdin: bool) -> None:
    """Print one report per prompt in ``fmt`` (see the module docstring for the layout)."""
    fmt = resolve_format(fmt)
    if fmt is Format.jsonl:
        emit_jsonl(r.data for r in reports)
    elif from_stdin and fmt is Format.json:
        emit(Report(data={"results": [r.data for r in reports]}, sections=()), fmt)
    elif from_stdin and fmt in (Format.tsv, Format.csv):
        emit(Report(data=None, sections=_with_prompt_column(reports), heading=_batch_lines(reports)), fmt)
    else:
        for report in reports:
            emit(report, fmt)


def _batch_lines(reports: Sequence[Report]) -> list[str]:
    """The stderr lines of a stdin batch in tsv/csv: the first heading line (the model, "untrained") once where
    every prompt has it; then each prompt's own heading lines (its prompt line, its counts) and its notes, each
    note naming its prompt; last the notes every prompt has, once."""
    first = reports[0].heading[:1]
    shared_first = all(r.heading[:1] == first for r in reports)
    shared = [n for n in dict.fromkeys(reports[0].notes) if all(n in r.notes for r in reports)]
    lines = list(first) if shared_first else []
    for r in reports:
        lines += r.heading[1:] if shared_first else r.heading
        lines += [f"prompt {r.data['prompt']!r}: {n}" for n in dict.fromkeys(r.notes) if n not in shared]
    return lines + shared


def _with_prompt_column(reports: Sequence[Report]) -> list[Section]:
    merged = []
    for i, first in enumerate(reports[0].sections):
        rows = [{"prompt": r.data["prompt"], **row} for r in reports for row in r.sections[i].rows]
        merged.append(Section(columns=[Column("prompt"), *first.columns], rows=rows, title=first.title))
    return merged


def draw_each(command: str, plot: Path | None, prompt: str | None,
              figures: Iterable[FigureArgs]) -> None:
    """``--plot FILE``: one picture per prompt (``FILE-1.png``, ... for a stdin batch) from the view's
    ``figure(...) -> (args, kwargs)``; nothing without ``plot`` (the figures are not computed then)."""
    if not plot:
        return
    plots = when_run("output.plots")

    for i, (args, kwargs) in enumerate(figures, start=1):
        plots.draw(command, plot, i if prompt == "-" else None, *args, **kwargs)


def model_given(spec: ModelSpec) -> bool:
    """Whether ``--model`` was given, as a task reads it (tasks/recorded_model.py ``chosen``: the model a dictionary
    records where not): the CLI cannot tell ``--model`` left out from ``--model`` naming the default model, so a
    spec naming the default counts as not given."""
    return spec.model != default_model()
