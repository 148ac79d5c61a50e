"""Fitting the Jacobian lens: jlens' estimator (Anthropic 2026, the reference ``jlens.fitting``), on anatomy's hook
points, for every model anatomy loads (a GGUF model through its dequantized weights, which have a derivative).

For one prompt of n tokens: one forward of the ids replicated ``dim_batch`` times (batch rows are independent),
the graph kept, then ``ceil(d_model / dim_batch)`` backward passes. In a pass, batch row b carries a one-hot
cotangent on output dimension ``start + b`` of the target block's raw output, at every valid position at once;
the gradient at source block l's raw output, averaged over the valid positions, is row ``start + b`` of ``J_l``.
So ``J_l[d] = mean_p Σ_{p' ∈ valid} ∂h_T[p', d] / ∂h_l[p]`` over the valid positions p (``skip_first`` through
the second-to-last): jlens' reduction, in which the same-position term dominates. The lens is the mean of ``J_l``
over prompts, written in jlens' file format (:func:`lens_state`).

The gradient at a block's output is read as :mod:`anatomy_cli.engine.gradients` reads one: the hook adds a zero
tensor that requires grad. No weight requires grad, so the backward graph starts at the earliest source block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import torch

from anatomy_cli.engine.forwarding import pad_batch
from anatomy_cli.engine.forwarding import run_batch
from anatomy_cli.engine.gradients import grad_mode
from anatomy_cli.engine.hooks import attach
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.models import sites


def valid_positions(seq_len: int, skip_first: int) -> list[int]:
    """The positions averaged over: ``skip_first`` through ``seq_len - 2`` (jlens: early positions are attention
    sinks, the last has no next-token target). Empty for a prompt of ``skip_first + 1`` tokens or fewer."""
    return list(range(skip_first, seq_len - 1))


def jacobian_for_prompt(lm: LoadedModel, ids: Sequence[int], source_layers: Sequence[int], target_layer: int, *,
                        dim_batch: int = 8, skip_first: int = 16,
                        progress: Callable[[int, int], None] | None = None) -> dict[int, torch.Tensor]:
    """``{block: J [d_model, d_model]}`` (float32, CPU) for one prompt ``ids`` (at least ``skip_first + 2``
    tokens; the caller skips shorter ones). ``progress(passes done, passes)`` after each backward pass."""
    positions = valid_positions(len(ids), skip_first)
    if not positions:
        raise ValueError(f"a prompt of {len(ids)} tokens has no valid position (skip_first {skip_first})")
    d_model = lm.info.d_model
    names = {sites.name(l, sites.Point.resid_post): l for l in source_layers}
    target = sites.name(target_layer, sites.Point.resid_post)
    deltas: dict[int, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}

    def source(layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def tap(t: torch.Tensor) -> torch.Tensor:
            delta = torch.zeros_like(t, requires_grad=True)
            deltas[layer] = delta
            return t + delta
        return tap

    def keep(t: torch.Tensor) -> None:
        out["target"] = t

    hooks = [(name, source(layer)) for name, layer in names.items()] + [(target, keep)]
    jac = {l: torch.zeros(d_model, d_model, dtype=torch.float32) for l in source_layers}
    n_passes = math.ceil(d_model / dim_batch)
    lm.model.eval()
    with grad_mode(lm), attach(lm, hooks):
        run_batch(lm, pad_batch(lm, [list(ids)] * dim_batch))
        t = out.pop("target")                                           # [dim_batch, pos, d_model]
        wrt = [deltas[l] for l in source_layers]
        where = torch.tensor(positions, device=t.device)
        rows = torch.arange(dim_batch, device=t.device)
        cotangent = torch.zeros_like(t)
        for i, start in enumerate(range(0, d_model, dim_batch)):
            n = min(dim_batch, d_model - start)
            cotangent.zero_()
            cotangent[rows[:n, None], where[None, :], start + rows[:n, None]] = 1.0
            grads = torch.autograd.grad(t, wrt, grad_outputs=cotangent, retain_graph=i < n_passes - 1,
                                        allow_unused=True)
            for l, g in zip(source_layers, grads):
                if g is not None:  # a block with no path to the target (none in a decoder) keeps zeros
                    jac[l][start:start + n] = g[:n, where.to(g.device)].float().mean(dim=1).cpu()
            del grads
            if progress is not None:
                progress(i + 1, n_passes)
        del t, wrt, cotangent
    deltas.clear()
    return jac


def accumulate(lm: LoadedModel, sums: dict[int, torch.Tensor], ids: Sequence[int], source_layers: Sequence[int],
               target_layer: int, *, dim_batch: int = 8, skip_first: int = 16,
               progress: Callable[[int, int], None] | None = None) -> bool:
    """Adds one prompt's ``J`` to ``sums`` (``{block: float64 [d_model, d_model]}``, in place) and returns True;
    False (``sums`` untouched) for a prompt too short to have a valid position."""
    if not valid_positions(len(ids), skip_first):
        return False
    jac = jacobian_for_prompt(lm, ids, source_layers, target_layer, dim_batch=dim_batch, skip_first=skip_first,
                              progress=progress)
    for b, m in jac.items():
        sums[b] += m
    return True


def block_weights(lm: LoadedModel, block: int = 0) -> float | None:
    """The multiply-accumulate weights one token meets in block ``block``: its matrices' elements (attention's
    projections and the MLP's, as the model holds them: grouped-query K/V and gated MLPs counted as they are).
    None for a mixture-of-experts model (a token meets only its experts) or a block without matrices."""
    if lm.info.moe is not None:
        return None
    module = lm.points[sites.name(block, sites.Point.resid_post)][0]
    n = sum(p.numel() for p in module.parameters() if p.dim() == 2)
    return float(n) or None


def lens_state(sums: dict[int, torch.Tensor], n_prompts: int, d_model: int,
               dtype: torch.dtype = torch.float16) -> dict[str, object]:
    """jlens' file: ``{"J": {block: mean J}, "n_prompts", "source_layers", "d_model"}`` (``torch.save`` it)."""
    return {"J": {l: (s / n_prompts).to(dtype) for l, s in sorted(sums.items())}, "n_prompts": n_prompts,
            "source_layers": sorted(sums), "d_model": d_model}


def merge_states(states: Sequence[dict[str, Any]], dtype: torch.dtype = torch.float16) -> dict[str, object]:
    """Several fits of one model and one set of source blocks as one: the ``n_prompts``-weighted mean of their
    ``J`` (float64 sums), which is the fit on all their prompts together. Raises ValueError when the states'
    ``d_model`` or blocks differ."""
    d_model, blocks = int(states[0]["d_model"]), sorted(states[0]["J"])
    for s in states[1:]:
        if int(s["d_model"]) != d_model or sorted(s["J"]) != blocks:
            raise ValueError(f"fits of different shapes: d_model {s['d_model']} and {d_model}, blocks "
                             f"{sorted(s['J'])} and {blocks}")
    total = sum(int(s["n_prompts"]) for s in states)
    sums = {b: torch.stack([s["J"][b].double() * int(s["n_prompts"]) for s in states]).sum(0) for b in blocks}
    return lens_state(sums, total, d_model, dtype)
