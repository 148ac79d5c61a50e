"""`lens-eval`'s view: pass@1/5/10 per lens side by side, then every intermediate's best rank under each lens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.models.sites import block_runs
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks.session import describe
from anatomy_cli.tasks.session import model_label
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.lens_eval import LensEval
    from anatomy_cli.engine import LoadedModel

ROWS = "lenses"


def report(lm: LoadedModel, result: LensEval) -> Report:
    data = {**records.model_record(lm), **result.to_dict()}
    ks = result.ks
    summary_columns = (Column("lens", "lens"), Column("source", "--lens"), Column("blocks", "blocks"),
                       *(Column(f"pass_at_{k}", f"pass@{k}", "float", 3) for k in ks))
    summary = [{**row, "lens": row["label"], "source": row["lens"], "blocks": block_runs(row["blocks"])}
               for row in data["lenses"]]
    word_columns = (Column("item", "item", "int"), Column("word", "intermediate"), Column("forms", "forms"),
                    *(c for label in result.labels  # the blocks: optional on a narrow terminal
                      for c in (Column(f"rank_{label}", f"rank {label}", "int"),
                                Column(f"block_{label}", f"block {label}", "int", priority=-1))))
    show = describe(lm)
    words = [{"item": n, "word": w.word, "forms": " ".join(show(t)[0] for t in w.token_ids) or None,
              **{f"rank_{label}": r for label, r in zip(result.labels, w.ranks)},
              **{f"block_{label}": b for label, b in zip(result.labels, w.blocks)}}
             for n, item in enumerate(result.items, start=1) for w in item.words]
    heading = [f"lens-eval · {model_label(lm)} · {lm.n_layers} layers",
               f"{result.name}: {counted(len(result.items), 'item')}, "
               f"{result.n_words} intermediates" + (f", {result.skipped} items without intermediates (not scored)"
                                                     if result.skipped else "")]
    missing = len(result.no_form)
    notes = ["rank: 1-based (1 + the number of larger logits; jlens' rank + 1), the best over the lens' blocks and "
             "the word's single-token forms; pass@k: the mean over items of the fraction of intermediates with "
             "rank <= k (jlens' pass@k); a word with no single-token form is a miss"
             + (f" ({counted(missing, 'word')} here)" if missing else "")]
    return Report(data=data, sections=[Section(summary_columns, summary, title="pass@k per lens"),
                                       Section(word_columns, words, title="best rank per intermediate")],
                  heading=heading, notes=notes)
