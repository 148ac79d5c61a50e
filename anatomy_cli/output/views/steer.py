"""`steer`'s view: one direction per block (its norm, how many pairs it separates) and the files saved."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.records import model_record
from anatomy_cli.tasks.session import model_label

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.steer import Steering
    from anatomy_cli.tasks.steer import SteerOptions

COLUMNS = (Column("layer", "layer", "int"), Column("norm", "norm", "float", 3),
           Column("separation", "pairs separated", "pct", 1))
ROWS = "layers"


def report(lm: LoadedModel, result: Steering, opts: SteerOptions) -> Report:
    """The report of a :class:`~anatomy_cli.tasks.steer.Steering` made with ``opts``."""
    pos, neg = opts.sides
    out, gguf_out = opts.out, opts.save_control_vector
    data = {**model_record(lm), "site": opts.site, "reduce": opts.reduce, "method": opts.method,
            "n_positive": len(pos), "n_negative": len(neg), "layers": [d.to_dict() for d in result.directions],
            "out": None if out is None else str(out), "control_vector": None if gguf_out is None else str(gguf_out)}
    heading = [f"steer · {model_label(lm)}", f"{len(pos)} positive · {len(neg)} negative · {opts.site} · "
               f"{opts.reduce} position{'s' if opts.reduce == 'mean' else ''} · {opts.method}"]
    return Report(data=data, sections=[Section(COLUMNS, data["layers"], title="directions")], heading=heading,
                  notes=list(result.saved))
