"""`fit-lens`'s view: the lens written, its settings, and per fitted block how far J is from the identity (a tuned
lens: per translator the KL to the final distribution at the first and the last step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.engine.opening import OpenedModel
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks._tuned_fit import TunedFit
from anatomy_cli.tasks.session import model_label
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.fit_lens import JacobianFit
    from anatomy_cli.tasks.fit_lens import MergedLens

COLUMNS = (Column("block", "block", "int"), Column("identity_distance", "‖J − I‖/√d", "float", 4),
           Column("frobenius", "‖J‖", "float", 3))
ROWS = "blocks"
TUNED_COLUMNS = (Column("translator", "translator", "int"), Column("reads", "reads"),
                 Column("kl_first", "KL first step", "float", 4), Column("kl_last", "KL last step", "float", 4))
TUNED_ROWS = "translators"


def report(lm: LoadedModel | OpenedModel, result: JacobianFit | TunedFit) -> Report:
    """``lm``: the loaded model, or (``--ray``: the workers loaded it) the opened one, said from its spec."""
    if isinstance(result, TunedFit):
        return tuned_report(lm, result)  # type: ignore[arg-type]  # trained in this process: loaded
    if isinstance(lm, OpenedModel):
        record, label = records.spec_record(lm.spec), f"{lm.spec.model} (on Ray)"
    else:
        record, label = records.model_record(lm), model_label(lm)
    data = {**record, "kind": "jacobian", **result.to_dict()}
    heading = [f"fit-lens jacobian · {label} · {lm.info.n_layers} layers",
               f"wrote {result.out}: {counted(result.n_prompts, 'prompt')} "
               f"({result.tokens:,} tokens, {result.skipped:,} skipped), "
               f"{counted(len(result.source_layers), 'block')} -> block {result.target_layer}, "
               f"{result.dtype}, dim_batch {result.dim_batch}"]
    notes = [f"J_N maps block N's output to block {result.target_layer}'s (raw, before the final norm), averaged "
             f"over positions {result.skip_first}..n-2 and the prompts (jlens' estimator); read it with "
             f"anatomy lens PROMPT --lens jacobian:{result.out}"]
    return Report(data=data, sections=[Section(COLUMNS, data["blocks"], title="fitted blocks")], heading=heading,
                  notes=notes)


def tuned_report(lm: LoadedModel, result: TunedFit) -> Report:
    data = {**records.model_record(lm), "kind": "tuned", **result.to_dict()}
    heading = [f"fit-lens tuned · {model_label(lm)} · {lm.n_layers} layers",
               f"wrote {result.out}: {counted(result.windows, 'window')} ({result.tokens:,} "
               f"tokens of {result.corpus}, up to {result.ctx:,} each), {counted(result.steps, 'step')}, "
               f"SGD lr {result.lr:g} (Nesterov 0.9, weight decay 1e-3)"]
    notes = ["translator i reads residual row i (embed, then block i-1's output: transformers' hidden_states[i]); "
             "KL(final ‖ lens) in nats per token, the first step's windows through the zero lens (the logit lens), "
             f"the last step's before its update; read it with anatomy lens PROMPT --lens tuned:{result.out}"]
    return Report(data=data, sections=[Section(TUNED_COLUMNS, data["translators"], title="translators")],
                  heading=heading, notes=notes)


def merge_report(result: MergedLens) -> Report:
    data = {"kind": "merge", **result.to_dict()}
    columns = (Column("file", "file"), Column("n_prompts", "prompts", "int"))
    heading = [f"fit-lens merge · {len(result.inputs)} fits · d_model {result.d_model}",
               f"wrote {result.out}: {counted(sum(result.counts), 'prompt')}, the n_prompts-weighted mean, "
               f"{result.dtype}"]
    return Report(data=data, sections=[Section(columns, data["inputs"], title="merged fits")], heading=heading)
