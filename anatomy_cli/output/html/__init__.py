"""Interactive pictures: ``--plot FILE.html`` and ``anatomy report``, drawn with plotly.

One self-contained page per file: plotly.js is written into the page (no CDN), so the file opens
from disk with no network. Each picture module (``anatomy_cli.output.html.lens``, ``.attn``, ...) has
one ``figure(...)`` function taking the same arguments as its PNG twin in
:mod:`anatomy_cli.output.plots` and returning a :class:`Page`; ``anatomy report`` concatenates the
``parts`` of several pages into one. :func:`anatomy_cli.output.plots.draw` picks the module by
command name and the file's suffix, so a new command gets an HTML picture by adding one module here
with a ``figure`` of its PNG module's signature (docs/plots.md, "Adding a command").

Escaping, the one rule: text from the user or the model (prompts, tokens, model names) goes into
the page only through :func:`esc` (for HTML and for plotly strings, which plotly renders as a small
subset of HTML) or as JSON data that scripts write with ``textContent``; :func:`script_json`
writes JSON that cannot close its ``<script>``. No HTML is built from user text any other way.

Importing this package imports no plotly; the picture modules do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.output.html.markup import UNTRAINED  # noqa: F401  (the package's names)
from anatomy_cli.output.html.markup import Part
from anatomy_cli.output.html.markup import esc
from anatomy_cli.output.html.markup import script_json  # noqa: F401  (the package's names)
from anatomy_cli.output.html.markup import token  # noqa: F401  (the package's names)
from anatomy_cli.text.display import shorten

if TYPE_CHECKING:
    from anatomy_cli.output.plots.caption import Caption

PROMPT_CHARS = 120  # a page's caption shows the prompt cut in the middle to this many characters


@dataclass
class Page:
    """One HTML page: a title, caption lines, parts. ``render()`` gives the whole file as text."""

    title: str
    lines: Sequence[str] = ()
    parts: list[Part] = field(default_factory=list)
    untrained: bool = False

    def add(self, part: Part) -> Page:
        self.parts.append(part)
        return self

    def render(self) -> str:
        from anatomy_cli.output.html._page import render

        return render(self)

    def write(self, path: Path) -> None:
        """Write the page as UTF-8. Raises OSError."""
        Path(path).write_text(self.render(), encoding="utf-8")


def caption_page(cap: Caption, notes: Sequence[str] = ()) -> Page:
    """A page for a :class:`anatomy_cli.output.plots.Caption`: the command, model, prompt and detail as
    the PNG's title says them; ``notes`` as a footer paragraph (added by the caller with :func:`notes`)."""
    lines = []
    if cap.prompt is not None:  # one line, as the PNG's title has it; the JSON has the whole prompt
        lines.append(f"prompt: {shorten(cap.prompt, PROMPT_CHARS)}")
    if cap.detail:
        lines.append(cap.detail)
    return Page(title=f"{cap.command} · {cap.model}", lines=lines, untrained=cap.untrained)


def notes(lines: Sequence[str]) -> Part:
    """A footer of notes in grey, one per line (escaped)."""
    return Part("".join(f'<p class="note">{esc(line)}</p>' for line in lines))


def text(title: str | None, paragraph: str | None = None) -> Part:
    """A section heading and one paragraph of explanation (both escaped)."""
    out = f"<h2>{esc(title)}</h2>" if title else ""
    if paragraph:
        out += f'<p class="explain">{esc(paragraph)}</p>'
    return Part(out)


def table(columns: Sequence[str], rows: Sequence[Sequence[object]], *, numeric: Sequence[bool] = ()) -> Part:
    """A plain HTML table; every header and cell escaped. ``numeric[i]``: right-align column i."""
    right = list(numeric) + [False] * (len(columns) - len(numeric))
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f'<td class="{"num" if right[i] else ""}">{esc(v)}</td>'
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return Part(f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
