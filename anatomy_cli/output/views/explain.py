"""`explain`'s view: one row per feature (its explanation, delphi's detection and fuzzing balanced accuracy and F1,
and the same scorer on another feature's explanation, the control), the means of both; JSON adds the export's
records and the cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.analyses.explain_prompts import LOOP_TIMES
from anatomy_cli.models.resolve import short_name
from anatomy_cli.output import plots
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from pathlib import Path

    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks._explain_run import ExplainRun

ROWS = "features"
SCORES = ("detection_balanced_accuracy", "detection_f1", "fuzz_balanced_accuracy", "fuzz_f1")
COLUMNS = (Column("feature", "feature", "id"), Column("description", "explanation"),
           Column("detection_balanced_accuracy", "detection", "float", 2),
           Column("control_detection_balanced_accuracy", "detection control", "float", 2),
           Column("fuzz_balanced_accuracy", "fuzzing", "float", 2),
           Column("control_fuzz_balanced_accuracy", "fuzzing control", "float", 2),
           Column("detection_f1", "detection F1", "float", 2, priority=-1),
           Column("fuzz_f1", "fuzzing F1", "float", 2, priority=-1))
MEAN_COLUMNS = (Column("explanations", "explanations"), *(Column(k, k.replace("_", " "), "float", 3)
                                                          for k in SCORES))


def unanswered(got: dict[str, Any] | None) -> bool:
    """A score whose scorer answered nothing (no prompt's answer parsed: ``answered`` 0): delphi's 0 in the
    export, no score here (None in the rows, blank in the table, left out of the means)."""
    return got is not None and got.get("answered") == 0


def _flat(scores: dict[str, Any] | None, prefix: str = "") -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for kind in ("detection", "fuzz"):
        got = (scores or {}).get(kind)
        for metric in ("balanced_accuracy", "f1"):
            out[f"{prefix}{kind}_{metric}"] = None if got is None or unanswered(got) else float(got[metric])
    return out


def unanswered_count(records: Sequence[dict[str, Any]]) -> int:
    """How many scores (a feature's own or its control's, detection or fuzzing) :func:`unanswered` leaves out."""
    return sum(unanswered((part or {}).get(kind)) for r in records for part in (r.get("scores"), r.get("control"))
               for kind in ("detection", "fuzz"))


def rows(run: ExplainRun) -> list[dict[str, Any]]:
    """One flat row per feature: ``feature``, ``description``, the four scores, ``control_of`` and the control's
    four scores (``control_`` first)."""
    return flat(run.records)


def flat(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`rows` of the export's records (``explanations.json``'s, or a run's); a score nothing was answered
    for is None (:func:`unanswered`)."""
    out = []
    for r in records:
        control = r.get("control")
        out.append({"feature": int(r["index"]), "description": r.get("description"), **_flat(r.get("scores")),
                    "control_of": control.get("explanation_of") if control else None,
                    **_flat(control, "control_")})
    return out


def means(table: list[dict[str, Any]]) -> list[dict[str, object]]:
    """The mean of each score over the features that have one (an unanswered one is None: left out), for their own
    explanations and the controls."""
    out = []
    for label, prefix in (("own", ""), ("control (another feature's)", "control_")):
        row: dict[str, object] = {"explanations": label}
        for k in SCORES:
            vals = [r[prefix + k] for r in table if r[prefix + k] is not None]
            row[k] = sum(vals) / len(vals) if vals else None
        out.append(row)
    return out


def report(run: ExplainRun) -> Report:
    table = rows(run)
    summary = means(table)
    left_out = unanswered_count(run.records)
    data = {"model": run.model, "layer": run.layer, "hook": run.hook, "explainer": run.explainer,
            "scorer": run.scorer, ROWS: table, "means": summary, "unanswered": left_out,
            "explanations": list(run.records), "skipped": list(run.skipped), "resumed": run.resumed,
            "cost": run.cost, "file": run.file}
    heading = [f"explain · {run.model} · {run.layer} at {run.hook} · {len(table)} features explained by "
               f"{run.explainer}, scored by {run.scorer}"]
    notes = ["scores: delphi's balanced accuracy, (TP/P + TN/N) / 2 (0.5: chance); control: the same scorer "
             "on another feature's explanation"]
    if run.skipped:
        notes.append(f"{len(run.skipped)} features not explained (dead, or no context)")
    looped = sum(1 for r in run.records if r.get("loop"))
    if looped:
        notes.append(f"{counted(looped, 'explanation')} cut where {'they' if looped > 1 else 'it'} "
                     f"repeated a phrase {LOOP_TIMES}+ times (the explainer looped; the records' 'loop' says what)")
    if left_out:
        notes.append(f"{counted(left_out, 'score')} left blank and out of the means: the scorer's "
                     f"answers did not parse (nothing answered; the export keeps delphi's 0)")
    notes.append(f"wrote {run.file}")
    return Report(data=data, sections=[Section(COLUMNS, table, title="per feature"),
                                       Section(MEAN_COLUMNS, summary, title="means")],
                  heading=heading, notes=notes)


def dashboard(run: ExplainRun, features_dir: Path) -> FigureArgs:
    """``plots.draw("features", ...)``'s arguments: the features dashboard of ``features_dir`` (its tables read
    back, tasks/_features_files.py ``read_record``) with the run's explanations and scores in it."""
    from anatomy_cli.tasks._features_files import read_record

    data = read_record(features_dir)
    detail = (f"{data['dictionary']['path']} at {run.hook} · {len(data['features']):,} features over "
              f"{data['tokens']:,} tokens · explained by {run.explainer}, scored by {run.scorer}")
    return (data, plots.Caption("features", short_name(data["model"]), None, detail)), {"explanations": rows(run)}
