"""`verify`'s fitted-lens identities (rows of section 2): the lenses that change nothing read exactly the logit lens.

* a Jacobian lens with ``J = identity`` at every block reads each block's output as the logit lens does;
* a tuned lens with zero translators (``A = 0``, ``b = 0``: ``h + 0 h + 0``) reads every row, ``embed`` included,
  as the logit lens does.

Both lenses are built in memory from the loaded model's width and depth (no file) as
:class:`~anatomy_cli.engine.fitted_lens.FittedLens`, and read through its own ``transform``, the path `lens`,
`trace`, `generate` and `corpus` read a fitted lens through, then ``engine.unembed`` (final norm + LM head). A row
compares, per prompt and residual row, the fitted reading's logits with the logit lens' and keeps the worst.
"""

from __future__ import annotations

from pathlib import Path

import torch

from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.runs import Runs
from anatomy_cli.engine import lens
from anatomy_cli.engine.fitted_lens import FittedLens

JACOBIAN = "jacobian lens J = I == logit lens"
TUNED = "tuned lens A = 0, b = 0 == logit lens"


def neutral_lenses(d_model: int, n_layers: int, device: torch.device | str = "cpu") -> dict[str, FittedLens]:
    """``{row name: lens}``: the Jacobian lens ``J = I`` at blocks 0..L-2 (the last block read as it is, as a
    jlens file's is) and the tuned lens with ``A_i = 0``, ``b_i = 0`` for ``i = 0..L-1``."""
    eye = torch.eye(d_model, device=device)
    zero, zero_b = torch.zeros(d_model, d_model, device=device), torch.zeros(d_model, device=device)
    jacobian = FittedLens("jacobian", Path("<J = identity>"), tuple(range(1, n_layers + 1)),
                          {row: (eye, None) for row in range(1, n_layers)})
    tuned = FittedLens("tuned", Path("<zero translators>"), tuple(range(n_layers + 1)),
                       {row: (zero, zero_b) for row in range(n_layers)}, residual=True)
    return {JACOBIAN: jacobian, TUNED: tuned}


def fitted_lens_checks(runs: Runs, tol: float) -> list[C.Check]:
    """One row per neutral lens: the worst over prompts and residual rows of its logits against the logit lens'."""
    lm = runs.lm
    rows = []
    for name, fitted in neutral_lenses(lm.d_model, lm.n_layers, lm.device).items():
        found = []
        with torch.inference_mode():
            for cache in runs.batched:
                resid = cache.residual_stream()                          # [L + 1, pos, d_model]
                read = fitted.transform(resid)                           # [len(rows), pos, d_model]
                for i, row in enumerate(fitted.rows):
                    found.append(C.tensor_check(name, lens.unembed(lm, read[i]), lens.unembed(lm, resid[row]), tol,
                                                layer=row - 1 if row else None))
        rows.append(C.worst(found))
    return rows
