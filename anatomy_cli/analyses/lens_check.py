"""Is a fitted lens worth reading? Its KL to the model's own output against the logit lens's, row by row, on text
it was not fitted on: at fit time (`fit-lens jacobian`, `fit-lens tuned`) on :data:`HELD_OUT`, a paragraph
written for this check and shipped here; where the lens is read (`lens --lens jacobian:FILE|tuned:DIR`) on the
prompt itself. A row whose fitted reading does not bring it clearly closer to the output than the logit lens's
(the mean over positions of KL(final ‖ fitted) above :data:`MARGIN` times that of KL(final ‖ logit)) is too
weak to read there: the fit saw too little text.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.models.sites import block_spans
from anatomy_cli.models.sites import residual_label

if TYPE_CHECKING:
    import torch

    from anatomy_cli.engine.fitted_lens import FittedLens

# Plain prose on several subjects (none of it in this repository's docs, which the tour fits on).
HELD_OUT = ("The ferry left the harbour an hour late, because fog had settled over the water before dawn. Most of "
            "the passengers stayed inside, drinking coffee and reading yesterday's newspapers, while a few children "
            "pressed their faces against the windows to watch the gulls. When the island finally appeared, its "
            "white houses seemed to float above the sea. In the small market near the pier, farmers sold tomatoes, "
            "olives, fresh bread and honey from the hills. An old man explained that the village had been rebuilt "
            "twice, once after an earthquake and once after a great fire, and that every family kept a photograph "
            "of the church as it had looked a hundred years ago.")
DOCS = "docs/commands/fit-lens.md#what-a-useful-fit-takes"
# A fitted row is readable where its held-out KL to the output is at most this share of the logit lens's: a rule of
# thumb, chosen on SmolLM2 (docs/commands/fit-lens.md#what-a-useful-fit-takes). On the held-out paragraph Jacobian
# lenses fitted on the tour's 2 prompts (which read noise, "HETATM", "upiter", at blocks 0-21) and on 4 paragraphs
# of docs/ are at 0.47-0.96 of the logit lens's KL at blocks 0-21; merely "closer than the logit lens" would pass
# them everywhere (SmolLM2's logit lens is 13-20 nats from the output in the middle blocks). No lens fitted on
# enough text (jlens: 100-1000 prompts) was at hand to place the rule against a good one.
MARGIN = 0.5


@dataclass(frozen=True)
class LensCheck:
    """Per fitted row (``reads``: ``embed`` or the block whose output it reads; the last block, read as it is,
    left out) the mean KL(final ‖ lens) in nats of the fitted lens and of the logit lens over ``tokens``
    positions of one text."""

    reads: tuple[str | int, ...]
    kl_fitted: tuple[float, ...]
    kl_logit: tuple[float, ...]
    tokens: int

    @property
    def weak(self) -> tuple[str | int, ...]:
        """The rows where the fitted lens is not clearly closer to the output than the logit lens (:data:`MARGIN`)."""
        return tuple(r for r, f, g in zip(self.reads, self.kl_fitted, self.kl_logit) if f > MARGIN * g)

    def to_dict(self) -> dict[str, object]:
        return {"tokens": self.tokens, "weak": list(self.weak),
                "rows": [{"reads": r, "kl_fitted_nats": f, "kl_logit_nats": g}
                         for r, f, g in zip(self.reads, self.kl_fitted, self.kl_logit)]}

    def note(self, lens: str, text: str) -> str | None:
        """One line naming the weak rows (None when there is none): ``lens`` the lens (``the jacobian lens
        lens.pt``), ``text`` what it was checked on (``held-out text``, ``this prompt``)."""
        weak = self.weak
        if not weak:
            return None
        return (f"{lens} is not within {MARGIN:g}x the logit lens's KL to the model's output at {_rows(weak)} "
                f"({len(weak)} of {len(self.reads)} rows; mean KL on {text}, {self.tokens} tokens): too weak to "
                f"read there; a useful fit needs more text ({DOCS})")


def _rows(rows: Sequence[str | int]) -> str:
    blocks = [r for r in rows if isinstance(r, int)]
    return " and ".join((["embed"] if "embed" in rows else []) + ([block_spans(blocks)] if blocks else []))


def compare(resid: torch.Tensor, lens: FittedLens, unembed: Callable[[torch.Tensor], torch.Tensor]) -> LensCheck:
    """``resid [n_layers + 1, pos, d_model]``: every residual row of one text (row 0 ``embed``, the last the last
    block's output); ``lens``: a :class:`~anatomy_cli.engine.fitted_lens.FittedLens` (its ``rows`` and
    ``transform``); ``unembed``: ``h [pos, d_model] -> logits [pos, vocab]``."""
    import torch


    mapped = lens.transform(resid)

    def logp(h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(unembed(h).detach().to("cpu", torch.float64), dim=-1)

    final = logp(resid[-1])
    p = final.exp()

    def kl(h: torch.Tensor) -> float:
        return float((p * (final - logp(h))).sum(-1).clamp_min(0.0).mean())

    fitted = [(row, i) for i, row in enumerate(lens.rows) if row < resid.shape[0] - 1]
    return LensCheck(reads=tuple(residual_label(r) for r, _ in fitted),
                     kl_fitted=tuple(kl(mapped[i]) for _, i in fitted),
                     kl_logit=tuple(kl(resid[r]) for r, _ in fitted), tokens=int(resid.shape[1]))


def pooled(checks: Sequence[LensCheck]) -> LensCheck:
    """Several texts' checks of one lens as one: each row's KLs averaged over every position of them."""
    tokens = sum(c.tokens for c in checks)

    def mean(values: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
        return tuple(sum(v[i] * c.tokens for v, c in zip(values, checks)) / tokens for i in range(len(values[0])))

    return LensCheck(checks[0].reads, mean([c.kl_fitted for c in checks]), mean([c.kl_logit for c in checks]), tokens)
