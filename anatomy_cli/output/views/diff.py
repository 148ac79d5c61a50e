"""`diff`'s view: the tables, notes and JSON of both modes, and the pictures' arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.models.resolve import short_name
from anatomy_cli.output import plots
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import prompt_line

if TYPE_CHECKING:
    from anatomy_cli.analyses.diff.activations import ActivationDiff
    from anatomy_cli.analyses.diff.weights import WeightsDiff
    from anatomy_cli.engine import Encoded
    from anatomy_cli.output.views.protocol import FigureArgs

WEIGHT_COLUMNS = (
    Column("layer", "layer", "int"),
    Column("component", "component"),
    Column("n_tensors", "tensors", "int"),
    Column("n_params", "params", "int"),
    Column("rel_change", "rel Δ", "number", 4),
    Column("cosine", "cosine", "float", 6),
    Column("max_abs_delta", "max |Δ|", "number", 4),
    Column("b_types", "B stored as"),
)
LAYER_COLUMNS = (
    Column("layer", "layer", "int"),
    Column("cos", "cos", "float", 5),
    Column("cos_mean", "cos mean", "float", 5),
    Column("rel_delta", "rel Δ", "number", 4),
    Column("lens_kl_nats", "lens KL nats", "number", 4),
    Column("lens_agree", "agree"),
    Column("lens_a", "lens A"),
    Column("lens_b", "lens B"),
)
TOP_COLUMNS = (
    Column("rank", "rank", "int"),
    Column("token_a", "A token"),
    Column("probability_a", "A p", "prob", 4),
    Column("token_b", "B token"),
    Column("probability_b", "B p", "prob", 4),
)
TARGET_COLUMNS = (
    Column("model", "model"),
    Column("token", "token"),
    Column("token_id", "id", "id"),
    Column("rank", "rank", "int"),
    Column("probability", "probability", "prob", 4),
)
WEIGHTS_NOTE = ("rel Δ = ‖W_B − W_A‖ / ‖W_A‖ and cosine over the group's tensors as one vector; max |Δ| over "
                "every element; layer empty = outside the blocks")
LAYERS_NOTE = ("layer embed = the embedding, N = block N's output (the last: the model's output); "
               "cos / rel Δ = h_A vs h_B at the position (rel Δ = ‖h_A − h_B‖ / ‖h_A‖), cos mean over all positions; "
               "lens KL = KL(lens_A ‖ lens_B) "
               "at the position, lens = unembed(final_norm(h)) with each model's own norm and head")


def weights_report(result: WeightsDiff) -> Report:
    data = {"mode": "weights", **result.to_dict()}
    rows = [{**r, "b_types": "+".join(r["b_types"])} for r in data["rows"]]
    total = {**data["total"], "component": "total", "b_types": "+".join(data["total"]["b_types"])}
    heading = [f"diff · weights · A {result.a} → B {result.b}",
               f"{len(result.tensors)} tensor pairs · {result.total.n_params:,} parameters · "
               f"rel Δ {result.total.rel_change:.4g} · cosine {_fmt(result.total.cosine)}"]
    notes = [WEIGHTS_NOTE]
    if result.tied_head:
        notes.append("the LM head is tied to the token embedding in both: compared once, as token_embedding")
    return Report(data=data, sections=[Section(WEIGHT_COLUMNS, rows + [total], title="weights")],
                  heading=heading, notes=notes)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6f}"


def activations_report(label_a: str, label_b: str, enc: Encoded, result: ActivationDiff) -> Report:
    data = {"mode": "activations", "a": label_a, "b": label_b, "prompt": enc.text, "token_ids": list(enc.ids),
            "tokens": list(enc.pieces), "truncated_tokens": enc.dropped, **result.to_dict()}
    pos = result.position
    heading = [f"diff · A {label_a} → B {label_b}", f"{prompt_line(enc)} · position {pos} = {enc.pieces[pos]}",
               f"next token: KL(A ‖ B) {result.kl_nats:.4g} nats · A's top token {result.top_a[0].token} is "
               f"rank {result.a_top1_rank_in_b} in B"]
    tops = [{"rank": ta.rank, "token_a": ta.token, "probability_a": ta.probability, "token_b": tb.token,
             "probability_b": tb.probability} for ta, tb in zip(result.top_a, result.top_b)]
    sections = [Section(LAYER_COLUMNS, data["layers"], title="residual stream"),
                Section(TOP_COLUMNS, tops, title=f"top {len(tops)} next tokens")]
    if result.target_a is not None and result.target_b is not None:  # a target: both
        rows = [{"model": "A", **result.target_a.to_dict()}, {"model": "B", **result.target_b.to_dict()}]
        sections.append(Section(TARGET_COLUMNS, rows, title="target"))
    notes = [LAYERS_NOTE]
    if result.shared_rows is not None:
        notes.append(f"the LM heads differ in size: compared over the {result.shared_rows:,} rows both have (KL of "
                     f"the distributions conditioned on them); the other rows hold {result.extra_mass_a:.3g} of A's "
                     f"and {result.extra_mass_b:.3g} of B's next-token probability (extra_mass_a/_b)")
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def pair(a: str, b: str) -> str:
    """``A vs B`` for a picture's title: each model's one short name (models.resolve.short_name)."""
    return f"{short_name(a)} vs {short_name(b)}"


def weights_figure(result: WeightsDiff, a: str, b: str) -> FigureArgs:
    """:func:`anatomy_cli.output.plots.diff.weights_figure`'s arguments."""
    return (result, plots.Caption("diff", pair(a, b), detail="weights")), {}


def activations_figure(a: str, b: str, enc: Encoded, result: ActivationDiff) -> FigureArgs:
    """:func:`anatomy_cli.output.plots.diff.activations_figure`'s arguments."""
    cap = plots.Caption("diff", pair(a, b), enc.text, f"position {result.position} = {enc.pieces[result.position]}")
    return (result, cap), {}
