"""`route`'s view: one row per (MoE block, position) as a table, the record as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.route import RouteResult

COLUMNS = (
    Column("block", "block", "int"),
    Column("position", "pos", "int"),
    Column("token", "token"),
    Column("experts", "experts"),
    Column("weights", "weights"),
    Column("entropy", "entropy", "float", 3),
    Column("margin", "margin", "prob", 4),
    Column("near_tie", "near tie"),
)
ROWS = "rows"
NOTE = ("experts: the chosen experts, heaviest first, with the weights the block applies ({rule}); entropy: nats "
        "over the softmax of every router logit; margin: router probability of the k-th minus the (k+1)-th "
        "expert, near tie below {tie}")
RULES = {"renormalize": "softmax, top {k}, renormalised over the top {k}",
         "norm_topk_prob": "softmax, top {k}, {norm}"}


def report(lm: LoadedModel, enc: Encoded, result: RouteResult) -> Report:
    data = {**prompt_record(lm, enc), **result.to_dict()}
    rows = [{**r, "weights": " ".join(f"{w:.3f}" for w in r["weights"]),
             "near_tie": "yes" if r["near_tie"] else ""} for r in data["rows"]]
    norm = "renormalised (norm_topk_prob)" if result.norm_topk_prob else "not renormalised (norm_topk_prob false)"
    rule = RULES[result.rule].format(k=result.top_k, norm=norm) + (
        "; plus the sigmoid-gated shared expert" if result.shared_expert else "")
    heading = [f"route · {model_label(lm)} · {result.n_experts} experts, top {result.top_k}", prompt_line(enc)]
    ties = sum(r["near_tie"] for r in data["rows"])
    notes = [NOTE.format(rule=rule, tie=result.near_tie_threshold)]
    if ties:
        notes.append(f"{ties} of {len(data['rows'])} choices are near ties (margin < {result.near_tie_threshold})")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="routing")], heading=heading, notes=notes)


def figure(lm: LoadedModel, enc: Encoded, result: RouteResult) -> FigureArgs:
    """``plots.draw("route", ...)``'s arguments for ``result``."""
    return (result, list(enc.pieces), Caption.of("route", lm, enc.text)), {}
