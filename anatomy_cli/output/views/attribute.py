"""`attribute`'s view: one row per token (or per position of a block's activation), its attribution, share and
bar; the completeness check and occlusion's agreement in the footer."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models import sites
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.views.ablate import metric_name
from anatomy_cli.output.views.ablate import token_record
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.attribute import Agreement
    from anatomy_cli.analyses.attribute import TokenAttribution
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.driven import Shown
    from anatomy_cli.output.views.protocol import FigureArgs

COLUMNS = (Column("position", "position", "int"), Column("token", "token"),
           Column("attribution", "attribution", "number", 4), Column("share", "share", "float", 3),
           Column("bar", "", "signed_bar"))
CONVERGED = Column("converged", "converged")
CHECK_COLUMNS = (Column("rank", "rank", "int"), Column("occlusion", "occlusion", "number", 4),
                 Column("occlusion_rank", "occlusion rank", "int"))
AGREE = 0.5  # a Spearman correlation below this: the two rankings are said to disagree
ASKS = {"integrated-gradients": "shares f(x) - f(baseline) along a path on which every token moves at once from "
                                "the baseline ({baseline}) to the prompt",
        "saliency": "is the size of f's gradient at the prompt itself (how sensitive, not how much)",
        "input-x-gradient": "is embedding · gradient at the prompt itself (a first-order estimate from 0)"}
ROWS = "rows"
HOW = {"saliency": "the L2 norm of the metric's gradient with respect to the token's embedding (Captum Saliency)",
       "input-x-gradient": "embedding · gradient, summed over the embedding (Captum InputXGradient)",
       "integrated-gradients": "integrated gradients from the baseline to the embedding, summed over the "
                               "embedding (Captum IntegratedGradients)",
       "occlusion": "metric - metric with the token {occluded} (Captum FeatureAblation)"}


def figure(lm: LoadedModel, enc: Encoded, result: TokenAttribution, shown: Shown) -> FigureArgs:
    """One picture for every format (no HTML page of its own: an .html file holds the PNG)."""
    ids = shown.plan

    return (result, metric_name(lm, ids), Caption.of("attribute", lm, enc.text, method_line(result))), {}


def method_line(result: TokenAttribution) -> str:
    if result.method == "integrated-gradients":
        where = "" if result.layer is None or result.site is None else f" at {sites.name(result.layer, result.site)}"
        first = ", first position kept" if result.kept_first else ""
        return f"integrated gradients{where}, {counted(result.steps or 0, 'step')}, baseline {result.baseline}{first}"
    if result.method == "occlusion":
        return f"occlusion ({'token dropped' if result.baseline == 'drop' else f'replaced by {result.baseline}'})"
    return result.method


def report(lm: LoadedModel, enc: Encoded, result: TokenAttribution, shown: Shown) -> Report:
    ids = shown.plan  # the task's plan: the target and foil ids
    target, foil = token_record(lm, ids["target"]), token_record(lm, ids["foil"])
    data = {**prompt_record(lm, enc), "target": target, "foil": foil, **result.to_dict()}
    what = metric_name(lm, ids)
    heading = [f"attribute · {model_label(lm)} · {method_line(result)}",
               f"{prompt_line(enc)} · f = {what} at the last position = {result.value:.4f}"]
    biggest = max((abs(r.attribution) for r in result.rows), default=0.0) or 1.0
    mark = {} if result.converged is None else {"converged": result.converged}
    rows = [{**r.to_dict(), "bar": r.attribution / biggest, **mark} for r in result.rows]
    occluded = "dropped" if result.baseline == "drop" else f"replaced by {result.baseline}"
    notes = [f"attribution = {HOW[result.method].format(occluded=occluded)}; share = attribution / sum of "
             "|attributions|"]
    c = result.completeness
    if c is not None:
        err = "undefined" if c.relative_error is None else f"{c.relative_error:.2e}"
        verdict = "converged" if c.converged else "UNCONVERGED"
        notes.append(f"completeness: sum of attributions {c.sum_attributions:.6f} vs f(x) - f(baseline) = "
                     f"{result.value:.6f} - {c.baseline_metric:.6f} = {c.difference:.6f}; delta {c.delta:.2e}, "
                     f"relative error {err}: {verdict} (bound {c.max_rel_error:g}; steps tried "
                     f"{', '.join(str(n) for n, _ in c.tries)})")
    if result.kept_first:
        notes.append("position 0 keeps its own embedding in the baseline (the attention sink): attribution 0 by "
                     "construction; --vary-first moves it too")
    columns = COLUMNS + ((CONVERGED,) if mark else ())
    if result.check is not None:
        notes += check_notes(result, result.check)
        data["check"]["agrees"] = agrees(result.check.rank_correlation)
        if result.method != "occlusion":
            rows = with_ranks(rows, result.check)
            columns += CHECK_COLUMNS
    return Report(data=data, sections=[Section(columns, rows, title="token attribution")], heading=heading,
                  notes=notes)


def agrees(rho: float | None) -> bool | None:
    """Whether the method's ranking and occlusion's agree (Spearman ρ ≥ 0.5); None when ρ is undefined."""
    return None if rho is None else rho >= AGREE


def with_ranks(rows: list[dict[str, Any]], check: Agreement) -> list[dict[str, Any]]:
    """The table's rows with each compared position's rank by attribution (1: the largest), occlusion's score
    and its rank by that score (the positions ``check`` leaves out: empty)."""
    from anatomy_cli.analyses.attribute import ranks

    keep = list(check.positions)
    n = len(keep)
    mine = ranks([rows[p]["attribution"] for p in keep])
    theirs = ranks([check.scores[p] for p in keep])
    rank = {p: _whole(n + 1 - r) for p, r in zip(keep, mine)}
    occ_rank = {p: _whole(n + 1 - r) for p, r in zip(keep, theirs)}
    return [{**row, "rank": rank.get(row["position"]), "occlusion": check.scores[row["position"]],
             "occlusion_rank": occ_rank.get(row["position"])} for row in rows]


def _whole(rank: float) -> int | float:
    """A rank as a whole number (a tie's average rank stays a float: 2.5)."""
    return int(rank) if rank == int(rank) else rank


def check_notes(result: TokenAttribution, check: Agreement) -> list[str]:
    """The footer's agreement line (``check``: ``result``'s) and, when the rankings disagree, what that means."""
    rho = check.rank_correlation
    lines = [f"check: Spearman rank correlation with occlusion ({check.baseline}) over positions "
             f"{list(check.positions)}: {'undefined' if rho is None else f'{rho:.3f}'}"]
    if rho is not None and rho < AGREE:
        name = method_line(result).split(",")[0]
        occluded = "dropped" if check.baseline == "drop" else f"replaced by {check.baseline}"
        hint = ("" if result.metric == "logit_diff" else
                "; --foil TOKEN asks the contrastive question (why the target rather than the foil)")
        lines.append(f"{name} and occlusion DISAGREE (ρ {rho:.3f} < {AGREE}): they answer different questions. "
                     f"{name} {ASKS[result.method].format(baseline=result.baseline)}; occlusion asks what f loses "
                     f"when one token alone is {occluded}, the rest kept. Compare the rank columns{hint}; see "
                     "docs/commands/attribute.md, \"When the two disagree\"")
    return lines
