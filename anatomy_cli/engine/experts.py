"""The experts of a mixture-of-experts block, from their own weights: each chosen expert's output, and the
block's output rebuilt from them (``mlp_out = Σ_k weight_k · expert_k(x) (+ gate · shared expert)``), what
``verify``'s MoE identity and the tests check against ``hook_mlp_out``. The router's hook points and the routing
rule are :mod:`anatomy_cli.engine.moe`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING
from typing import cast

import torch

from anatomy_cli.engine.hooks import HookFn
from anatomy_cli.engine.hooks import attach_modules
from anatomy_cli.engine.moe import point_names
from anatomy_cli.engine.running import run
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel
    from anatomy_cli.engine.model import Side
    from anatomy_cli.text.tokenization import Encoded


def expert_outputs(lm: LoadedModel, block: int, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Each chosen expert's output, unweighted: ``[..., k, d_model]`` for the MoE block's input ``x``
    ``[..., d_model]`` and ``indices`` ``[..., k]``, from the experts' own weights (``gate_up_proj``,
    ``down_proj``, ``act_fn``: ``down · (act(gate · x) * up · x)``)."""
    experts = _moe_block(lm, block).get_submodule("experts")
    gate_up = cast(torch.Tensor, experts.gate_up_proj)[indices]  # [..., k, 2f, d]
    h = torch.einsum("...kfd,...d->...kf", gate_up.to(x.dtype), x)
    gate, up = h.chunk(2, dim=-1)
    down = cast(torch.Tensor, experts.down_proj)[indices].to(x.dtype)  # [..., k, d, f]
    act = cast(Callable[[torch.Tensor], torch.Tensor], experts.act_fn)
    return torch.einsum("...kdf,...kf->...kd", down, act(gate) * up)


def reconstruct(lm: LoadedModel, block: int, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
                shared: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None) -> torch.Tensor:
    """``Σ_k weights_k · expert_{indices_k}(x)`` (+ ``shared_gate · shared``): the block's output rebuilt,
    ``[..., d_model]``, in float64."""
    out = (weights.double()[..., None] * expert_outputs(lm, block, x, indices).double()).sum(dim=-2)
    if shared is not None and shared_gate is not None:
        out = out + shared_gate.double() * shared.double()
    return out


def rebuild(lm: LoadedModel, enc: Encoded) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One forward of the prompt ``enc``; per MoE block ``(rebuilt, mlp_out)`` ``[pos, d_model]``: the block's output
    rebuilt by :func:`reconstruct` from its input and its hook points, and ``hook_mlp_out`` itself."""
    moe = lm.info.moe
    if moe is None:
        raise UsageError(f"{lm.name} is not a mixture-of-experts model")
    inputs: dict[int, torch.Tensor] = {}

    def keep(block: int, t: torch.Tensor) -> None:
        inputs[block] = t.detach().clone()

    hooks: list[tuple[torch.nn.Module, Side, HookFn]] = [(_moe_block(lm, b), "input", partial(keep, b))
                                                        for b in moe.sparse_blocks]

    names = [n for b in moe.sparse_blocks for n in [*point_names(moe, b), sites.name(b, sites.Point.mlp_out)]]
    with attach_modules(hooks):
        [cache] = run(lm, [enc], names, batch_size=1)
    out = {}
    with torch.inference_mode():
        for b in moe.sparse_blocks:
            shared = ((cache["shared_expert_out", b], cache["shared_expert_gate", b]) if moe.shared_expert
                      else (None, None))
            out[b] = (reconstruct(lm, b, inputs[b][0].to(lm.device), cache["expert_indices", b],
                                  cache["expert_weights", b], *shared), cache["mlp_out", b])
    return out


def _moe_block(lm: LoadedModel, block: int) -> torch.nn.Module:
    moe = lm.info.moe
    if moe is None or block not in moe.sparse_blocks:
        raise UsageError(f"block {block} of {lm.name} is not a mixture-of-experts block")
    blocks = cast(torch.nn.ModuleList, lm.model.base_model.get_submodule(lm.adapter.blocks))
    return blocks[block].get_submodule(lm.adapter.mlp_out.module)
