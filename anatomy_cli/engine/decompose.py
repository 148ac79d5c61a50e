"""The final residual as a sum of its parts, and the LM head as one direction: what a direct logit
attribution needs from the model (after TransformerLens's ``decompose_resid`` and ``stack_head_results``).

In a pre-norm model the final residual ``h_L`` (``blocks.{L-1}.hook_resid_post``) is the embedding
(``blocks.0.hook_resid_pre``: token embedding, or token + position embedding) plus every block's
``hook_attn_out`` and ``hook_mlp_out``. Per head, block l's attention output is each head's slice of the
output projection's input (``attn.hook_z``) through that projection, plus the projection's bias.
:func:`decompose_resid` returns those parts from a :class:`~anatomy_cli.engine.cache.Cache` and checks that
they add up; :func:`unembedding_direction` the LM head's row for a target (minus a foil's) and its bias.
The reduction through the frozen final norm is :mod:`anatomy_cli.analyses.dla`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from anatomy_cli.engine.cache import Cache
from anatomy_cli.engine.experts import expert_outputs
from anatomy_cli.engine.hooks import layer_names
from anatomy_cli.engine.hooks import residual_names
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.moe import point_names
from anatomy_cli.engine.tensors import first_tensor
from anatomy_cli.engine.tensors import optional_module
from anatomy_cli.errors import AnatomyError
from anatomy_cli.models import sites
from anatomy_cli.models.adapters import heads_split

# The residual stream and the heads must add up to this relative precision (fp32 rounding is ~1e-6).
SUM_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Component:
    """One part's name: ``embed``, ``pos_embed``, ``L3.attn``, ``L3.mlp``, ``L3.H5``, ``L3.attn_bias``, ``bias``.

    ``layer`` is the block index (``blocks.{layer}.*``, 0-based), None for the embeddings and
    the final bias; ``head`` the head index for a head row.
    """

    name: str
    layer: int | None = None
    head: int | None = None


@dataclass(frozen=True)
class Decomposition:
    """The final residual at one position and its parts.

    ``components``: float64 ``[n, d_model]`` on the CPU, adding up to ``final``; ``names``: one
    :class:`Component` per row; ``final``: ``[d_model]``, the final residual (model dtype, ``lm.device``);
    ``head_norm``: per head, the block's norm after the attention output projection (Gemma 2/3's
    ``post_attention_layernorm``) whose scale each head's share was taken through, frozen at its value on
    this prompt; None when there is none.
    """

    components: torch.Tensor
    names: tuple[Component, ...]
    final: torch.Tensor
    head_norm: str | None = None  # per head: the norm after attention whose scale was frozen (Gemma 2/3)


@dataclass(frozen=True)
class FrozenNorm:
    """A final norm with its scale frozen: ``x -> gain * P(x)`` (no bias), and its bias.

    ``centred``: P subtracts each vector's mean (LayerNorm) or not (RMSNorm, or no norm).
    ``gain``: float64 [d_model], the norm's weight divided by ``scale``. ``scale``: the final
    residual's standard deviation (LayerNorm) or RMS (RMSNorm), eps included. ``bias``: float64
    [d_model], the norm's bias (zeros for RMSNorm).
    """

    centred: bool
    gain: torch.Tensor
    bias: torch.Tensor
    scale: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., d_model]`` -> float64 ``[..., d_model]``: the frozen, bias-free norm."""
        x = x.to(torch.float64)
        if self.centred:
            x = x - x.mean(-1, keepdim=True)
        return x * self.gain


