"""A report's tables: :class:`Section` (rows under columns, each a :class:`Column`) and the column kinds the
renderers treat alike (:class:`Column` describes each kind). :mod:`anatomy_cli.output.render` prints them; the
table layout (:mod:`~anatomy_cli.output.tables`, :mod:`~anatomy_cli.output.widths`) reads them."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

NUMERIC = ("int", "id", "float", "number", "prob", "pct", "bytes")  # printed whole, right-aligned, never wrapped
BAR_KINDS = ("bar", "signed_bar")  # table-only columns (a picture of a number): never in tsv/csv/json


@dataclass(frozen=True)
class Column:
    """One column of a section.

    ``kind`` decides only the human (table) rendering; machine formats always
    print the raw value:

    - ``text``: str as is (whitespace already made visible by the caller).
    - ``int``: thousands separators in the table.
    - ``id``: an identifier such as a token id: an integer without separators.
    - ``float``: ``digits`` decimals in the table.
    - ``pct``: a fraction in [0, 1] shown as a percentage with ``digits`` decimals.
    - ``prob``: a probability: ``digits`` decimals, or 3 significant digits in
      scientific notation when it would otherwise round to 0 (``3.18e-05``).
    - ``number``: any number, shown as ``prob`` is: a nonzero value never reads 0 (``1.00e-12``).
    - ``bytes``: a byte count shown in human units (KiB, MiB, GiB).
    - ``bar``: a bar proportional to the fraction in ``key``; table mode only.
    - ``signed_bar``: a value in [-1, 1] as a bar growing left (negative) or right (positive) from a
      centre line ``│``, so the sign reads without colour (``NO_COLOR``, a pipe); table mode only.

    ``priority``: on a terminal too narrow for every column, the lowest priority is left out first (among
    equal ones the rightmost; the first column never); a negative one marks an optional column (a standard
    error, a sum's parts), left out as soon as the table is too wide (:mod:`anatomy_cli.output.widths`).
    Machine formats print every column.
    """

    key: str
    header: str | None = None
    kind: str = "text"
    digits: int = 4
    priority: int = 0

    @property
    def title(self) -> str:
        return self.header if self.header is not None else self.key


@dataclass(frozen=True)
class Section:
    """One table: ``rows`` are mappings from column key to raw value (None = empty)."""

    columns: Sequence[Column]
    rows: Sequence[Mapping[str, object]]
    title: str | None = None
