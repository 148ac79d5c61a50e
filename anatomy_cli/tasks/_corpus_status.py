"""`corpus`'s progress on stderr: the status line per batch of windows, and once the expected cost.

The corpus runner (a layer below) reports :class:`anatomy_cli.corpus.runner.Progress`; :class:`CorpusStatus` is
the callback `corpus` hands it: it updates the one status line (drawn on a terminal only) and, at the first
report with measured windows, says the expected cost as a plain line (:func:`anatomy_cli.tasks.notes.info`;
the CLI's stderr sink shows it). Nothing is printed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.models.cost import WARN_SECONDS as LONG_RUN_S  # one threshold for every cost line
from anatomy_cli.tasks.notes import info
from anatomy_cli.units import human_seconds
from anatomy_cli.units import minutes

if TYPE_CHECKING:
    from pathlib import Path

    from anatomy_cli.corpus.runner import Progress
    from anatomy_cli.tasks.notes import Progress as StatusLine


class CorpusStatus:
    """The progress callback: the status line (:func:`_progress`) per report, and once, at the first report with
    measured windows, the expected cost (:func:`_cost`) as a line on stderr that stays."""

    def __init__(self, line: StatusLine, budget: int | None, what: str = "corpus"):
        self.line, self.budget, self.costed, self.what = line, budget, False, what
        self.last: Progress | None = None

    def __call__(self, p: Progress) -> None:
        self.last = p
        self.line.update(_progress(p, self.budget).replace("corpus:", f"{self.what}:", 1))
        if not self.costed and p.done > 0:
            self.costed = True
            cost = _cost(p, self.budget)
            if cost:
                info(cost.replace("corpus:", f"{self.what}:", 1))

    def interrupted(self, out: Path | None) -> str:
        """What an interrupted run (Ctrl-C) says on its way out: what is kept, and how to go on."""
        if out is None:
            return f"{self.what}: interrupted; nothing is kept without --out DIR"
        p = self.last
        kept = f"{p.shards + p.resumed:,} finished shard{'s' if p.shards + p.resumed != 1 else ''}" if p else \
            "the finished shards"
        return f"{self.what}: interrupted; {kept} kept in {out}: run the same command again to resume"


def _cost(p: Progress, budget: int | None) -> str | None:
    """The expected cost from the first measured windows' timing (their tokens/s, model loading excluded):
    the time for the tokens left of ``--max-tokens`` when that is at least :data:`LONG_RUN_S`, else None;
    without ``--max-tokens`` (the corpus' length is not known before it is read) the time per 1,000 tokens."""
    rate = p.done / p.elapsed if p.elapsed > 0 else 0.0
    if rate <= 0:
        return None
    first = "the first window's" if p.windows == 1 else f"the first {p.windows:,} windows'"
    basis = f"from {first} timing: {rate:,.1f} tokens/s"
    if budget is None:
        return (f"corpus: expected cost: {human_seconds(1000 / rate)} per 1,000 tokens ({basis}); the corpus' length "
                "is not known until it is read (--max-tokens bounds it)")
    left = max(0, budget - p.tokens)
    if left / rate < LONG_RUN_S:
        return None
    return f"corpus: expected cost: about {human_seconds(left / rate)} for the {left:,} tokens left ({basis})"


def _progress(p: Progress, budget: int | None) -> str:
    """The status line (a :class:`anatomy_cli.corpus.runner.Progress`, per batch of windows): tokens,
    windows measured of those planned so far, tokens/s, the time split (forward, lens, heads), ETA."""
    if p.done == 0:
        return f"corpus: {p.planned:,} windows planned · {p.tokens:,} tokens · measuring the first window"
    rate = p.done / p.elapsed if p.elapsed > 0 else 0.0
    total = sum(p.seconds.values()) or 1.0
    split = " ".join(f"{k} {100 * v / total:.0f}%" for k, v in p.seconds.items() if v)
    line = f"corpus: {p.tokens:,} tokens · {p.windows:,} windows ({p.planned:,} planned) · {rate:,.0f} tokens/s"
    line += f" · {split}" if split else ""
    if budget and rate > 0:
        line += f" · ETA {minutes(max(0, budget - p.tokens) / rate)}"
    return line
