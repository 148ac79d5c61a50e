"""What every API function returns: :class:`Result`, the command's own frozen result object with its JSON,
its rows as a table and its picture. pandas and matplotlib are imported only when asked for."""

from __future__ import annotations

import copy
import html
import numbers
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from anatomy_cli.errors import AnatomyError
from anatomy_cli.output import plots


@dataclass(frozen=True)
class Result:
    """One command's result for one prompt.

    ``command``: the command that computes it (``trace``, ``lens``, ...); ``result``: the frozen result object
    the command renders (``Trace``, ``LensGrid``, ...; its attributes are readable on this object too,
    ``r.layers``); ``rows_key``: the key of :meth:`to_dict` that holds one record per row or cell.
    """

    command: str
    result: Any = field(repr=False)
    data: dict[str, Any] = field(repr=False)
    rows_key: str
    figure_args: tuple[Any, ...] = field(default=(), repr=False)
    figure_kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("result", "data"):
            raise AttributeError(name)
        return getattr(self.result, name)

    def to_dict(self) -> dict[str, Any]:
        """The command's ``--format json`` object for this prompt (a fresh copy)."""
        return copy.deepcopy(self.data)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The records of :attr:`rows_key` (one per layer, cell, head, token ...)."""
        return list(self.data[self.rows_key])

    def to_pandas(self) -> Any:
        """The rows in long form, one row per record of :attr:`rows_key` (pandas.DataFrame; pandas needed)."""
        try:
            import pandas as pd  # type: ignore[import-untyped, unused-ignore]
        except ImportError:  # pragma: no cover - depends on the environment
            raise AnatomyError("to_pandas() needs pandas: pip install pandas") from None
        return _numeric(pd.DataFrame(self.rows))

    def plot(self, html: bool = False) -> Any:
        """The figure ``--plot FILE`` saves: a matplotlib Figure, or with ``html`` the plotly page object that
        ``--plot FILE.html`` writes (``.save(path)`` is not needed: ``fig.savefig(...)`` for matplotlib)."""
        if not self.figure_args:
            raise NotImplementedError(f"{self.command} draws no picture from the API yet")
        module = plots.module(self.command, Path("figure.html" if html else "figure.png"))
        return module.figure(*self.figure_args, **self.figure_kwargs)

    def _repr_html_(self) -> str:
        rows = self.rows[:12]
        cols = [k for k in (rows[0] if rows else {}) if not isinstance(rows[0][k], (dict, list))]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r[c]))}</td>" for c in cols) + "</tr>"
                       for r in rows)
        more = len(self.data[self.rows_key]) - len(rows)
        foot = f"<p>… {more} more rows (to_pandas() has them all)</p>" if more > 0 else ""
        title = html.escape(f"{self.command} · {self.data.get('model', '')}")
        return f"<p><b>{title}</b></p><table><tr>{head}</tr>{body}</table>{foot}"

    def __repr__(self) -> str:
        return f"Result({self.command!r}, model={self.data.get('model')!r}, {len(self.data[self.rows_key])} " \
               f"{self.rows_key})"


def _numeric(frame: Any) -> Any:
    """``frame`` with every column of numbers and gaps as float64 (a gap: NaN): pandas keeps an all-null column
    (a patch's ``value`` when clean = corrupt) or numbers mixed with None as ``object``."""
    for name in frame.columns:
        column = frame[name]
        if column.dtype != object:
            continue
        values = [v for v in column if v is not None and v == v]  # v != v: NaN
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            frame[name] = column.astype("float64")
    return frame


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
