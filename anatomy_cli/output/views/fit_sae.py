"""`fit-sae`'s view: the SAE written, its training, and its health on the held-out window."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks.session import model_label

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.fit_sae import SaeFit

COLUMNS = (Column("statistic", "statistic"), Column("value", "value", "float", 4))
ROWS = "figures"
SHOWN = ("fvu_first", "fvu_last", "dead_fraction")
HEALTH = ("l0_mean", "fve", "error_ratio", "norm_ratio", "ce_clean_nats", "ce_spliced_nats", "kl_spliced_nats")


def report(lm: LoadedModel, result: SaeFit) -> Report:
    d = result.to_dict()
    rows = [{"statistic": k, "value": d[k]} for k in SHOWN] + [
        {"statistic": f"held_out_{k}", "value": result.health[k]} for k in HEALTH]
    data = {**records.model_record(lm), **d, ROWS: rows}
    what = "transcoder" if result.transcoder else "SAE"
    heading = [f"fit-sae · {model_label(lm)} · TopK {what} {result.site}"
               + (f" -> {result.site_out}" if result.transcoder else ""),
               f"wrote {result.out}: d_in {result.d_in}, d_sae {result.d_sae}, k {result.k}; {result.tokens:,} tokens "
               f"x {result.epochs} epochs ({result.steps} steps, lr {result.lr:.2g}, trainer {result.trainer}) in "
               f"{result.seconds:.1f} s"]
    notes = [f"health on the held-out window ({result.held_out_tokens} tokens): read it on any prompt with "
             f"anatomy sae PROMPT --sae {result.out}"]
    return Report(data=data, sections=[Section(COLUMNS, rows, title="training and held-out health")],
                  heading=heading, notes=notes)
