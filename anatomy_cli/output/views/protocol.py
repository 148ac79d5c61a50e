"""What a view module is to its callers (the API's :func:`~anatomy_cli.api._run.run_prompts`, the commands):
``ROWS``, the key of its JSON's main rows, and ``report(lm, enc, result)``, the report of one prompt's result.
Types only: nothing here runs. A module is a :class:`View` as it stands (mypy checks a module against a protocol).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol
from typing import TypeVar

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.render import Report

ResultT = TypeVar("ResultT", contravariant=True)

# A picture's arguments: plots.draw(command, path, index, *args, **kwargs) passes them on to the picture module's
# figure(...), whose parameters differ by command.
FigureArgs = tuple[tuple[Any, ...], dict[str, Any]]


class View(Protocol[ResultT]):
    """A view of one prompt's ``ResultT``: its rows' key and its report (what every format prints)."""

    ROWS: str

    def report(self, lm: LoadedModel, enc: Encoded, result: ResultT, /) -> Report: ...


class DrawnView(View[ResultT], Protocol[ResultT]):
    """A view that also gives a prompt's picture: ``figure(lm, enc, result)``, :func:`plots.draw`'s arguments."""

    def figure(self, lm: LoadedModel, enc: Encoded, result: ResultT, /) -> FigureArgs: ...
