"""Knocking out one routed expert of a mixture-of-experts block, for the interventions core (``ablate --experts``).

Both modes edit what the block's router (its ``gate`` module, :mod:`anatomy_cli.engine.moe`) hands to its
experts: the gate of every family run here returns ``(router_logits, weights, indices)``, flat
``[batch * pos, …]``, and the block calls ``experts(x, indices, weights)``. A forward hook on the gate replaces
that triple for the batch rows that knock an expert out, at every position:

* ``reroute``: expert e's router logit set to −inf, then the family's rule as usual (:func:`moe.route`: softmax
  over the experts left, top k, the family's normalisation), so e is never chosen and the k-th best expert
  takes its place;
* ``zero``: e's weight set to 0 wherever it was chosen; the other weights and the choice are left unchanged,
  so the block's output loses ``weight_e · expert_e(x)`` and nothing else.

Qwen2-MoE's shared expert is no routed expert: it has no index and is never knocked out here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING
from typing import Literal

import torch

from anatomy_cli.engine.hooks import RawHookFn
from anatomy_cli.engine.moe import route
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel
    from anatomy_cli.engine.model import Side
    from anatomy_cli.models.info import MoeInfo

ExpertMode = Literal["reroute", "zero"]
MODES: tuple[ExpertMode, ...] = ("reroute", "zero")


@dataclass(frozen=True)
class ExpertEdit:
    """Expert ``expert`` of MoE block ``layer`` knocked out at every position (``mode``: see the module)."""

    layer: int
    expert: int
    mode: ExpertMode = "reroute"

    def point(self) -> str:
        """The hook point whose module (the router) the edit hooks."""
        return sites.name(self.layer, sites.Point.router_logits)


def check(lm: LoadedModel, edit: ExpertEdit) -> None:
    """Raise UsageError for an expert edit ``lm`` cannot do (a dense model or block, an expert out of range)."""
    moe = lm.info.moe
    if edit.mode not in MODES:
        raise UsageError(f"unknown expert ablation mode '{edit.mode}'; use {' or '.join(MODES)}")
    if moe is None or edit.layer not in moe.sparse_blocks:
        raise UsageError(f"block {edit.layer} of {lm.name} is not a mixture-of-experts block")
    if not 0 <= edit.expert < moe.n_experts:
        raise UsageError(f"expert {edit.expert} is out of range: {lm.name} has experts 0..{moe.n_experts - 1}")


def rows(lm: LoadedModel, blocks: Sequence[int], mode: ExpertMode) -> list[tuple[int, str, int, list[ExpertEdit]]]:
    """One row per (MoE block, routed expert): ``[(block, "expert", expert, [edit])]``, block then expert order."""
    moe = lm.info.moe
    assert moe is not None  # the task refused a dense model
    return [(b, "expert", e, [ExpertEdit(b, e, mode)]) for b in blocks for e in range(moe.n_experts)]


def hooks(lm: LoadedModel, edits: Sequence[tuple[int, ExpertEdit]],
          n_tokens: int) -> list[tuple[torch.nn.Module, Side, RawHookFn]]:
    """Raw output hooks (``attach_modules(raw=True)``) on the routers, one per block, applying each
    ``(batch row, edit)``; ``n_tokens``: the prompt's positions (every batch row has them all, no padding)."""
    moe = lm.info.moe
    if moe is None or not edits:
        return []
    by_block: dict[int, list[tuple[int, ExpertEdit]]] = {}
    for row, edit in edits:
        by_block.setdefault(edit.layer, []).append((row, edit))
    return [(lm.points[block_edits[0][1].point()][0], "output", partial(_edit, moe, block_edits, n_tokens))
            for block_edits in by_block.values()]


def _edit(moe: MoeInfo, edits: list[tuple[int, ExpertEdit]], n_tokens: int, value: object) -> object:
    """The router's ``(logits, weights, indices)`` (flat ``[batch * pos, …]``) with ``edits`` applied."""
    if not (isinstance(value, tuple) and len(value) == 3):
        raise TypeError(f"the router returned {type(value).__name__}, not (logits, weights, indices)")
    logits, weights, indices = (t.reshape(-1, n_tokens, t.shape[-1]).clone() for t in value)
    for row, edit in edits:
        if edit.mode == "reroute":
            logits[row, :, edit.expert] = float("-inf")
            w, i = route(logits[row], moe)
            weights[row], indices[row] = w.to(weights.dtype), i
        else:
            weights[row] = weights[row].masked_fill(indices[row] == edit.expert, 0)
    return tuple(t.reshape(-1, t.shape[-1]) for t in (logits, weights, indices))