def freeze_norm(norm: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, what: str = "the final norm"
                ) -> FrozenNorm:
    """A norm ``norm`` (``[n, d] -> [n, d]``: ``engine.final_norm``; Gemma 2/3's norm after attention) frozen at
    its input ``h [d_model]``; ``what`` names it in the error.

    The norm is treated as a black box of the form ``gain * P(x) / s(x) + beta`` (LayerNorm, RMSNorm,
    Gemma's ``1 + weight``, no norm at all) and read from four probes: ``beta = norm(0)``; the norm
    centres when ``norm(v + 3) == norm(v)``; ``gain`` from ``norm(v)`` with v = +-1 (mean 0, RMS 1);
    ``s`` by least squares from ``norm(h)``. Raises AnatomyError when ``norm(h)`` is not of that form.
    """
    d = h.shape[-1]
    v = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat((d + 1) // 2)[:d]
    v = v - v.mean()
    v = v / v.pow(2).mean().sqrt()
    probes = torch.stack([torch.zeros(d, dtype=torch.float64), v, v + 3.0, h.to(torch.float64)])
    out = norm(probes.to(h.dtype)).detach().to(torch.float64)
    beta, at_v, at_shifted, at_h = out
    centred = bool(torch.allclose(at_v, at_shifted, rtol=1e-3, atol=1e-3 * float(at_v.abs().max())))
    gain = (at_v - beta) / v                  # up to the factor 1 / sqrt(1 + eps), which s absorbs
    hp = h.to(torch.float64)
    if centred:
        hp = hp - hp.mean()
    a, b = gain * hp, at_h - beta
    scale = float(a @ a / (a @ b))
    if not math.isfinite(scale) or float((b - a / scale).norm()) > SUM_TOLERANCE * float(b.norm()):
        raise AnatomyError(f"{what} is not a LayerNorm or RMSNorm (gain * (x - mean) / scale + bias): "
                           "its scale cannot be frozen for direct logit attribution")
    return FrozenNorm(centred=centred, gain=gain / scale, bias=beta, scale=scale)


def names(lm: LoadedModel, *, by_head: bool = False, by_expert: bool = False) -> list[str]:
    """The hook points :func:`decompose_resid` reads: the embedding, every attention and MLP output, the final
    residual, the position embedding where there is one, with ``by_head`` every ``attn.hook_z``, and with
    ``by_expert`` every MoE block's input, chosen experts, weights (and shared expert)."""
    out = residual_names(lm)[:1] + layer_names(lm, "attn_out") + layer_names(lm, "mlp_out")
    out += residual_names(lm)[-1:]
    if sites.Whole.pos_embed in lm.points:
        out.append(sites.Whole.pos_embed.value)
    if by_head:
        out += sites.names(range(lm.n_layers), sites.Point.attn_z)
    if by_expert and lm.info.moe is not None:
        out += [n for b in lm.info.moe.sparse_blocks for n in point_names(lm.info.moe, b)
                if not sites.is_point(n, sites.Point.router_logits)]
    return out


def head_outputs(z: torch.Tensor, project: torch.nn.Module, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's output: the attention output projection applied to that head's slice of its input.

    ``z``: float [n_heads * d_head], the projection's input at one position (``attn.hook_z``);
    ``project``: the projection (``[n, n_heads * d_head] -> [n, d_model]``, e.g. the ``o_proj``
    module; any layout of its weight, GPT-2's Conv1D included). Returns ``(heads, bias)``: float64
    [n_heads, d_model], each head's slice alone through the projection minus its bias, and float64
    [d_model], the projection of zeros (its bias). ``heads.sum(0) + bias`` is the projection of z.
    """
    d_head = z.shape[-1] // n_heads
    rows = z.new_zeros(n_heads + 1, z.shape[-1])
    for h in range(n_heads):
        rows[h, h * d_head:(h + 1) * d_head] = z[h * d_head:(h + 1) * d_head]
    with torch.inference_mode():
        out = project(rows)
    out = (out[0] if isinstance(out, tuple) else out).to("cpu", torch.float64)
    return out[:-1] - out[-1], out[-1]


def check_sum(parts: torch.Tensor, whole: torch.Tensor, what: str) -> None:
    """Raise AnatomyError unless ``parts [n, d]`` add up to ``whole [d]`` within :data:`SUM_TOLERANCE`."""
    diff = float((parts.to(torch.float64).sum(0) - whole.to(torch.float64)).norm())
    if diff > SUM_TOLERANCE * max(float(whole.to(torch.float64).norm()), 1e-12):
        raise AnatomyError(f"{what} (relative difference {diff / float(whole.norm()):.1e}); "
                           "direct logit attribution needs that sum")


def decompose_resid(lm: LoadedModel, cache: Cache, *, by_head: bool = False, by_expert: bool = False,
                    row: int = 0) -> Decomposition:
    """The final residual at the cache's kept position ``row`` (default the first) as a sum of parts.

    Parts, in model order: ``embed`` (the token embedding; with a learned position embedding, ``embed`` and
    ``pos_embed``), then per block ``L{l}.attn`` (``by_head``: ``L{l}.H{h}`` per head, and ``L{l}.attn_bias``
    when the output projection has a bias) and ``L{l}.mlp`` (``by_expert``, in an MoE block: ``L{l}.E{e}`` per
    chosen expert e, heaviest first, its output times its weight, and ``L{l}.shared_expert``, the gated shared
    expert, where there is one). The cache needs :func:`names` (with the same flags). Raises
    AnatomyError when the heads do not add up to the attention output or the parts to the final residual
    (a norm after each sub-layer: post-LN, sandwich norms).
    """
    comps, labels = [], []
    head_norm = lm.adapter.attn_out.module if by_head and heads_split(lm.adapter) == "norm" else None
    embed = cache["resid_pre", 0][row]
    if sites.Whole.pos_embed in cache:
        pos_embed = cache[sites.Whole.pos_embed][row]
        comps += [embed - pos_embed, pos_embed]
        labels += [Component("embed"), Component("pos_embed")]
    else:
        comps.append(embed)
        labels.append(Component("embed"))
    for layer in range(lm.n_layers):
        attn = cache["attn_out", layer][row]
        if by_head:
            o_proj = lm.points[sites.name(layer, sites.Point.attn_z)][0]
            z = cache["attn_z", layer][row]
            heads, bias = head_outputs(z, o_proj, lm.n_heads)
            has_bias = getattr(o_proj, "bias", None) is not None
            if head_norm is not None:  # Gemma 2/3: attn_out = norm(o_proj(z)); each head through the frozen norm
                heads, bias, has_bias = _through_frozen_norm(lm, layer, heads, bias, z.dtype, has_bias)
            parts = torch.cat([heads, bias[None]]) if has_bias else heads
            check_sum(parts, attn, f"{lm.name}'s attention output in block {layer} is not the sum of "
                      "its heads through the output projection (a norm after attention?)")
            comps += list(parts)
            labels += [Component(f"L{layer}.H{h}", layer, h) for h in range(lm.n_heads)]
            if has_bias:
                labels.append(Component(f"L{layer}.attn_bias", layer))
        else:
            comps.append(attn)
            labels.append(Component(f"L{layer}.attn", layer))
        moe = lm.info.moe
        if by_expert and moe is not None and layer in moe.sparse_blocks:
            parts, names_ = _experts(lm, cache, layer, row)
            check_sum(parts, cache["mlp_out", layer][row], f"{lm.name}'s MoE block {layer} output is not the sum "
                      "of its weighted experts")
            comps += list(parts)
            labels += [Component(n, layer) for n in names_]
        else:
            comps.append(cache["mlp_out", layer][row])
            labels.append(Component(f"L{layer}.mlp", layer))
    final = cache["resid_post", -1][row]
    stack = torch.stack([c.to("cpu", torch.float64) for c in comps])
    check_sum(stack, final, f"{lm.name}'s final residual is not the sum of the embedding and the "
              "attention and MLP outputs (a norm after each sub-layer?)")
    return Decomposition(components=stack, names=tuple(labels), final=final, head_norm=head_norm)


def _experts(lm: LoadedModel, cache: Cache, layer: int, row: int) -> tuple[torch.Tensor, list[str]]:
    """MoE block ``layer``'s output at ``row`` as float64 ``[k (+ 1), d_model]``: each chosen expert's output
    times its weight, then the gated shared expert; and their names."""
    x, idx, w = cache["mlp_in", layer][row], cache["expert_indices", layer][row], cache["expert_weights", layer][row]
    with torch.inference_mode():
        outs = expert_outputs(lm, layer, x, idx).to("cpu", torch.float64) * w.to("cpu", torch.float64)[:, None]
    names = [f"L{layer}.E{int(e)}" for e in idx.tolist()]
    if ("shared_expert_out", layer) in cache:
        shared = cache["shared_expert_gate", layer][row].double() * cache["shared_expert_out", layer][row].double()
        outs = torch.cat([outs, shared.to("cpu")[None]])
        names.append(f"L{layer}.shared_expert")
    return outs, names


def _through_frozen_norm(lm: LoadedModel, layer: int, heads: torch.Tensor, bias: torch.Tensor,
                         dtype: torch.dtype, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Heads and bias through block ``layer``'s norm after attention, its scale frozen at its input on this
    prompt (the projection's output, ``heads.sum(0) + bias``): the heads then sum to ``attn_out`` exactly.
    The norm's own bias (LayerNorm) joins the projection's bias row."""
    norm = lm.points[sites.name(layer, sites.Point.attn_out)][0]
    x = heads.sum(0) + bias
    with torch.inference_mode():
        frozen = freeze_norm(lambda v: norm(v.to(dtype)), x.to(dtype), f"{lm.name}'s norm after attention")
    bias_row = frozen(bias) + frozen.bias
    return frozen(heads), bias_row, has_bias or bool(frozen.bias.abs().max() > 0)


def unembedding_direction(lm: LoadedModel, target: int, foil: int | None = None) -> tuple[torch.Tensor, float]:
    """The LM head as ``direction . x + bias`` on the final norm's output, for target (minus foil).

    The head (with OPT's project_out before it) is linear, so its row for a token is the gradient of
    that token's logit with respect to its input, and its bias is its output at 0. Returns
    (float64 [d_model], float). Raises AnatomyError when the head is not linear (soft-capping aside).
    """
    head = lm.points["logits"][0]
    proj = optional_module(lm.model.base_model, getattr(lm.adapter, "unembed_proj", None))
    param = next(head.parameters())
    x = torch.zeros(2, lm.d_model, dtype=param.dtype, device=param.device if param.device.type != "meta" else lm.device)
    x[1].normal_(generator=torch.Generator(device=x.device).manual_seed(0))
    x.requires_grad_(True)
    with torch.enable_grad():
        out = first_tensor(head(proj(x) if proj is not None else x))
        score = out[:, target] - (out[:, foil] if foil is not None else 0)
        (grad,) = torch.autograd.grad(score[1], x)
    direction = grad[1].detach().to("cpu", torch.float64)
    bias = float(score[0].detach())
    linear = float(direction @ x[1].detach().to("cpu", torch.float64)) + bias
    if abs(linear - float(score[1].detach())) > 1e-3 * max(1.0, abs(linear)):
        raise AnatomyError(f"{lm.name}'s LM head is not linear: its logits are not a sum of per-component terms")
    return direction, bias
