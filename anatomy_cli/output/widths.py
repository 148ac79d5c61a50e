"""How a table fits a terminal: which columns it shows and how wide each is (:func:`plan`); the one rule every
command's table follows (:mod:`anatomy_cli.output.tables` draws it). Pure: cells are display strings.

1. every column at its natural width, one padding space each side; else one space between columns;
2. bar columns go (a picture of a number printed beside it); if the natural widths now fit, done;
3. a table of one row that still does not fit is printed as ``column  value`` lines instead (nothing left
   out);
4. optional columns go (``Column.priority`` < 0: a standard error beside its mean, a sum's parts);
5. text wraps at spaces, never inside a word, down to a column's longest word; headers too (``cum.`` /
   ``influence``). The columns narrowed are those that add the fewest lines (widest first among equals);
6. a word longer than :func:`word_max` cells (a path, a long token) is abbreviated in its middle
   (``/tmp/pyte…gpt2-seed1``);
7. still too wide: more columns go, the lowest priority first (among equals the rightmost; the first column
   never). The first column alone still too wide: its words are abbreviated to the width.

A number (:data:`NUMERIC` kinds) is always printed whole. The columns left out at 4 and 7 are named on stderr by
the caller (:func:`anatomy_cli.output.tables.drop_note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len

from anatomy_cli.output.kinds import BAR_KINDS as BARS
from anatomy_cli.output.kinds import NUMERIC
from anatomy_cli.output.kinds import Column

WORD_MIN = 8  # a long word keeps at least this many cells when abbreviated (step 6)
SAMPLE = 200  # step 5 counts the lines of at most this many rows (evenly spread) to choose what to narrow


@dataclass(frozen=True)
class Plan:
    """Columns ``keep`` (indices) at ``widths``, ``gap`` cells apart (3: one padding space each side, or 1); or
    ``vertical``: the one row as ``column  value`` lines."""

    keep: list[int]
    widths: list[int]
    gap: int = 1
    vertical: bool = False


def word_max(width: int) -> int:
    """Step 6: the longest word a column keeps whole once columns would have to go (20 cells at 80)."""
    return max(WORD_MIN, width // 4)


def plan(columns: Sequence[Column], rows: list[list[str]], width: int) -> Plan:
    """The layout of ``rows`` (one display string per column) at ``width`` cells (the module docstring)."""
    texts = [[c.title, *(r[i] for r in rows)] for i, c in enumerate(columns)]
    natural = [max(cell_len(t) for t in column) for column in texts]
    every = list(range(len(columns)))
    for gap in (3, 1):
        if sum(natural) + gap * (len(columns) - 1) <= width:
            return Plan(every, natural, gap)
    shown = [i for i in every if columns[i].kind not in BARS]
    if sum(natural[i] for i in shown) + len(shown) - 1 <= width:
        return Plan(shown, [natural[i] for i in shown])
    if len(rows) == 1:
        return Plan([], [], vertical=True)
    keep = [i for n, i in enumerate(shown) if n == 0 or columns[i].priority >= 0]
    order = sorted(keep[1:], key=lambda i: (columns[i].priority, -i))  # the next to go first
    bounds = {i: _bounds(columns[i], texts[i], word_max(width)) for i in keep}
    while True:
        widths = _fit([texts[i] for i in keep], [bounds[i] for i in keep], width - len(keep) + 1)
        if widths is not None:
            return Plan(keep, widths)
        if not order:
            return Plan(keep[:1], [width])
        keep.remove(order.pop(0))


def _bounds(column: Column, texts: list[str], longest: int | None = None) -> tuple[int, int]:
    """(narrowest, natural) width of a column (``texts``: its title, then its cells): a number whole, text down
    to its longest word (at most ``longest`` cells)."""
    def words(some: list[str]) -> int:
        n = max((cell_len(w) for t in some for w in t.split()), default=0)
        return n if longest is None else min(n, longest)

    body = max((cell_len(t) for t in texts[1:]), default=0) if column.kind in NUMERIC else words(texts[1:])
    return max(words(texts[:1]), body, 1), max(cell_len(t) for t in texts)


def _fit(texts: list[list[str]], bounds: list[tuple[int, int]], room: int) -> list[int] | None:
    """Widths summing to at most ``room``, from the natural ones, each step narrowing the column that adds the
    fewest lines to the table (the widest among equals; the lines counted on at most :data:`SAMPLE` rows);
    None if the narrowest do not fit."""
    if sum(low for low, _ in bounds) > room:
        return None
    widths = [min(high, room) for _, high in bounds]
    step = max(1, (len(texts[0]) - 1) // SAMPLE) if texts else 1
    sample = [[column[0], *column[1::step]] for column in texts]  # the header, then every step-th row
    seen: dict[tuple[int, int], list[int]] = {}

    def lines(j: int, w: int) -> list[int]:
        if (j, w) not in seen:
            seen[j, w] = [wrapped(t, w) for t in sample[j]]
        return seen[j, w]

    excess = sum(widths) - room
    while excess > 0:
        per_row = [sorted(r, reverse=True) + [0] for r in zip(*(lines(j, w) for j, w in enumerate(widths)))]
        j = min((j for j, (low, _) in enumerate(bounds) if widths[j] > low),
                key=lambda j: (_height(per_row, lines(j, widths[j]), lines(j, widths[j] - 1)), -widths[j], j))
        widths[j] -= 1
        excess -= 1
    return widths


def _height(per_row: list[list[int]], now: list[int], new: list[int]) -> int:
    """The lines of the table when one column goes from ``now`` to ``new`` lines per row (``per_row``: each
    row's line counts over the columns, largest first)."""
    return sum(max(rank[1] if old == rank[0] else rank[0], n) for rank, old, n in zip(per_row, now, new))


def wrapped(text: str, width: int) -> int:
    """The lines ``text`` takes at ``width`` cells, wrapped at spaces (a longer word abbreviated to one line)."""
    n, used = 1, 0
    for word in text.split():
        k = min(cell_len(word), width)
        if used and used + 1 + k <= width:
            used += 1 + k
        elif used:
            n, used = n + 1, k
        else:
            used = k
    return n


def shorten(text: str, width: int) -> str:
    """``text`` with each word longer than ``width`` cells abbreviated in its middle: ``/tmp/pyt…seed1``."""
    if all(cell_len(w) <= width for w in text.split()):
        return text
    return " ".join(w if cell_len(w) <= width else _middle(w, width) for w in text.split(" "))


def _middle(word: str, width: int) -> str:
    if width < 2:
        return "…"[:width]
    tail = (width - 1) // 2
    return f"{_start(word, width - 1 - tail)}…{_start(word[::-1], tail)[::-1]}"


def _start(text: str, n: int) -> str:
    """The longest start of ``text`` at most ``n`` cells wide."""
    out, used = [], 0
    for ch in text:
        used += cell_len(ch)
        if used > n:
            break
        out.append(ch)
    return "".join(out)


def names(columns: Sequence[Column], dropped: list[int]) -> list[str]:
    """How a note names columns left out: the title; with the key where the title is empty or shared (``±``)."""
    titles = [c.title for c in columns]
    return [columns[i].title if columns[i].title and titles.count(columns[i].title) == 1
            else f"{columns[i].title} ({columns[i].key})".strip() for i in dropped]
