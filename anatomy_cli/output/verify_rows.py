"""The points both `verify --plot` pictures draw (PNG and HTML), from a
:class:`anatomy_cli.analyses.verify.checks.Verification`: per section, each row's measured number against its
limit on a log axis, coloured pass / fail / skip. No matplotlib, no plotly."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anatomy_cli.analyses.verify.checks import SectionResult
    from anatomy_cli.analyses.verify.checks import Verification

COLOURS = {"pass": "#2ca02c", "FAIL": "#d62728", "skip": "#9e9e9e"}
LIMIT_COLOUR = "#222222"


@dataclass(frozen=True)
class Point:
    """One row: ``label`` (``resid_post L3``); ``value``: the measured error (or a known answer's score), None
    when skipped or not finite; ``limit``: the tolerance (``≤``) or the threshold (``≥``, ``at_least``);
    ``result``: ``pass``, ``FAIL`` or ``skip``."""

    label: str
    value: float | None
    limit: float | None
    at_least: bool
    result: str
    note: str


def points(section: SectionResult) -> list[Point]:
    """The rows of one section, in order."""
    out = []
    for c in section.checks:
        score = c.score is not None
        value = c.score if score else c.error
        finite = value is not None and math.isfinite(value)
        out.append(Point(c.label, value if finite else None, c.threshold if score else c.tolerance, score,
                         {True: "pass", False: "FAIL", None: "skip"}[c.passed], c.note))
    return out


def floor(result: Verification) -> float:
    """Where a 0 is drawn on the log axis: a decade below the smallest positive number on the page."""
    values = [v for s in result.sections for p in points(s) for v in (p.value, p.limit)
              if v is not None and v > 0]
    return 10.0 ** (math.floor(math.log10(min(values))) - 1) if values else 1e-12


def drawn(value: float | None, low: float) -> float | None:
    """``value`` as drawn on the log axis: 0 (and anything below ``low``) at ``low``."""
    return None if value is None else max(value, low)
