"""`drift`'s view: the similarity and baseline per residual row (or the pairwise matrix at one row)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import bos_text
from anatomy_cli.tasks.session import dtype_name
from anatomy_cli.tasks.session import model_label

if TYPE_CHECKING:
    from anatomy_cli.analyses.drift import DriftResult
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs

ROWS = "layers"
REPORT_FIRST = True  # the report, then --plot's picture
BASELINE_NOTE = ("baseline: mean cosine between the word and every other token of its own context "
                 "(special tokens excluded), averaged over the contexts; drift is real where similarity "
                 "falls towards it")
LAYERS_NOTE = ("layer embed = the embeddings; layer N = block N's output (blocks.N.hook_resid_post); layer {last} "
               "= the last block's output, before any final norm")


def report(lm: LoadedModel, encoded: list[Encoded], result: DriftResult) -> Report:
    first = encoded[0] if encoded else None
    return _report(result, model_label(lm), dtype_name(lm), lm.dequantized_from, first)


def figure(lm: LoadedModel, encoded: list[Encoded], result: DriftResult) -> FigureArgs:
    detail = f"{result.word!r} in {len(result.contexts)} contexts · pool {result.pool}"
    return (result, Caption.of("drift", lm, None, detail)), {}


def _heading(result: DriftResult, label: str, first: Encoded | None) -> list[str]:
    n = len(result.contexts)
    heading = [f"{result.word!r} in {n} contexts · {label} · pool {result.pool}"
               + (f" · occurrence {result.occurrence}" if result.occurrence != 1 else "")]
    for loc in result.contexts:
        where = "token" if len(loc.positions) == 1 else "tokens"
        heading.append(f"context {loc.context}: {where} {', '.join(map(str, loc.positions))} "
                       f"({'|'.join(loc.pieces)}) in {loc.text!r}")
    if first is not None and first.bos is not None:
        heading.append(f"every context: {bos_text(first)}")
    return heading


def _report(result: DriftResult, label: str, dtype: str, dequantized_from: str | None,
            first: Encoded | None = None) -> Report:
    data = result.to_dict()
    # The same key, in the same place, as every command's prompt record; the BOS rule is one for all contexts.
    bos = {"bos": first.bos, "bos_source": first.bos_source} if first is not None else {}
    data = {**{k: data[k] for k in ("word", "model", "untrained")}, "dtype": dtype,
            "dequantized_from": dequantized_from, **bos, **data}
    n = len(result.contexts)
    heading = _heading(result, label, first)
    notes = []
    if result.match == "characters":
        notes.append(f"{result.word!r} is in a script written without spaces between words: matched as characters "
                     f"(not as a whole word); its vector pools the tokens that cover them")
    if not result.same_tokenization:
        notes.append("the word tokenized differently across contexts: "
                     + "; ".join(f"context {loc.context} {'|'.join(loc.pieces)} {list(loc.ids)}"
                                 for loc in result.contexts))
    if result.matrix is not None:
        columns = [Column("context", "context", "int")] + [
            Column(f"c{loc.context}", f"c{loc.context}", "float", 3) for loc in result.contexts]
        rows = [{"context": loc.context, **{f"c{j + 1}": v for j, v in enumerate(values)}}
                for loc, values in zip(result.contexts, result.matrix)]
        heading.append(f"pairwise cosine similarity at layer {result.matrix_label} "
                       f"(of embed, blocks 0..{result.n_layers - 1})")
        return Report(data=data, sections=[Section(columns, rows)], heading=heading, notes=notes)
    similarity = "similarity" if n == 2 else f"similarity (mean of {n * (n - 1) // 2} pairs)"
    columns = [Column("layer", "layer"), Column("similarity", similarity, "float", 3),
               Column("baseline", "baseline", "float", 3)]
    notes = [LAYERS_NOTE.format(last=result.n_layers - 1), BASELINE_NOTE, *notes]
    return Report(data=data, sections=[Section(columns, data["layers"])], heading=heading, notes=notes)
