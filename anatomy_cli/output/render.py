"""The one output layer: every command's results go to stdout through here.

A command builds a :class:`Report` — the JSON document (``data``, the result's
``to_dict()``) plus one or more :class:`Section` tables — and calls :func:`emit`.

Formats (:class:`Format`):

- ``table``: a rich table, the default when stdout is a terminal. Cells are
  :class:`rich.text.Text`, so user text is never parsed as markup. Fitted to the
  terminal by one rule (:mod:`anatomy_cli.output.widths`): numbers are never cut nor
  words split; text wraps at spaces, and the lowest-priority columns are left out,
  named on stderr.
- ``tsv``: the default when stdout is not a terminal. A header row of column
  keys, then raw values; no colour, no box characters. Several sections are
  separated by one blank line. Tabs/newlines inside values are escaped as
  ``\\t``/``\\n``.
- ``csv``: RFC 4180 (``csv`` module, CRLF line ends), same layout as tsv.
- ``json``: ``data`` as one document, snake_case keys, raw numbers.
- ``jsonl``: one JSON object per line (:func:`emit_jsonl`, for per-prompt streams).

On a stream whose encoding lacks some characters (``PYTHONIOENCODING=ascii``),
JSON uses ``\\u`` escapes and the other formats Python escapes (``\\u21b5``); output never fails.

Report ``notes`` (context such as "untrained weights" or footnotes) are printed
under the table in table mode; in tsv/csv mode they go to stderr so that stdout
stays machine-readable; in json they are expected to be part of ``data``.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import os
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from enum import Enum
from typing import Any
from typing import Protocol
from typing import TextIO

from anatomy_cli.output import sink
from anatomy_cli.output.kinds import BAR_KINDS
from anatomy_cli.output.kinds import Column
from anatomy_cli.output.kinds import Section
from anatomy_cli.units import human_bytes


class Format(str, Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"
    csv = "csv"
    tsv = "tsv"


# A token as every table of tokens shows it (trace, next, generate, lens): its text, id and probability.
TOKEN_COLUMNS = (Column("token", "token"), Column("token_id", "id", "id"),
                 Column("probability", "probability", "prob", 4))


@dataclass(frozen=True)
class Report:
    """What a command prints: ``data`` for json, ``sections`` for the tables."""

    data: Any
    sections: Sequence[Section]
    heading: Sequence[str] = field(default_factory=tuple)
    notes: Sequence[str] = field(default_factory=tuple)


def resolve_format(fmt: Format | None, stream: TextIO | None = None) -> Format:
    """``fmt`` if given, else ``table`` on a terminal and ``tsv`` otherwise."""
    if fmt is not None:
        return fmt
    stream = stream or sys.stdout
    isatty = getattr(stream, "isatty", None)
    return Format.table if isatty is not None and isatty() else Format.tsv


def emit(report: Report, fmt: Format | None = None, *, out: TextIO | None = None) -> None:
    """Write ``report`` to stdout (or ``out``) in ``fmt`` (see :func:`resolve_format`).

    Never fails on the stream's encoding: on a stream that cannot encode every character
    (``PYTHONIOENCODING=ascii``, a cp1252 file on Windows) JSON uses ``\\u`` escapes and the
    other formats write what the stream lacks as Python escapes (``↵`` -> ``\\u21b5``).
    """
    out = out or sys.stdout
    fmt = resolve_format(fmt, out)
    if fmt is Format.json:
        out.write(to_json(report.data, indent=2, ascii=not is_unicode(out)) + "\n")
    elif fmt is Format.jsonl:
        out.write(to_json(report.data, ascii=not is_unicode(out)) + "\n")
    elif fmt in (Format.tsv, Format.csv):
        _emit_delimited(report.sections, fmt, out if is_unicode(out) else _Escaping(out))
        for line in (*report.heading, *report.notes):
            sink.info(line)
    else:
        _emit_table(report, out)
    out.flush()


def emit_jsonl(records: Iterable[object], *, out: TextIO | None = None) -> None:
    """Write one compact JSON document per line, flushing after each (``\\u`` escapes as in :func:`emit`)."""
    out = out or sys.stdout
    ascii_only = not is_unicode(out)
    for record in records:
        out.write(to_json(record, ascii=ascii_only) + "\n")
        out.flush()


def to_json(data: object, indent: int | None = None, *, ascii: bool = False) -> str:
    """JSON with raw numbers; NaN/inf become null so the output stays valid JSON.

    ``ascii``: every non-ASCII character as a ``\\u`` escape (the same JSON value).
    """
    return json.dumps(_jsonable(data), indent=indent, ensure_ascii=ascii)


def is_unicode(stream: object) -> bool:
    """True when ``stream`` encodes every character: a UTF encoding, or no encoding (StringIO)."""
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def fit(text: str, stream: TextIO) -> str:
    """``text`` with what ``stream``'s encoding lacks written as escapes (``\\u21b5``, ``\\xe9``)."""
    if is_unicode(stream):
        return text
    encoding = stream.encoding
    return text.encode(encoding, "backslashreplace").decode(encoding)


