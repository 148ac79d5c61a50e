"""`trace`'s view: the residual-stream rows (``embed``, then blocks) and the top next tokens as tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import TOKEN_COLUMNS
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
    from anatomy_cli.tasks.trace import Traced

LAYER_COLUMNS = (
    Column("layer", "layer"),
    Column("cos_to_embedding", "cos emb", "float", 3),
    Column("cos_to_previous", "cos prev", "float", 3),
    Column("resid_norm", "‖h‖", "float", 2),
    Column("attn_norm", "‖attn‖", "float", 2),
    Column("mlp_norm", "‖mlp‖", "float", 2),
    Column("lens_token", "lens"),
    Column("lens_probability", "lens p", "prob", 4),
)
TARGET_COLUMNS = (  # --target: the target token in each row's lens distribution
    Column("target_rank", "target rank", "int"),
    Column("target_probability", "target p", "prob", 4),
)
TOP_COLUMNS = (
    Column("rank", "rank", "int"),
    *TOKEN_COLUMNS,
)
LAYERS_NOTE = ("rows: embed = {embedding}, N = block N's output{final} (docs/engine.md#layers); "
               "cos emb / cos prev = cosine of h to the embed row / to the row before; ‖attn‖, ‖mlp‖ = what that "
               "block's attention / MLP added; lens = top token of unembed(final_norm(h)), the norm recomputed "
               "from h itself")
ROWS = "layers"


def report(lm: LoadedModel, enc: Encoded, traced: Traced) -> Report:
    """``traced``: a :class:`anatomy_cli.tasks.trace.Traced` (position, Trace, target record)."""
    pos, result, target = traced
    predicts = None if not lm.has_unembed else ("next" if lm.is_causal else "masked")
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos],
            "n_layers": lm.n_layers, "predicts": predicts, "target": target, **result.to_dict()}
    heading = [f"trace · {model_label(lm)} · {lm.n_layers} layers",
               f"{prompt_line(enc)} · position {pos} = {enc.pieces[pos]}"]
    embedding = "embedding (token + position)" if lm.adapter.pos_embed else "token embedding (rotary positions)"
    notes = [LAYERS_NOTE.format(embedding=embedding, final=" before the final norm" if lm.adapter.final_norm else "")]
    if not lm.has_unembed:
        notes = [notes[0].split("; lens = ")[0]]
    if result.lens != "logit":
        unread = [r.layer for r in result.layers if r.lens_token_id is None]
        notes.append(f"lens columns read through the {result.lens} lens {result.lens_source} (docs/commands/"
                     f"lens.md#fitted-lenses)" + (f"; no reading for {', '.join(map(str, unread))}" if unread else ""))
    columns = LAYER_COLUMNS + (TARGET_COLUMNS if target else ())
    sections = [Section(columns, data["layers"], title="residual stream")]
    if predicts == "next":
        sections.append(Section(TOP_COLUMNS, data["top"], title=f"top {len(result.top)} next tokens"))
    elif predicts == "masked":
        sections.append(Section(TOP_COLUMNS, data["top"],
                                title=f"top {len(result.top)} tokens at position {pos} (masked-LM head)"))
        notes.append(f"{lm.name} is an encoder: the lens and the top tokens read its masked-LM head, the token "
                     f"it predicts AT position {pos}, not a next token")
    else:
        notes.append(f"logit lens unavailable: {lm.name} has no LM head (unembedding)")
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def figure(lm: LoadedModel, enc: Encoded, traced: Traced) -> FigureArgs:
    """``plots.draw("trace", ...)``'s arguments."""
    pos, result, _ = traced
    return (result, Caption.of("trace", lm, enc.text, f"position {pos} = {enc.pieces[pos]}")), {}
