"""`circuit`'s view: the strongest paths to the target logit as a table, the graph's summary as JSON."""

from __future__ import annotations

from typing import Any

from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

COLUMNS = (
    Column("node", "node"),
    Column("kind", "kind"),
    Column("layer", "layer"),
    Column("position", "pos", "int"),
    Column("token", "token"),
    Column("weight", "weight", "float", 4),
    Column("influence", "cum. influence", "float", 3),
    Column("via", "strongest source"),
    Column("via_weight", "its weight", "float", 4),
)
ROWS = "paths"
KINDS = {"cross layer transcoder": "feature", "mlp reconstruction error": "error", "embedding": "token",
         "logit": "logit"}


def report(lm: Any, enc: Any, result: Any) -> Report:
    data = {**prompt_record(lm, enc), **result.to_dict()}
    rows = [{**r, "kind": KINDS.get(r["kind"], r["kind"])} for r in data["paths"]]
    first = data["targets"][0]
    heading = [f"circuit · {model_label(lm)} · {data['n_selected_features']} of {data['n_active_features']} "
               f"active features · {data['n_kept_nodes']} nodes, {data['n_kept_edges']} edges kept",
               prompt_line(enc)]
    notes = [f"target {first['token']!r} (p={first['prob']:.3f}) of {len(data['targets'])} logit nodes; "
             f"replacement score {data['replacement_score']:.3f}, completeness {data['completeness_score']:.3f}",
             "weight: the direct effect on the target logit (demeaned) in the frozen replacement model"]
    if "check" in data:
        c = data["check"]
        notes.append(f"--check: {c['n_edges']} edges re-measured by intervention, largest difference "
                     f"{c['max_abs_error']:.2e} (relative {c['max_relative_error']:.2e})")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="strongest paths to the target")],
                  heading=heading, notes=notes)


def figure(lm: Any, enc: Any, result: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``plots.draw("circuit", ...)``'s arguments: the graph JSON (``--json``'s dict) and the caption
    (anatomy_cli/output/html/circuit.py draws it; .html only)."""
    from anatomy_cli.output.plots import Caption

    return (result.json, Caption.of("circuit", lm, enc.text)), {}
