"""Inside a mixture-of-experts block: the router's hook points, the family's routing rule, the experts' outputs.

An MoE block (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE in transformers v5) computes its router logits in its
``gate`` module (``F.linear`` of the flattened ``[batch * pos, d_model]`` input), turns them into the chosen
experts and their weights (:func:`route`: softmax over every expert, top k, the family's normalisation), runs
``experts(x, indices, weights)`` and, in Qwen2-MoE, adds ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``.

Hook points of an MoE block ``L`` (only blocks in ``info.moe.sparse_blocks``); all but ``mlp.hook_in`` are
read-only:

* ``blocks.L.mlp.hook_in`` ``[batch, pos, d_model]``: the MoE block's input (the post-attention norm's output),
  what the router and every expert read;
* ``blocks.L.mlp.hook_router_logits`` ``[batch, pos, n_experts]``: the gate module's output;
* ``blocks.L.mlp.hook_expert_indices`` ``[batch, pos, k]`` (int64) and ``blocks.L.mlp.hook_expert_weights``
  ``[batch, pos, k]``: computed from the router logits by :func:`route`, the rule the block applies, in
  descending weight order (what ``experts`` receives; tests check the two are equal);
* ``blocks.L.mlp.hook_shared_expert_out`` ``[batch, pos, d_model]`` (Qwen2-MoE): the shared expert's output
  before its gate; ``blocks.L.mlp.hook_shared_expert_gate`` ``[batch, pos, 1]``: the gate, ``sigmoid`` of
  ``shared_expert_gate``'s output. The block adds ``gate * shared_expert_out``.

So ``hook_mlp_out = Σ_k weights_k · expert_{indices_k}(x) (+ gate · shared_expert_out)`` with ``x`` the MoE
block's input (:mod:`anatomy_cli.engine.experts`; tested on each family, and a ``verify`` identity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites

if TYPE_CHECKING:
    from anatomy_cli.models.info import MoeInfo

# point inside blocks.L. -> the module of the MoE block it reads (output side)
POINTS = dict.fromkeys(sites.ROUTER_POINTS, "gate")
SHARED_POINTS = dict(zip(sites.SHARED_EXPERT_POINTS, ("shared_expert", "shared_expert_gate")))


def point_names(moe: MoeInfo, block: int) -> list[str]:
    """The MoE hook points of ``block`` (none for a dense block), in forward order."""
    if block not in moe.sparse_blocks:
        return []
    return [sites.name(block, p) for p in [sites.Point.mlp_in, *POINTS, *(SHARED_POINTS if moe.shared_expert else ())]]


def module_paths(moe: MoeInfo) -> dict[sites.Point, str]:
    """``{point inside blocks.L.: module path inside the block}`` for this model's MoE blocks."""
    paths = {k: f"mlp.{v}" for k, v in POINTS.items()}
    if moe.shared_expert:
        paths.update({k: f"mlp.{v}" for k, v in SHARED_POINTS.items()})
    return paths


def kind(name: str) -> str | None:
    """``router_logits``, ``expert_indices``, ... for an MoE hook point ``blocks.L.mlp.hook_…``, else None."""
    parsed = sites.parse(name)
    if parsed is not None and (parsed[1] in POINTS or parsed[1] in SHARED_POINTS):
        return parsed[1].name
    return None


def route(logits: torch.Tensor, moe: MoeInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, indices)`` ``[..., k]`` from router logits ``[..., n_experts]``, exactly as the block does.

    The one place the families' rules live (``moe.rule``, decided from the config in
    :class:`~anatomy_cli.models.info.MoeInfo`): softmax in float32 over every expert, top k (descending),
    then ``renormalize`` (Mixtral): divided by their sum, kept in float32; ``norm_topk_prob`` (Qwen2-MoE,
    Qwen3-MoE, OLMoE): divided by their sum only when the config's ``norm_topk_prob`` is set, then cast to the
    logits' dtype.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    top, indices = torch.topk(probs, moe.top_k, dim=-1)
    if moe.rule == "renormalize":
        return top / top.sum(dim=-1, keepdim=True), indices
    if moe.rule == "norm_topk_prob":
        if moe.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), indices
    raise ValueError(f"unknown routing rule {moe.rule!r}")


def view(moe: MoeInfo, name: str, t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """What MoE hook point ``name`` holds, from its module's output ``t`` (flat ``[batch * pos, …]``), given
    the block's ``[batch, pos]``."""
    what = kind(name)
    t = t.reshape(*shape, t.shape[-1])
    if what == "expert_indices":
        return route(t, moe)[1]
    if what == "expert_weights":
        return route(t, moe)[0]
    if what == "shared_expert_gate":
        return torch.sigmoid(t)
    return t


def read_only(name: str) -> UsageError:
    return UsageError(f"{name} is read-only: a hook there cannot replace the routing (hook "
                      f"{sites.name('N', sites.Point.mlp_out)} to change what the block adds)")
