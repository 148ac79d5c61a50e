"""Direct logit attribution: each component's share of a target's logit at one position.

In a pre-norm model the final residual is a sum, h_L = embedding (+ position embedding) + sum over
blocks of attention output + MLP output, and the logit of token t is
``W_U[t] . norm(h_L) + b_U[t]``. With the final norm's scale frozen at its value for h_L, the norm
is linear, so the logit splits into one term per component plus a constant::

    norm(h) = gain * P(h) / s + beta          (P: subtract the mean for LayerNorm; identity for RMSNorm)
    logit_t = sum_c  W_U[t] . (gain * P(c) / s)  +  (W_U[t] . beta + b_U[t])

This is TransformerLens's ``apply_ln_to_stack`` with the final residual's scale (each LayerNorm
contribution centred). The rows add up to the model's own logit up to float rounding; the result
carries both numbers. With a foil token f, the direction is ``W_U[t] - W_U[f]`` and the rows add
up to ``logit_t - logit_f``. Per head: head h's contribution is its slice of the attention output
projection's input through that projection, ``z[h] @ W_O[:, h]^T``; the projection's bias is a row
of its own. Where a norm follows the projection (Gemma 2/3's sandwich norm), its scale is frozen at its value
on this prompt, as the final norm's is, so each head's share stays linear and the heads sum to the attention
output exactly (``head_norm``).

The parts come from :mod:`anatomy_cli.engine.decompose` (the residual decomposition, the unembedding
direction); :func:`logit_attribution` is the one call of ``dla`` and ``report``. The rest are pure functions
over tensors; float64 on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import torch

from anatomy_cli.engine import decompose
from anatomy_cli.engine import final_norm
from anatomy_cli.engine import unembed
from anatomy_cli.engine.decompose import SUM_TOLERANCE  # noqa: F401  (FrozenNorm, freeze_norm: re-exported)
from anatomy_cli.engine.decompose import Component
from anatomy_cli.engine.decompose import FrozenNorm
from anatomy_cli.engine.decompose import check_sum  # noqa: F401  (FrozenNorm, freeze_norm: re-exported)
from anatomy_cli.engine.decompose import freeze_norm
from anatomy_cli.engine.decompose import head_outputs  # noqa: F401  (FrozenNorm, freeze_norm: re-exported)

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.cache import Cache


@dataclass(frozen=True)
class Row:
    component: str
    layer: int | None
    head: int | None
    contribution: float  # logit units (natural-log odds scale of the softmax)

    def to_dict(self) -> dict[str, object]:
        return dict(vars(self))


@dataclass(frozen=True)
class Attribution:
    """The rows, their sum ``total`` and the model's own ``logit`` (or logit difference) to compare with.

    ``other_rows``: how many rows :meth:`select` summed into the final ``other`` row (0: none).
    """

    rows: tuple[Row, ...]
    total: float
    logit: float
    norm_scale: float
    centred: bool
    other_rows: int = 0
    head_norm: str | None = None  # per head: the norm after attention frozen at this prompt (Gemma 2/3)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "total": self.total, "logit": self.logit,
                "norm_scale": self.norm_scale, "centred": self.centred, "other_rows": self.other_rows,
                "head_norm_frozen": self.head_norm}

    def mismatch(self) -> str | None:
        """A warning when the rows and the model's logit are more than 1e-4 (relative) apart, else None."""
        if abs(self.total - self.logit) > 1e-4 * max(abs(self.logit), 1.0):
            return (f"the rows add up to {self.total:.6g}, the model's logit is {self.logit:.6g}: "
                    "more than 1e-4 apart")
        return None

    def select(self, top: int | None = None, sort: str = "model") -> Attribution:
        """The rows in ``sort`` order, only the ``top`` largest by |contribution| plus one ``other`` row.

        ``sort``: ``model`` (embedding, blocks in order, bias), ``abs`` (largest |contribution| first) or
        ``value`` (most positive first). ``top``: keep that many rows (ties: model order) and sum the rest
        into a last row ``other`` (layer and head None), so the rows still add up to ``total``.
        Raises ValueError for an unknown ``sort`` or ``top`` < 1.
        """
        keys: dict[str, Callable[[Row], float] | None]
        keys = {"model": None, "abs": lambda r: -abs(r.contribution), "value": lambda r: -r.contribution}
        if sort not in keys:
            raise ValueError(f"sort must be one of {', '.join(keys)}, got {sort!r}")
        if top is not None and top < 1:
            raise ValueError(f"top must be at least 1, got {top}")
        rows = list(self.rows)
        rest: list[Row] = []
        if top is not None and top < len(rows):
            largest = sorted(range(len(rows)), key=lambda i: -abs(rows[i].contribution))[:top]
            kept = set(largest)
            rest = [r for i, r in enumerate(rows) if i not in kept]
            rows = [r for i, r in enumerate(rows) if i in kept]
        key = keys[sort]
        if key is not None:
            rows.sort(key=key)
        if rest:
            rows.append(Row("other", None, None, math.fsum(r.contribution for r in rest)))
        return Attribution(rows=tuple(rows), total=self.total, logit=self.logit, norm_scale=self.norm_scale,
                           centred=self.centred, other_rows=len(rest), head_norm=self.head_norm)


