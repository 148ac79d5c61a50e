"""Rich tables for a terminal, drawn as :mod:`anatomy_cli.output.widths` lays them out.

Used by :mod:`anatomy_cli.output.render` for ``--format table``. The layout is decided there, by one rule for
every command, not by rich's shrinking (which cuts any column, numbers included, to ``131,072,…``, and folds
words: ``intermediat`` / ``e``): numbers whole, text wrapped at spaces, a too-long word abbreviated in its
middle, the least important columns left out (named by :func:`drop_note` on stderr), a one-row table too
wide as ``column  value`` lines. Width is the console's (``COLUMNS`` when set, else the terminal's, else 80).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import replace

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from anatomy_cli.output.kinds import BAR_KINDS as BARS
from anatomy_cli.output.kinds import NUMERIC
from anatomy_cli.output.kinds import Column
from anatomy_cli.output.kinds import Section
from anatomy_cli.output.widths import names
from anatomy_cli.output.widths import plan
from anatomy_cli.output.widths import shorten

# SIMPLE_HEAD in ASCII, for streams that cannot encode box characters (rich would draw a full ASCII grid).
ASCII_SIMPLE_HEAD = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def render_section(console: Console, section: Section, cells: Callable[[object, Column], str], *,
                   safe: Callable[[str], str] = str, unicode: bool = True) -> list[str]:
    """Print one section as a table that fits ``console.width``; the names of the columns left out, for
    :func:`drop_note` (bar columns, pictures of a number beside them, go unnamed).

    ``cells(value, column)`` gives a cell's display string, ``safe(text)`` makes the title and
    headers safe for the stream (both escape what its encoding lacks); ``unicode``: box characters.
    """
    columns = [replace(c, header=safe(c.title)) for c in section.columns]
    rows = [[cells(row.get(c.key), c) for c in columns] for row in section.rows]
    title = Text(safe(section.title)) if section.title else None
    layout = plan(columns, rows, console.width)
    if layout.vertical:
        _vertical(console, columns, rows[0], title, console.width)
        return []
    table = Table(title=title, box=box.SIMPLE_HEAD if unicode else ASCII_SIMPLE_HEAD, title_justify="left",
                  pad_edge=False, show_edge=False, padding=(0, 1 if layout.gap == 3 else 0))
    for i, w in zip(layout.keep, layout.widths):
        column = columns[i]
        table.add_column(Text(shorten(column.title, w)), justify="right" if column.kind in NUMERIC else "left",
                         width=w, style="cyan" if column.kind == "bar" else None, no_wrap=column.kind in BARS,
                         overflow="ellipsis")
    for row in rows:
        table.add_row(*(_cell(columns[i], row[i], w) for i, w in zip(layout.keep, layout.widths)))
    console.print(table)
    return names(columns, [i for i, c in enumerate(columns) if i not in layout.keep and c.kind not in BARS])


def drop_note(dropped: Sequence[str], width: int) -> str:
    """The one stderr line naming the columns :func:`render_section` left out."""
    return (f"note: not shown at {width} columns: {', '.join(dropped)} (--format tsv or json, or a wider "
            "terminal, shows every column)")


def _cell(column: Column, cell: str, width: int) -> Text:
    if column.kind == "signed_bar":
        return _signed(cell)
    if column.kind in NUMERIC or column.kind in BARS:
        return Text(cell, no_wrap=True)
    return Text(shorten(cell, width))


def _signed(cell: str) -> Text:
    """A signed bar: red left of the centre line (negative), blue right of it (positive). The colour
    only repeats what the side already says."""
    centre = max(cell.find("│"), cell.find("|"))
    text = Text(cell, no_wrap=True)
    if centre >= 0:
        text.stylize("red", 0, centre)
        text.stylize("blue", centre + 1)
    return text


def _vertical(console: Console, columns: Sequence[Column], row: list[str], title: Text | None, width: int) -> None:
    """One row as ``column  value`` lines (bars left out); values wrap at spaces, long words abbreviated."""
    if title is not None:
        console.print(title)
    shown = [(c, cell) for c, cell in zip(columns, row) if c.kind not in BARS]
    label = min(max(cell_len(c.title) for c, _ in shown), width // 2)
    room = max(width - label - 2, 1)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(width=label, overflow="ellipsis")
    grid.add_column(width=room, overflow="ellipsis")
    for column, cell in shown:
        grid.add_row(Text(shorten(column.title, label), style="bold"), Text(shorten(cell, room)))
    console.print(grid)
