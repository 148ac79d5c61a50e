"""What the prompt driver reads of a command's view (the CLI's ``cli/driver.py``, the API's ``api/_run.py``):
``ROWS``, ``report(lm, enc, result[, shown])`` and, where the command draws, ``figure(lm, enc, result[, shown])``;
a view whose report or figure reads more than the result (the options, the task's plan, the format) takes a fourth
parameter, a :class:`Shown`. Optionally ``run_kwargs(shown) -> dict``: keywords for the task's ``run`` that this
output needs (lens's HTML page: more top tokens per cell for its hover text); ``REPORT_FIRST = True``: the CLI
prints the reports before it draws the pictures (heads, patch, drift, as they always have), not after. No torch,
no plotting library.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Generic
from typing import TypeVar

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.render import Format
    from anatomy_cli.output.render import Report
    from anatomy_cli.output.views.protocol import FigureArgs


OptsT = TypeVar("OptsT")
PlanT = TypeVar("PlanT")
T = TypeVar("T")


@dataclass(frozen=True)
class Shown(Generic[OptsT, PlanT]):
    """What a view may read besides one prompt's result: the command's options, the task's plan, the format the
    report is for (None: the API's JSON) and the picture's path (None: no picture)."""

    opts: OptsT
    plan: PlanT
    fmt: Format | None = None
    plot: Path | None = None


def _call(fn: Callable[..., T], lm: LoadedModel, enc: Encoded, result: object, shown: Shown[object, object]) -> T:
    if len(inspect.signature(fn).parameters) >= 4:
        return fn(lm, enc, result, shown)
    return fn(lm, enc, result)


def report(view: ModuleType, lm: LoadedModel, enc: Encoded, result: object, shown: Shown[object, object]) -> Report:
    """The view's report of one prompt's result."""
    made: Report = _call(view.report, lm, enc, result, shown)
    return made


def figure(view: ModuleType, lm: LoadedModel, enc: Encoded, result: object, shown: Shown[object, object]) -> FigureArgs:
    """The view's picture of one prompt's result (``plots.draw``'s arguments); ``((), {})`` for a view that
    draws none."""
    if not hasattr(view, "figure"):
        return (), {}
    made: FigureArgs = _call(view.figure, lm, enc, result, shown)
    return made


def run_kwargs(view: ModuleType, shown: Shown[object, object]) -> dict[str, object]:
    """The keywords the view asks of the task's ``run`` for this output (none by default)."""
    hook = getattr(view, "run_kwargs", None)
    return dict(hook(shown)) if hook is not None else {}


def report_first(view: ModuleType) -> bool:
    """True when the CLI prints the view's reports before drawing its pictures (``REPORT_FIRST``)."""
    return bool(getattr(view, "REPORT_FIRST", False))
