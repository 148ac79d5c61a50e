"""`verify`'s view: one line per verify section (the summary, the default on a terminal), or one table section
per verify section with every row (``--detail``; tsv and csv always), the JSON record, the pictures' arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output import plots
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks.session import model_label
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.verify.checks import Check
    from anatomy_cli.analyses.verify.checks import SectionResult
    from anatomy_cli.analyses.verify.checks import Verification
    from anatomy_cli.analyses.verify.suite import Plan
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.plots.caption import Caption
    from anatomy_cli.output.views.protocol import FigureArgs

COLUMNS = (
    Column("check", "check"),
    Column("measured", "measured", "number"),
    Column("limit", "limit", "number"),
    Column("result", "result"),
    Column("max_abs", "max |Δ|", "number"),
    Column("cosine", "cosine", "float", 7),
    Column("note", "note"),
)
# The summary: one row per section, with the row nearest its limit (or furthest past it).
SUMMARY_COLUMNS = (
    Column("section", "section"),
    Column("status", "status"),
    Column("passed", "passed", "int"),
    Column("failed", "failed", "int"),
    Column("skipped", "skipped", "int"),
    Column("worst", "worst check"),
    Column("measured", "measured", "number"),
    Column("limit", "limit", "number"),
    Column("note", "note"),
)
ROWS = "sections"
# Each section's number, as docs/commands/verify.md numbers them (whichever ran).
NUMBERS = {"parity": 1, "identities": 2, "precision": 3, "devices": 4, "known": 5, "llama.cpp": 6}


def _limit(c: Check) -> str | None:
    if c.score is not None:
        return f"≥ {c.threshold:g}"
    return None if c.tolerance is None else f"≤ {c.tolerance:g}"


def _row(c: Check) -> dict[str, object]:
    score = c.score is not None
    return {"check": c.label, "measured": c.score if score else c.error, "limit": _limit(c),
            "result": {True: "pass", False: "FAIL", None: "skip"}[c.passed], "max_abs": c.max_abs,
            "cosine": c.cosine, "note": c.note}


def _number(i: int, name: str) -> int:
    return NUMBERS.get(name, i)


def _summary_row(i: int, s: SectionResult) -> dict[str, object]:
    worst, counts = s.worst, s.counts()
    why = s.summary()["note"]
    return {"section": f"{_number(i, s.name)}. {s.name}", "status": s.status, **counts,
            "worst": None if worst is None else worst.label,
            "measured": None if worst is None else (worst.score if worst.score is not None else worst.error),
            "limit": None if worst is None else _limit(worst), "note": why}


def report(lm: LoadedModel, result: Verification, encoded: list[Encoded], plan: Plan, *,
           summary: bool = False) -> Report:
    """The report the command prints: one table section per verify section with every row, or with
    ``summary`` one table of one line per section; ``data`` is its JSON (the rows and the summary, either way)."""
    data = {**records.model_record(lm), "device": str(lm.device), "against": plan.against, "quick": plan.quick,
            "prompts": [e.text for e in encoded], **result.to_dict()}
    if summary:
        sections = [Section(SUMMARY_COLUMNS, [_summary_row(i, s) for i, s in enumerate(result.sections, start=1)])]
    else:
        sections = [Section(COLUMNS, [_row(c) for c in s.checks],
                            title=f"{_number(i, s.name)}. {s.title}" + (f" · {s.note}" if s.note else ""))
                    for i, s in enumerate(result.sections, start=1)]
    counts = result.counts()
    heading = [f"verify · {model_label(lm)} · {records.dtype_name(lm)} on {lm.device}",
               f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
               f"on {counted(len(encoded), 'prompt')}"]
    notes = ["untrained weights (--init random): known answers are skipped"] if lm.untrained else []
    if summary:
        notes.append("one line per section: its row nearest its limit; --detail for every row")
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def caption(lm: LoadedModel, result: Verification, encoded: list[Encoded]) -> Caption:
    """The pictures' caption: the model, dtype and device, and the counts."""
    counts = result.counts()
    return plots.Caption.of("verify", lm, None, f"{records.dtype_name(lm)} on {lm.device} · {counts['passed']} "
                            f"passed, {counts['failed']} failed, {counts['skipped']} skipped on {len(encoded)} "
                            f"prompt{'s' if len(encoded) != 1 else ''}")


def figure(lm: LoadedModel, result: Verification, encoded: list[Encoded]) -> FigureArgs:
    """``plots.draw("verify", ...)``'s arguments (PNG or HTML)."""
    return (result, caption(lm, result, encoded)), {}
