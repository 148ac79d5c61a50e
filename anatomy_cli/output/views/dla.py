"""`dla`'s view: one row per component with a signed bar, the sum checked against the model's own logit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import describe
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record
from anatomy_cli.text.records import token_record

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.dla import DlaResult

COLUMNS = (
    Column("component", "component"), Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("contribution", "contribution", "float", 4), Column("bar", "", "signed_bar"),
)
ROWS = "rows"
NOTE = ("contribution = unembedding direction · final_norm_frozen(component), the final norm's scale frozen at its "
        "value for the final residual{centred} (TransformerLens's apply_ln_to_stack); L3 = block 3 (blocks.3.*); "
        "bias = final norm's bias and LM head bias; the rows add up to the model's own {what}")


def what(lm: LoadedModel, ids: dict[str, int | None]) -> str:
    """``logit(·much)`` or ``logit(·much) − logit(·Paris)``, the tokens as the tables name them."""
    name_token = describe(lm)
    target, foil = ids["target"], ids.get("foil")
    assert target is not None
    return f"logit({name_token(target)[0]})" + (f" − logit({name_token(foil)[0]})" if foil is not None else "")


def figure(lm: LoadedModel, enc: Encoded, result: DlaResult) -> FigureArgs:
    pos = result.position
    cap = Caption.of("dla", lm, enc.text, f"position {pos} = {enc.pieces[pos]}")
    return (result.full, lm.n_layers, lm.n_heads, what(lm, result.ids), cap), {}


def report(lm: LoadedModel, enc: Encoded, result: DlaResult) -> Report:
    name_token = describe(lm)

    def token(i: int | None) -> dict[str, object] | None:
        return None if i is None else token_record(i, *name_token(i))

    pos, attribution = result.position, result.shown
    target, foil = token(result.ids["target"]), token(result.ids.get("foil"))
    assert target is not None
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos], "target": target,
            "foil": foil, "by": result.by.value, **attribution.to_dict()}
    said = (f"logit({target['token']}) − logit({foil['token']})" if foil else f"logit({target['token']})")
    heading = [f"dla · {model_label(lm)} · {lm.n_layers} layers",
               f"{prompt_line(enc)} · position {pos} = {enc.pieces[pos]} · {said}"]
    biggest = max((abs(r["contribution"]) for r in data["rows"]), default=0.0) or 1.0
    rows = [{**r, "bar": r["contribution"] / biggest} for r in data["rows"]]
    notes = [NOTE.format(centred=", each contribution centred (LayerNorm)" if attribution.centred else "",
                         what="logit difference" if foil else "logit"),
             f"sum of rows {attribution.total:.6f} · model's {said} {attribution.logit:.6f}"]
    if attribution.head_norm:
        notes.insert(1, f"per head: each head's output through {attribution.head_norm} (the norm after attention), "
                     "its scale frozen at its value on this prompt, so the heads add up to the attention output")
    if attribution.other_rows:
        notes.insert(1, f"other = the sum of the {attribution.other_rows} rows outside the --top {len(rows) - 1}")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="direct logit attribution")],
                  heading=heading, notes=notes)