class _Escaping:
    """A text stream that escapes what the underlying stream cannot encode (for csv/tsv)."""

    def __init__(self, out: TextIO):
        self._out = out

    def write(self, text: str) -> int:
        return self._out.write(fit(text, self._out))

    def flush(self) -> None:
        self._out.flush()


def _jsonable(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _jsonable(value.item())
    return value



def _machine_columns(section: Section) -> list[Column]:
    return [c for c in section.columns if c.kind not in BAR_KINDS]


def _raw(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if hasattr(value, "item") and callable(value.item):
        return _raw(value.item())
    if isinstance(value, (list, tuple)):
        return " ".join(_raw(v) for v in value)
    return str(value)


def _tsv_cell(value: object) -> str:
    text = _raw(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


class _Writer(Protocol):
    """What the delimited formats write to: a text stream, or :class:`_Escaping` around one."""

    def write(self, text: str, /) -> int: ...


def _emit_delimited(sections: Sequence[Section], fmt: Format, out: _Writer) -> None:
    for i, section in enumerate(sections):
        if i:
            out.write("\n")
        cols = _machine_columns(section)
        if fmt is Format.csv:
            writer = csv.writer(out, lineterminator="\r\n")
            writer.writerow([c.key for c in cols])
            for row in section.rows:
                writer.writerow([_raw(row.get(c.key)) for c in cols])
        else:
            out.write("\t".join(c.key for c in cols) + "\n")
            for row in section.rows:
                out.write("\t".join(_tsv_cell(row.get(c.key)) for c in cols) + "\n")


_BAR_WIDTH = 24


def _human(value: object, column: Column) -> str:
    if value is None:
        return ""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    kind = column.kind
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if kind == "int" and isinstance(value, (int, float)):
        return f"{int(value):,}"
    if kind == "float" and isinstance(value, (int, float)):
        return f"{value:.{column.digits}f}"
    if kind in ("prob", "number") and isinstance(value, (int, float)):
        return f"{value:.{column.digits}f}" if value == 0 or abs(value) >= 10 ** -column.digits else f"{value:.2e}"
    if kind == "pct" and isinstance(value, (int, float)):
        return f"{100 * value:.{column.digits}f}%"
    if kind == "bytes" and isinstance(value, (int, float)):
        return human_bytes(value)
    if kind == "bar" and isinstance(value, (int, float)):
        cells = max(0.0, min(1.0, float(value))) * _BAR_WIDTH
        full = int(cells)
        return "█" * full + ("▌" if cells - full >= 0.5 else "")
    if kind == "signed_bar" and isinstance(value, (int, float)):
        return signed_bar(float(value))
    return _raw(value)


def signed_bar(value: float, half: int = _BAR_WIDTH // 2) -> str:
    """``value`` in [-1, 1] as ``half`` cells either side of a centre ``│``: ``    ██▐│`` or ``│██▌``.

    Negative values grow left, positive right; the position alone carries the sign (no colour needed).
    Every bar has the same width (``2 * half + 1``), so the centre lines up down a column.
    """
    cells = max(-1.0, min(1.0, value)) * half
    full = int(abs(cells))
    part = abs(cells) - full >= 0.5
    if cells < 0:
        left = ("▐" if part else "") + "█" * full
        return " " * (half - len(left)) + left + "│" + " " * half
    right = "█" * full + ("▌" if part else "")
    return " " * half + "│" + right + " " * (half - len(right))


def stdout_console(out: TextIO | None = None):
    """A rich console on stdout; colour follows the terminal and NO_COLOR. A closed pipe (``| head -1``) is a
    BrokenPipeError, which the CLI's top answers (exit 0), where rich's own answer is exit 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole(file=out or sys.stdout, highlight=False, markup=False, emoji=False,
                   no_color=bool(os.environ.get("NO_COLOR")) or None)


def _emit_table(report: Report, out: TextIO) -> None:
    from rich.text import Text

    from anatomy_cli.output.tables import drop_note
    from anatomy_cli.output.tables import render_section

    console = stdout_console(out)
    unicode = is_unicode(out)

    def cell(value: object, column: Column) -> str:
        if column.kind in BAR_KINDS and not unicode:
            return _human(value, column).replace("█", "#").replace("▌", "+").replace("▐", "+").replace("│", "|")
        return fit(_human(value, column), out)

    for line in report.heading:
        console.print(Text(fit(line, out), style="bold"))
    dropped: list[str] = []
    for i, section in enumerate(report.sections):
        if i:  # between sections; never before the first table (nor after the last)
            console.print()
        dropped += render_section(console, section, cell, safe=lambda text: fit(text, out), unicode=unicode)
    for note in report.notes:
        console.print(Text(fit(note, out), style="dim"))
    if dropped:
        sink.info(drop_note(list(dict.fromkeys(dropped)), console.width))