def attribute(components: torch.Tensor, names: Sequence[Component], *, norm: FrozenNorm,
              direction: torch.Tensor, head_bias: float, logit: float) -> Attribution:
    """Each component's contribution to ``direction . norm(sum of components) + head_bias``.

    Args:
        components: float [n, d_model], the vectors that add up to the final residual (check that
            with :func:`check_sum` first).
        names: one :class:`Component` per row of ``components``.
        norm: the final norm frozen at the final residual (:func:`freeze_norm`).
        direction: float [d_model], the unembedding row of the target (minus the foil's).
        head_bias: the LM head's bias for the target (minus the foil's); 0 without a bias.
        logit: the model's own logit (or logit difference), reported next to the sum.

    Returns the rows in ``names`` order plus a final ``bias`` row (``direction . beta + head_bias``).
    """
    if components.ndim != 2 or components.shape[0] != len(names):
        raise ValueError(f"components must be [{len(names)}, d_model], got {list(components.shape)}")
    u = direction.to("cpu", torch.float64)
    values = (norm(components.to("cpu")) @ u).tolist()
    bias = float(norm.bias @ u) + float(head_bias)
    rows = tuple(Row(n.name, n.layer, n.head, v) for n, v in zip(names, values)) + (Row("bias", None, None, bias),)
    return Attribution(rows=rows, total=math.fsum(values + [bias]), logit=float(logit), norm_scale=norm.scale,
                       centred=norm.centred)


def logit_attribution(lm: LoadedModel, cache: Cache, target: int, foil: int | None = None, *, by_head: bool = False,
                      by_expert: bool = False, row: int = 0,
                      unembedding: tuple[torch.Tensor, float] | None = None) -> Attribution:
    """Direct logit attribution of ``target`` (minus ``foil``) at the cache's kept position ``row``.

    ``lm``: a LoadedModel; ``cache``: an engine Cache with :func:`anatomy_cli.engine.decompose.names`
    (``by_head``: one row per head instead of per attention layer; ``by_expert``: in each MoE block one row per
    chosen expert and the shared expert instead of the block's MLP row). ``unembedding``: the
    :func:`~anatomy_cli.engine.decompose.unembedding_direction` of target and foil when already computed
    (several prompts). The final norm is frozen at the final residual; ``logit`` is the model's own head
    output there before any soft-capping. Raises AnatomyError when the parts do not add up or the head or
    the final norm is not of the linear form the attribution needs.
    """

    parts = decompose.decompose_resid(lm, cache, by_head=by_head, by_expert=by_expert, row=row)
    direction, head_bias = unembedding or decompose.unembedding_direction(lm, target, foil)
    norm = freeze_norm(lambda h: final_norm(lm, h), parts.final)
    logit = unembed(lm, parts.final[None], softcap=False)[0]
    own = float(logit[target]) - (float(logit[foil]) if foil is not None else 0.0)
    result = attribute(parts.components, parts.names, norm=norm, direction=direction, head_bias=head_bias, logit=own)
    return dataclasses.replace(result, head_norm=parts.head_norm)

