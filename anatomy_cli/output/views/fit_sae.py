"""`fit-sae`'s view: the SAEs written, one row per block: its training and its health on the held-out window."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models.sites import block_spans
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks.fit_sae import SaeEstimate
from anatomy_cli.tasks.fit_sae import recipe
from anatomy_cli.tasks.session import model_label
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.fit_sae import SaeFit

ROWS = "blocks"
ESTIMATE_ROWS = "phases"  # --estimate's rows: one per phase of the run (the cost's own records)
PHASE_COLUMNS = (Column("phase", "phase"), Column("seconds", "seconds", "float", 1), Column("done", "done"))
HEALTH = ("l0_mean", "fve", "error_ratio", "norm_ratio", "ce_clean_nats", "ce_spliced_nats", "kl_spliced_nats")
COLUMNS = (Column("layer", "layer", "id"), Column("fvu_first", "fvu_first", "float", 3),
           Column("fvu_last", "fvu_last", "float", 3), Column("dead_fraction", "dead", "pct", 0),
           *(Column(f"held_out_{k}", f"held_out_{k}", "float", 1 if k == "l0_mean" else 3) for k in HEALTH))


def row(block: Mapping[str, Any]) -> dict[str, object]:
    """A block's JSON record with its held-out health also flat (``held_out_fve``, ...), the table's columns."""
    return {**block, **{f"held_out_{k}": block["health"][k] for k in HEALTH}}


def report(lm: LoadedModel, result: SaeFit | SaeEstimate) -> Report:
    if isinstance(result, SaeEstimate):
        return estimate_report(lm, result)
    d = result.to_dict()
    rows = [row(b) for b in d["blocks"]]
    data = {**records.model_record(lm), **d, ROWS: rows}
    what = "transcoder" if result.transcoder else "SAE"
    first = result.blocks[0]
    n = len(result.blocks)
    where = (f"{first.site}" + (f" -> {first.site_out}" if result.transcoder else "") if n == 1
             else f"{block_spans(b.layer for b in result.blocks)} ({n} {what}s)")
    if result.clt is not None:
        what, where = "cross-layer transcoder", f"{block_spans(b.layer for b in result.blocks)} ({n} blocks)"
    kind, sparsity = recipe(result.k, result.jumprelu)
    heading = [f"fit-sae · {model_label(lm)} · {kind} {what} {where}",
               f"wrote {result.out}: d_in {first.d_in}, d_sae {result.d_sae}, {sparsity}; {result.tokens:,} tokens "
               f"x {counted(result.epochs, 'epoch')} ({counted(first.steps, 'step')}"
               f"{' of every block at once' if result.clt is not None else ' per block'}, lr {result.lr:.2g}, "
               f"trainer {result.trainer}) in {result.seconds:.1f} s ({result.collect_seconds:.1f} s collecting, one "
               "pass)"]
    held = counted(result.held_out_tokens, "token")
    notes = [f"health on the held-out window ({held}): read it on any prompt with "
             f"anatomy sae PROMPT --sae {first.folder}"]
    if result.clt is not None:
        notes = [f"held-out window ({held}): held_out_fve and held_out_l0_mean as written "
                 f"(JumpReLU thresholds: {result.clt['thresholds']}); fve_topk in the JSON as trained; the loss is "
                 f"the sum of the blocks' FVU (fvu_first, fvu_last: its mean per block)"]
    if result.transcoder and [b.layer for b in result.blocks] == list(range(lm.info.n_layers)):
        notes.append(f"a transcoder for every block: anatomy circuit PROMPT --transcoders {result.out}")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="training and held-out health, per block")],
                  heading=heading, notes=notes)


def estimate_report(lm: LoadedModel, result: SaeEstimate) -> Report:
    """``--estimate``: the cost line a run prints first, as the heading; the phases as rows; the JSON holds the
    quantities as a run's ``cost`` does."""
    data = {**records.model_record(lm), **result.to_dict(), ESTIMATE_ROWS: result.cost["phases"]}
    return Report(data=data, sections=[Section(PHASE_COLUMNS, result.cost["phases"], title="expected time, per phase")],
                  heading=[f"fit-sae --estimate · {model_label(lm)} · nothing trained, nothing written to "
                           f"{result.out}", result.line])
