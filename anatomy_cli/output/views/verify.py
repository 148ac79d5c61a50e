"""`verify`'s view: one table section per verify section, the JSON record, the pictures' arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks.session import model_label

if TYPE_CHECKING:
    from anatomy_cli.analyses.verify.checks import Check, Verification
    from anatomy_cli.analyses.verify.suite import Plan
    from anatomy_cli.engine import Encoded, LoadedModel

COLUMNS = (
    Column("check", "check"),
    Column("measured", "measured", "number"),
    Column("limit", "limit", "number"),
    Column("result", "result"),
    Column("max_abs", "max |Δ|", "number"),
    Column("cosine", "cosine", "float", 7),
    Column("note", "note"),
)
ROWS = "sections"


def _row(c: Check) -> dict[str, Any]:
    score = c.score is not None
    return {"check": c.label, "measured": c.score if score else c.error,
            "limit": (f"≥ {c.threshold:g}" if score else (None if c.tolerance is None else f"≤ {c.tolerance:g}")),
            "result": {True: "pass", False: "FAIL", None: "skip"}[c.passed], "max_abs": c.max_abs,
            "cosine": c.cosine, "note": c.note}


def report(lm: LoadedModel, result: Verification, encoded: list[Encoded], plan: Plan) -> Report:
    """The report the command prints: one table section per verify section; ``data`` is its JSON."""
    data = {**records.model_record(lm), "device": str(lm.device), "against": plan.against, "quick": plan.quick,
            "prompts": [e.text for e in encoded], **result.to_dict()}
    sections = [Section(COLUMNS, [_row(c) for c in s.checks], title=f"{i}. {s.title}" + (f" · {s.note}" if s.note
                                                                                           else ""))
                for i, s in enumerate(result.sections, start=1)]
    counts = result.counts()
    heading = [f"verify · {model_label(lm)} · {records.dtype_name(lm)} on {lm.device}",
               f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
               f"on {len(encoded)} prompt{'s' if len(encoded) != 1 else ''}"]
    notes = ["untrained weights (--init random): known answers are skipped"] if lm.untrained else []
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def caption(lm: LoadedModel, result: Verification, encoded: list[Encoded]) -> Any:
    """The pictures' caption: the model, dtype and device, and the counts."""
    from anatomy_cli.output import plots

    counts = result.counts()
    return plots.Caption.of("verify", lm, None, f"{records.dtype_name(lm)} on {lm.device} · {counts['passed']} "
                            f"passed, {counts['failed']} failed, {counts['skipped']} skipped on {len(encoded)} "
                            f"prompt{'s' if len(encoded) != 1 else ''}")


def figure(lm: LoadedModel, result: Verification, encoded: list[Encoded]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``plots.draw("verify", ...)``'s arguments (PNG or HTML)."""
    return (result, caption(lm, result, encoded)), {}
