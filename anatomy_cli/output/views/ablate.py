"""`ablate`'s view: one row per knocked-out component, its metric and effect; the check table with --check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.views._attribution import extend
from anatomy_cli.tasks.session import describe
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record
from anatomy_cli.text import records as text_records

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.ablate import AblateResult

COLUMNS = (Column("layer", "layer", "int"), Column("component", "component"), Column("head", "head", "int"),
           Column("metric", "metric", "float", 4), Column("effect", "effect", "float", 4))
EXPERT_COLUMNS = (*COLUMNS[:2], Column("expert", "expert", "int"), *COLUMNS[3:])
BY = {"zero": "zeros", "mean": "its mean over the prompt's positions"}
EXPERT_BY = {"reroute": "its router logit set to -inf before the top k (the next-best expert takes its place, the "
                        "family's normalisation as usual)",
             "zero": "its weight set to 0 where chosen (the other experts' weights unchanged)"}
ROWS = "rows"


def token_record(lm: LoadedModel, token_id: int | None) -> dict[str, object] | None:
    """``{"token_id": 881, "token": "·much", "text": " much"}`` (None for None): the one token record."""
    return None if token_id is None else text_records.token_record(token_id, *describe(lm)(token_id))


def metric_name(lm: LoadedModel, ids: Mapping[str, int | None]) -> str:
    """``log p(·much)`` or ``logit(·much) - logit(·so)``, as in the heading."""
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    assert target is not None
    return f"logit({target['token']}) - logit({foil['token']})" if foil else f"log p({target['token']})"


def figure(lm: LoadedModel, enc: Encoded, result: AblateResult) -> FigureArgs:
    pos, how = result.position, "attribution estimate of the " if result.extra else ""
    cap = Caption.of("ablate", lm, enc.text, f"{how}{result.ablation.mode} ablation · position {pos} = "
                     f"{enc.pieces[pos]}")
    moe = lm.info.moe
    width = moe.n_experts if moe is not None and any(r.component == "expert" for r in result.ablation.rows) \
        else lm.n_heads
    return (result.ablation, width, metric_name(lm, result.ids), cap), {}


def report(lm: LoadedModel, enc: Encoded, result: AblateResult) -> Report:
    pos, ablation, ids = result.position, result.ablation, result.ids
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos], "target": target,
            "foil": foil, **ablation.to_dict()}
    heading = [f"ablate · {model_label(lm)} · {ablation.mode} ablation",
               f"{prompt_line(enc)} · metric at position {pos} = {enc.pieces[pos]}",
               f"metric {metric_name(lm, ids)}; intact run: {ablation.clean_metric:.4f}"]
    experts = any(r.component == "expert" for r in ablation.rows)
    if experts:
        what = f"each row knocks one routed expert of a block out at every position: {EXPERT_BY[ablation.mode]}"
    else:
        what = f"each row replaces one component's output at every position by {BY[ablation.mode]}"
    notes = [f"{what}; effect = metric - intact metric (negative: the component helped the target)"]
    if experts and lm.info.moe is not None and lm.info.moe.shared_expert:
        notes.append("the shared expert is always on and has no index among the routed experts: it is not knocked "
                     "out (the mlp row of a plain ablate zeroes it with the block)")
    columns = EXPERT_COLUMNS if experts else COLUMNS
    base = Report(data=data, sections=[Section(columns, data["rows"])], heading=heading, notes=notes)
    return extend(base, result.extra)
