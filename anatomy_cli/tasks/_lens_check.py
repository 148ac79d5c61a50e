"""A fitted lens' held-out check (:mod:`anatomy_cli.analyses.lens_check`), run where it is fitted (`fit-lens
jacobian`, `fit-lens tuned`: on the held-out paragraph) and where it is read (`lens --lens`: on the prompts), and
the probe that times it for the fits' estimates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from anatomy_cli import engine
from anatomy_cli.analyses.lens_check import HELD_OUT
from anatomy_cli.analyses.lens_check import compare
from anatomy_cli.analyses.lens_check import pooled
from anatomy_cli.engine.estimate import timed
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.lens_check import LensCheck
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens

PROBE_TOKENS = 16  # the probe checks the held-out paragraph's first tokens, scaled to all of them


def held_out_ids(lm: LoadedModel) -> list[int]:
    """The held-out paragraph, encoded as every prompt is (the model's BOS rule), cut to the model's context."""
    return list(engine.encode(lm, [HELD_OUT])[0].ids)[:lm.info.n_ctx or None]


def check_ids(lm: LoadedModel, lens: FittedLens, ids: Sequence[int]) -> LensCheck:
    """``lens`` (a FittedLens) against the logit lens on the text ``ids``: one forward, every residual row."""
    from anatomy_cli.engine.attention import encode_ids

    cache = engine.run(lm, [encode_ids(lm, list(ids))], engine.residual_names(lm))[0]
    return compare(cache.residual_stream(), lens, lambda h: engine.unembed(lm, h))


def fit_check(lm: LoadedModel, lens: FittedLens, what: str) -> LensCheck:
    """The fit-time check on the held-out paragraph; its note (when a row is weak) goes out as a warning."""
    with notes.status("checking the lens on held-out text"):
        check = check_ids(lm, lens, held_out_ids(lm))
    note = check.note(what, "held-out text")
    if note:
        notes.warn(note)
    return check


def read_check(lm: LoadedModel, lens: FittedLens, resids: Sequence[torch.Tensor]) -> None:
    """Where a fitted lens is read: the check on the prompts' own residual streams (their KLs pooled, weighted by
    tokens), one warning when a row is weak."""
    checks = [compare(r, lens, lambda h: engine.unembed(lm, h)) for r in resids]
    note = pooled(checks).note(f"the {lens.kind} lens {lens.path}",
                               "this prompt" if len(checks) == 1 else "these prompts")
    if note:
        notes.warn(note)


def probe_seconds(lm: LoadedModel, rows: Sequence[int]) -> float:
    """What :func:`fit_check` will take, timed now: the same check on the held-out paragraph's first
    :data:`PROBE_TOKENS` tokens and on half as many, through a lens of zero translators at ``rows`` (the cost of any
    lens there): a fixed cost and one per token, carried to the paragraph's tokens."""
    import torch

    from anatomy_cli.engine.fitted_lens import FittedLens

    ids = held_out_ids(lm)
    d = lm.info.d_model
    zero = torch.zeros(d, d)
    lens = FittedLens("probe", None, tuple(rows), {r: (zero, None) for r in rows[:-1]}, residual=True)  # type: ignore[arg-type]
    n = min(PROBE_TOKENS, len(ids))
    check_ids(lm, lens, ids[:2])  # a warm-up: a first forward pays for what later ones do not
    m = max(n // 2, 1)
    half = timed(lambda: check_ids(lm, lens, ids[:m]))
    full = timed(lambda: check_ids(lm, lens, ids[:n]))
    per_token = max(full - half, 0.0) / max(n - m, 1)  # two sizes: a fixed cost and one per token
    return max(full + per_token * (len(ids) - n), full) if n > 1 else full * len(ids)
