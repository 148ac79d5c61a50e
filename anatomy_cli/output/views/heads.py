"""`heads`'s view: one row per (layer, head) with five scores."""

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
    from anatomy_cli.tasks.heads import Scored

COLUMNS = (
    Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("entropy", "entropy", "float", 3), Column("first_token", "first tok", "float", 3),
    Column("prev_token", "prev tok", "float", 3), Column("induction", "induction", "float", 3),
    Column("duplicate_token", "duplicate", "float", 3),
)
ROWS = "heads"
REPORT_FIRST = True  # the table, then --plot's picture
NOTE = ("entropy: nats, mean over queries 1..n-1; first tok / prev tok: mean weight on position 0 / on q-1 over "
        "queries 1..n-1; induction / duplicate: on the random tokens repeated, mean weight from each token of the "
        "second copy to the token after its earlier occurrence / to that occurrence (Olsson et al. 2022; "
        "TransformerLens head detector)")


def report(lm: LoadedModel, enc: Encoded, scored: Scored) -> Report:
    """The rows of ``scored.shown`` (the first ``--top``)."""
    result = scored.shown
    data = {**prompt_record(lm, enc), "n_layers": lm.n_layers, "n_heads": lm.n_heads, **result.to_dict()}
    if result.measured_on == "random":  # token_ids / tokens are then the random sequence's
        data["prompt"] = None
    on = prompt_line(enc) if result.measured_on == "prompt" else "the random sequence"
    # The random sequence is on the first line: stdin tsv keeps only that one for all prompts.
    heading = [f"heads · {model_label(lm)} · {lm.n_layers} layers × {lm.n_heads} heads · induction, duplicate on "
               f"{result.seq_len} random tokens × 2, seed {result.seed}",
               f"entropy, first tok, prev tok on {on}"]
    count = f"top {len(result.rows)} of {result.n_heads_total} heads" if len(result.rows) < result.n_heads_total \
        else f"{result.n_heads_total} heads"
    title = count + (f" by {result.sort}" if result.sort else "")
    notes = [NOTE]
    if not lm.is_causal:
        notes.append(f"{lm.name} is bidirectional: prev_token and induction are the weight on those keys among all "
                     f"positions, before and after the query")
    return Report(data=data, sections=[Section(COLUMNS, data["heads"], title=title)], heading=heading, notes=notes)


def figure(lm: LoadedModel, enc: Encoded, scored: Scored) -> FigureArgs:
    """``plots.draw("heads", ...)``'s arguments: every head coloured, the first ``--top`` framed."""
    result, top, prompted = scored.heads, scored.top, scored.heads.measured_on == "prompt"
    detail = f"induction, duplicate on {result.seq_len} random tokens × 2, seed {result.seed}"
    cap = Caption.of("heads", lm, enc.text if prompted else None, detail)
    return (result, lm.n_layers, lm.n_heads, cap), {"top": top}
