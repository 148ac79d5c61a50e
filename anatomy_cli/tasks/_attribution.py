"""What `dla`, `ablate`, `patch` and `attribute` share: the target/foil pair (:class:`TokenPair`), and for
`patch` and `ablate` `--method exact|attribution` and `--check N`, their options (declared once:
:func:`method_option`, :func:`check_option`) and runs.

With ``--method attribution`` every cell is estimated from one backward (``engine.gradients``);
``--check N`` reruns the N cells with the largest estimates exactly (``analyses.attribution_patching``).
The check table and footer are :mod:`anatomy_cli.output.views._attribution`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.text import targets

if TYPE_CHECKING:
    from anatomy_cli.analyses.attribution_patching import Check
    from anatomy_cli.tasks.protocol import Opened


class TokenPair:
    """What an options class with the fields ``target`` (TEXT), ``target_id``, ``foil`` (TEXT), ``foil_id`` and
    ``first_token`` (declared with :mod:`anatomy_cli.declare.shared`'s factories, ``first_token(foil=True)``) can
    do with them: ``--target``/``--foil`` as given; :meth:`resolve` is the one place they become ids
    (:func:`targets.resolve_pair`: a foil equal to the target is refused there)."""

    target: str | None
    target_id: int | None
    foil: str | None
    foil_id: int | None
    first_token: bool

    @property
    def wanted(self) -> targets.TokenChoice | None:
        return targets.choice(self.target, self.target_id, option="--target", first_token=self.first_token)

    @property
    def foiled(self) -> targets.TokenChoice | None:
        return targets.choice(self.foil, self.foil_id, option="--foil", first_token=self.first_token)

    def check_tokens(self) -> None:
        """Refuse what needs no model: ``--first-token`` without a TEXT, both TEXT and id."""
        targets.check_first_token(self.first_token, self.wanted, self.foiled, options="--target or --foil")

    def require_target(self, missing: str) -> targets.TokenChoice:
        """The target as given; UsageError ``missing`` without one."""
        wanted = self.wanted
        if wanted is None:
            raise UsageError(missing)
        return wanted

    def resolve(self, opened: Opened) -> dict[str, int | None]:
        wanted = self.wanted
        assert wanted is not None
        return targets.resolve_pair(opened.tokenizer, wanted, self.foiled, model=opened.name,
                                    vocab_size=opened.info.lm_head_rows)


class Method(str, Enum):
    exact = "exact"
    attribution = "attribution"


def method_option() -> Method:
    """``--method exact|attribution`` (patch, ablate)."""
    return option(Method.exact, "--method", case_sensitive=False,
                  help="exact: one edited run per cell; attribution: every cell estimated at once from one backward, "
                  "(a_new - a) . dm/da (attribution patching), at the cost of one forward and one backward (patch "
                  "runs CLEAN and CORRUPT in that forward as two batch rows).")


def check_option() -> int:
    """``--check N`` (patch, ablate): at least 0, checked by the options class."""
    return option(0, "--check", metavar="N", min=0,
                  help="With --method attribution: rerun the N cells with the largest |estimate| exactly and print "
                  "them beside the estimates (Pearson's r and top-k agreement in the footer).")


def check_options(method: Method, check: int) -> None:
    """UsageError for ``--check`` without ``--method attribution`` (its minimum, 0, is declared)."""
    if check and method is not Method.attribution:
        raise UsageError("--check N compares attribution estimates with exact runs: it needs --method attribution")


@dataclass(frozen=True)
class Extra:
    """What ``--method attribution`` adds to a report: the check (or None), and the heading's first line."""

    method: str
    check: Check | None
    heading: str | None = None


def patch(lm, clean_ids, corrupt_ids, site: str, ids: dict, check: int, batch_size: int):
    """Attribution patching of one site: ``(Patching result, Extra)``; values as the exact grid's."""
    from anatomy_cli.analyses import attribution_patching as ap
    from anatomy_cli.analyses import patch as analysis
    from anatomy_cli.engine import gradients

    metric = analysis.logit_metric(ids["target"], ids["foil"])
    run = gradients.attribution_patch_grid(lm, clean_ids, corrupt_ids, site, reduce=metric)
    result = analysis.patching(site, "logit_diff" if ids["foil"] is not None else "logit", run.layers,
                               run.columns, run.corrupt + run.estimate, run.clean, run.corrupt)
    found = None
    if check:
        flat = ap.largest(run.estimate, check)
        cells = [(run.layers[i // len(run.columns)], run.columns[i % len(run.columns)]) for i in flat]
        exact = gradients.exact_patch_cells(lm, corrupt_ids, run, cells, reduce=metric, batch_size=batch_size)
        column = "head" if site == "head" else "position"
        keys = [{"layer": layer, column: c} for layer, c in cells]
        found = ap.compare(keys, run.estimate.reshape(-1)[flat].tolist(), (exact - run.corrupt).tolist(),
                           scale=run.clean - run.corrupt)
    n = len(result.cells)
    return result, Extra("attribution", found, f"{n} cells estimated by attribution patching "
                                                 "(1 forward of CLEAN and CORRUPT as 2 batch rows, 1 backward)")


def ablate(lm, ids, plan, metric, *, position: int, check: int, batch_size: int):
    """Attribution ablation of one prompt: ``(intact metric, float64 [len(plan)] metrics, Extra)``."""
    from anatomy_cli.analyses import attribution_patching as ap
    from anatomy_cli.engine import gradients
    from anatomy_cli.engine import interventions

    rows = [edits for *_, edits in plan]
    base, estimate = gradients.attribution_ablation(lm, ids, rows, reduce=metric, position=position)
    found = None
    if check:
        chosen = ap.largest(estimate, check)
        exact_base, exact = interventions.run_edits(lm, ids, [rows[i] for i in chosen], position=position,
                                                    batch_size=batch_size, reduce=metric)
        keys = [{"layer": plan[i][0], "component": plan[i][1], "head": plan[i][2]} for i in chosen]
        changes = (exact.detach().cpu().double().reshape(-1) - float(exact_base[0])).tolist()
        found = ap.compare(keys, estimate[chosen].tolist(), changes)
    return base, base + estimate, Extra("attribution", found, f"{len(plan)} ablations estimated from 1 forward "
                                                              "+ 1 backward")
