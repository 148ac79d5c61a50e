"""Rich tables for a terminal: widths that never cut a number, and a vertical layout when nothing fits.

Used by :mod:`anatomy_cli.output.render` for ``--format table``. The layout is decided here, not
by rich's shrinking (which cuts any column, numbers included, to ``131,072,…``):

1. every column at its natural width, one padding space each side;
2. tighter: one space between columns;
3. text columns (tokens, names) wrap, down to :data:`TEXT_MIN` characters; bar columns are dropped;
4. still too wide: one block per row, ``column  value`` lines (a vertical layout).

A number (``int``, ``id``, ``float``, ``number``, ``prob``, ``pct``, ``bytes`` columns) is always printed
whole. Width is the console's (``COLUMNS`` when set, else the terminal's, else 80).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

NUMERIC = ("int", "id", "float", "number", "prob", "pct", "bytes")
TEXT_MIN = 8  # a wrapped text column keeps at least this many characters per line

# SIMPLE_HEAD in ASCII, for streams that cannot encode box characters (rich would draw a full ASCII grid).
ASCII_SIMPLE_HEAD = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def render_section(console: Console, section: Any, cells: Callable[[Any, Any], str], *,
                   safe: Callable[[str], str] = str, unicode: bool = True) -> None:
    """Print one section as a table that fits ``console.width`` (see the module docstring).

    ``cells(value, column)`` gives a cell's display string, ``safe(text)`` makes the title and
    headers safe for the stream (both escape what its encoding lacks); ``unicode``: box characters.
    """
    columns = [replace(c, header=safe(c.title)) for c in section.columns]
    rows = [[cells(row.get(c.key), c) for c in columns] for row in section.rows]
    title = Text(safe(section.title)) if section.title else None
    width = console.width
    natural = [max([cell_len(c.title)] + [cell_len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    for gap in (3, 1):  # rich: padding 1 + divider 1 + padding 1, or divider 1 alone
        if sum(natural) + gap * (len(columns) - 1) <= width:
            console.print(_table(columns, rows, natural, title, gap, unicode))
            return
    keep = [i for i, c in enumerate(columns) if c.kind not in ("bar", "signed_bar")]
    columns, rows = [columns[i] for i in keep], [[r[i] for i in keep] for r in rows]
    natural = [natural[i] for i in keep]
    widths = _fold_text(columns, natural, width - (len(columns) - 1))
    if widths is not None:
        console.print(_table(columns, rows, widths, title, 1, unicode))
        return
    _vertical(console, columns, rows, title)


def _fold_text(columns: Sequence[Any], natural: list[int], room: int) -> list[int] | None:
    """Widths with the text columns narrowed (widest first) so the sum is ``room``; None if impossible."""
    widths = list(natural)
    text = [i for i, c in enumerate(columns) if c.kind not in NUMERIC]
    floor = sum(widths[i] for i in range(len(widths)) if i not in text) + sum(min(widths[i], TEXT_MIN) for i in text)
    if floor > room:
        return None
    while sum(widths) > room:
        i = max(text, key=lambda j: widths[j])
        widths[i] -= 1
    return widths


def _table(columns: Sequence[Any], rows: list[list[str]], widths: list[int], title: Text | None, gap: int,
           unicode: bool) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD if unicode else ASCII_SIMPLE_HEAD, title_justify="left",
                  pad_edge=False, show_edge=False, padding=(0, 1 if gap == 3 else 0))
    for column, w in zip(columns, widths):
        numeric = column.kind in NUMERIC
        bar = column.kind in ("bar", "signed_bar")
        table.add_column(Text(column.title), justify="right" if numeric else "left", width=w,
                         style="cyan" if column.kind == "bar" else None, no_wrap=numeric or bar, overflow="fold")
    for row in rows:
        table.add_row(*(_signed(cell) if c.kind == "signed_bar" else Text(cell) for c, cell in zip(columns, row)))
    return table


def _signed(cell: str) -> Text:
    """A signed bar: red left of the centre line (negative), blue right of it (positive). The colour
    only repeats what the side already says."""
    centre = max(cell.find("│"), cell.find("|"))
    text = Text(cell)
    if centre >= 0:
        text.stylize("red", 0, centre)
        text.stylize("blue", centre + 1)
    return text


def _vertical(console: Console, columns: Sequence[Any], rows: list[list[str]], title: Text | None) -> None:
    if title is not None:
        console.print(title)
    label = max(cell_len(c.title) for c in columns)
    for n, row in enumerate(rows):
        if n:
            console.print()
        grid = Table.grid(padding=(0, 2))
        grid.add_column(width=label, no_wrap=True)
        grid.add_column(overflow="fold")
        for column, cell in zip(columns, row):
            grid.add_row(Text(column.title, style="bold"), Text(cell))
        console.print(grid)
