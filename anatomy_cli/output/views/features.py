"""`features`' view: one row per followed feature (frequency, mean and max activation, dead or always-on, the
tokens its decoder direction promotes, its top context); JSON adds every context and the logit effects."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models.resolve import short_name
from anatomy_cli.output import plots
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks._features_run import FeaturesRun

ROWS = "features"
COLUMNS = (Column("feature", "feature", "id"), Column("frequency", "frequency", "number", 3),
           Column("mean_activation", "mean", "float", 3), Column("max_activation", "max", "float", 3),
           Column("status", "status"), Column("promoted", "promotes"), Column("top_context", "top context"))
COST_COLUMNS = (Column("tokens", "tokens", "int"), Column("features", "features", "int"),
                Column("flops", "FLOP", "number", 2), Column("seconds", "seconds", "float", 1),
                Column("bytes", "kept", "bytes"))


def _snippet(tokenizer: Any, ctx: dict[str, Any]) -> str:
    """A context as one line of text, its token in brackets: the tokenizer's :meth:`line` (a character split over
    tokens shown whole, its bracket around the character where the token holds part of it); newlines ``⏎``."""
    return tokenizer.line(ctx["token_ids"], ctx["at"]).replace("\n", "⏎")


def report(run: FeaturesRun) -> Report:
    from anatomy_cli.tasks._features_files import LOGIT_CONVENTION

    sae = run.sae_file
    dictionary = {"path": str(sae.path), "format": sae.format, "architecture": sae.architecture,
                  "hook": sae.hook_name, "site": sae.site, "site_out": sae.site_out, "d_sae": sae.d_sae}
    if run.result is None:
        only: dict[str, object] = {"model": run.model, "dictionary": dictionary, "estimate": run.cost,
                                   "fit_report": run.plan.fit_report}
        return Report(data=only, sections=[Section(COST_COLUMNS, [run.cost], title="expected cost")],
                      heading=[f"features · {run.display or run.model} · {sae.path} (estimate only)"])
    from anatomy_cli.corpus.feature_summary import hist_edges

    top = {}
    for c in run.contexts:
        if c["kind"] == "top" and c["rank"] == 0:
            top[c["feature"]] = _snippet(run.lm.tokenizer, c)
    promoted: dict[int, list[str]] = {}
    for r in run.logits:
        if r["side"] == "top" and r["rank"] < 3:
            promoted.setdefault(r["feature"], []).append(repr(r["token"]))
    shown = shown_rows(run.rows, run.show)
    table = [{**r, "promoted": " ".join(promoted.get(r["feature"], [])), "top_context": top.get(r["feature"], "")}
             for r in shown]
    result = run.result
    data: dict[str, object] = {"model": run.model, "dictionary": dictionary, "tokens": result.stats.tokens,
                            "windows": result.stats.windows, "shards": result.shards, "resumed": result.resumed,
                            "ctx": run.plan.ctx, "bos": run.plan.bos, "estimate": run.cost,
                            "logit_convention": LOGIT_CONVENTION,
                            "histogram_edges": [e if e != float("inf") else None for e in hist_edges()],
                            ROWS: run.rows, "contexts": run.contexts, "logit_effects": run.logits,
                            "files": list(run.files), "fit_report": run.plan.fit_report}
    dead = sum(r["status"] == "dead" for r in run.rows)
    always = sum(r["status"] == "always-on" for r in run.rows)
    heading = [f"features · {model_label(run.lm)} · {sae.path} at {sae.hook_name} · {len(run.rows):,} features over "
               f"{result.stats.tokens:,} tokens ({counted(result.stats.windows, 'window')} of {run.plan.ctx})",
               f"{dead:,} dead, {always:,} always-on"]
    notes = [f"logit effects: {LOGIT_CONVENTION}"]
    if len(shown) < len(run.rows):
        notes.insert(0, f"showing the {len(shown):,} most frequent of {len(run.rows):,} features (--show "
                     f"{run.show}); --show 0 lists every one, --format json and --out hold every one")
    if run.files:
        notes.append(f"wrote {', '.join(run.files[:3])}" + (f" and {len(run.files) - 3} more" if len(run.files) > 3
                                                           else ""))
    title = "per feature" if len(shown) == len(run.rows) else f"the {len(shown):,} most frequent features"
    return Report(data=data, sections=[Section(COLUMNS, table, title=title)], heading=heading, notes=notes)


def shown_rows(rows: list[dict[str, Any]], show: int) -> list[dict[str, Any]]:
    """The table's rows, most frequent first (ties: the lower id first), so that ``| head`` reads the busiest:
    every one (``show`` 0), else the ``show`` most frequent."""
    busiest = sorted(rows, key=lambda r: (-r["fires"], r["feature"]))
    return busiest[:show] if show else busiest


def figure(run: FeaturesRun) -> FigureArgs:
    """``plots.draw("features", ...)``'s arguments: the report's data (the JSON record) and the caption."""
    data = report(run).data
    untrained = bool(getattr(run.lm, "untrained", False))
    detail = f"{run.sae_file.path} at {run.sae_file.hook_name} · {len(run.rows):,} features over " \
        f"{data['tokens']:,} tokens"
    return (data, plots.Caption("features", short_name(run.model), None, detail, untrained=untrained)), {}
