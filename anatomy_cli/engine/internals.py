"""Hook points inside the attention, the MLP and the norms: TransformerLens' internals (models/sites.py
``INTERNALS``), in TransformerLens' shapes.

* ``ln1.hook_scale`` / ``ln2.hook_scale`` ``[batch, pos, 1]``: the pre-attention / pre-MLP norm's divisor
  ``sqrt(mean(x²) + eps)`` (a LayerNorm's: of ``x - mean``), computed from the norm's input in float32 with the
  norm's own epsilon; read-only.
* ``attn.hook_q`` ``[batch, pos, head, d_head]``, ``attn.hook_k`` / ``attn.hook_v`` ``[batch, pos, kv_head,
  d_head]`` (grouped-query attention keeps its key/value heads, as TransformerLens does). In rotary models
  ``hook_q``/``hook_k`` are the query/key projections' outputs, before RoPE (where the family has separate
  projections), and ``attn.hook_rot_q``/``attn.hook_rot_k`` the same after RoPE: what the scores are computed
  from (Gemma 3: after its q/k norms too). With a KV cache (``generate``), ``hook_k``/``hook_v``/``hook_rot_k``
  hold the cached positions too.
* ``attn.hook_attn_scores`` ``[batch, head, query_pos, key_pos]``: ``q·k · scaling`` (soft-capped where the family
  caps, Gemma 2), masked positions −inf; ``attn.hook_pattern``: its softmax (a row with every key masked: 0).

The projections' points are their modules' outputs seen per head (a hook's tensor is reshaped back). The rest
pass through :class:`HookPoint` modules that the engine's attention function calls: while one of them is hooked
(:func:`implementation`), the model runs that function (registered with transformers' ``AttentionInterface``),
which hands the queries, keys and values through their points to the model's own attention (sdpa, or eager), or,
where the scores or the pattern are hooked, computes them itself, eagerly. Families whose attention predates
transformers' interface (Falcon) have none of these attention points.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import cast

import torch

from anatomy_cli.engine import norm_gain
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.model import Side
from anatomy_cli.engine.tensors import optional_module
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.adapters import Adapter

P = sites.Point
CHILD = "anatomy_points"
"""The attention module's child that holds its :class:`HookPoint` modules (no parameters: no checkpoint key)."""
IMPLEMENTATIONS = {"sdpa": "anatomy_sdpa", "eager": "anatomy_eager"}
"""The attention implementation a model runs under → the engine's function around it, by its registered name."""
HookFn = Callable[[torch.Tensor], "torch.Tensor | None"]
AttentionFn = Callable[..., tuple[torch.Tensor, object]]
"""transformers' attention function: ``(module, query, key, value, mask, **kwargs) -> (output, weights)``."""
Where = tuple[torch.nn.Module, Side]


class HookPoint(torch.nn.Module):
    """An identity the engine's attention function passes an activation through, so that a hook can read and
    replace it (TransformerLens' ``HookPoint``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def interface_module(attn: torch.nn.Module) -> torch.nn.Module | None:
    """The module under ``attn`` (itself included) whose forward calls transformers' ``AttentionInterface``, the
    one whose attention function gets the queries, keys and values; None where the family's attention predates
    it."""
    for module in attn.modules():
        forward = inspect.unwrap(type(module).forward)
        if "ALL_ATTENTION_FUNCTIONS" in getattr(forward, "__code__", compile("", "", "exec")).co_names:
            return module
    return None


def block_points(block: torch.nn.Module, adapter: Adapter) -> dict[P, Where]:
    """The internals of one block that its modules expose, ``{point: (module, side)}``. Gives the interface
    module its :class:`HookPoint` child."""
    out: dict[P, Where] = {}
    ln1 = None if adapter.post_ln or adapter.norms[0] == adapter.attn_out.module else adapter.norms[0]
    _add(out, P.ln1_scale, optional_module(block, ln1), "input")
    core = interface_module(block.get_submodule(adapter.attn[0]))
    if core is not None:
        rotary = adapter.pos_embed is None
        projections = adapter.qk_proj if rotary else None
        q, k = (optional_module(block, p) for p in projections) if projections else (None, None)
        _add(out, P.attn_q, q, "output")
        _add(out, P.attn_k, k, "output")
        inside = [P.attn_v, *((P.attn_rot_q, P.attn_rot_k) if rotary else (P.attn_q, P.attn_k)), *sites.PATTERNS]
        points = _points(core) or torch.nn.ModuleDict({p.name: HookPoint() for p in inside if p not in out})
        core.add_module(CHILD, points)
        out.update({p: (points[p.name], "output") for p in sites.ATTENTION_INTERNALS if p.name in points})
    mid = adapter.resid_mid
    pre_mlp = mid.module if mid and mid.side == "input" and mid.module in adapter.norms and not mid.flat else None
    _add(out, P.ln2_scale, None if adapter.post_ln else optional_module(block, pre_mlp), "input")
    _add(out, P.mlp_pre, optional_module(block, adapter.mlp_pre), "output")
    _add(out, P.mlp_post, optional_module(block, adapter.mlp_post), "input")
    return out


def _points(module: torch.nn.Module) -> torch.nn.ModuleDict | None:
    """The :class:`HookPoint` modules an attention module was given (:func:`block_points`), or None."""
    points = getattr(module, CHILD, None)
    return points if isinstance(points, torch.nn.ModuleDict) else None


def _add(out: dict[P, Where], point: P, module: torch.nn.Module | None, side: Side) -> None:
    if module is not None:
        out[point] = (module, side)


def views(lm: LoadedModel, pairs: list[tuple[str, HookFn]]) -> list[tuple[str, HookFn]]:
    """Each hook function at an internal point made to see the point's shape: a projection's output per head
    (what it returns reshaped back), a norm's divisor from its input (read-only)."""
    out = []
    for name, fn in pairs:
        parsed = sites.parse(name)
        point = None if parsed is None else parsed[1]
        module = lm.points[name][0]
        if point in (P.ln1_scale, P.ln2_scale):
            param = next(lm.model.parameters())
            centre = norm_gain.centred(module, lm.d_model, param.device, param.dtype)
            fn = partial(_scale_view, name, fn, centre, norm_gain.eps(module))
        elif point in (P.attn_q, P.attn_k) and not isinstance(module, HookPoint):
            fn = partial(_heads_view, fn, lm.d_head)
        out.append((name, fn))
    return out


def scale(x: torch.Tensor, centre: bool, epsilon: float) -> torch.Tensor:
    """A norm's divisor of its input ``x [..., d]``: ``sqrt(mean(x²) + eps)`` (``centre``: of ``x - mean``),
    ``[..., 1]``, computed in float32, in ``x``'s dtype."""
    xf = x.float()
    if centre:
        xf = xf - xf.mean(-1, keepdim=True)
    return (xf.pow(2).mean(-1, keepdim=True) + epsilon).sqrt().to(x.dtype)


def _scale_view(name: str, fn: HookFn, centre: bool, epsilon: float, x: torch.Tensor) -> None:
    if fn(scale(x, centre, epsilon)) is not None:
        raise UsageError(f"{name} is read-only: a hook there may read the norm's scale, not replace it")


def _heads_view(fn: HookFn, d_head: int, t: torch.Tensor) -> torch.Tensor | None:
    new = fn(t.view(*t.shape[:-1], -1, d_head))
    return None if new is None else new.reshape(t.shape)


@contextmanager
def implementation(lm: LoadedModel, names: Iterable[str]) -> Iterator[None]:
    """Inside the block ``lm.model`` runs the engine's attention function around its own, when one of ``names``
    is a :class:`HookPoint` (the eager one when it is the scores or the pattern); every config is restored on
    exit, also when the block raises."""
    hooked = [sites.parse(n) for n in names if isinstance(lm.points[n][0], HookPoint)]
    if not hooked:
        yield
        return
    _register()
    base = lm.model.config._attn_implementation.removeprefix("anatomy_")
    eager = base not in IMPLEMENTATIONS or any(p is not None and p[1] in sites.PATTERNS for p in hooked)
    with attention_implementation(lm.model, IMPLEMENTATIONS["eager" if eager else base]):
        yield


@contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """``model`` and every sub-model's config set to the attention implementation ``name`` inside the block (read
    at every forward); each restored exactly on exit, also when the block raises."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")
               and hasattr(m.config, "_attn_implementation_internal")}
    saved = {key: cfg._attn_implementation_internal for key, cfg in configs.items()}
    try:
        for cfg in configs.values():
            cfg._attn_implementation_internal = name
        yield
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation_internal = saved[key]


_registered: list[bool] = []


def _register() -> None:
    """The engine's attention functions and their masks (sdpa's, eager's) registered with transformers, once."""
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.masking_utils import eager_mask
    from transformers.masking_utils import sdpa_mask

    for base, name in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, partial(_attend, base=base))
        AttentionMaskInterface.register(name, sdpa_mask if base == "sdpa" else eager_mask)
    _registered.append(True)


def _attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            mask: torch.Tensor | None, *args: object, base: str, **kwargs: object) -> tuple[torch.Tensor, object]:
    """transformers' attention function (``[batch, head, pos, d_head]`` in): queries, keys and values through
    their points, then the model's own attention ``base``, or the eager computation where the scores or the
    pattern are hooked."""
    points = _points(module)
    if points is None:
        return _base(module, base)(module, query, key, value, mask, *args, **kwargs)

    def through(point: P, t: torch.Tensor) -> torch.Tensor:
        return points[point.name](t.transpose(1, 2)).transpose(1, 2) if point.name in points else t

    query = through(P.attn_q, through(P.attn_rot_q, query))
    key = through(P.attn_k, through(P.attn_rot_k, key))
    value = through(P.attn_v, value)
    if not any(points[p.name]._forward_hooks for p in sites.PATTERNS):
        return _base(module, base)(module, query, key, value, mask, *args, **kwargs)
    return eager(module, query, key, value, mask, points=points, **kwargs)


def _base(module: torch.nn.Module, base: str) -> AttentionFn:
    """The model's own attention function: sdpa's, or its family's eager one (else :func:`eager`)."""
    if base == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return cast(AttentionFn, ALL_ATTENTION_FUNCTIONS["sdpa"])
    own = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    return cast(AttentionFn, own) if callable(own) else eager


def eager(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          mask: torch.Tensor | None, *, points: torch.nn.ModuleDict | None = None,
          **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention computed eagerly, the scores and the pattern through their points (``points``): ``[batch, head,
    pos, d_head]`` queries, ``[batch, kv_head, pos, d_head]`` keys and values; returns the output ``[batch, pos,
    head, d_head]`` and the pattern. ``mask``: sdpa's (bool, True where a key is seen) or eager's (additive).
    ``kwargs``: the family's ``scaling`` (default ``module.scaling``, else ``d_head ** -0.5``) and ``softcap``."""
    scaling, softcap = kwargs.get("scaling"), kwargs.get("softcap")
    if kwargs.get("s_aux") is not None:
        raise AnatomyError("attention sinks are not supported by the engine's attention scores and pattern points")
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    default = float(getattr(module, "scaling", query.shape[-1] ** -0.5))
    factor = scaling if isinstance(scaling, (int, float)) else default
    scores = torch.matmul(query, key.transpose(2, 3)) * factor
    if isinstance(softcap, (int, float)):
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        mask = mask[:, :, :, : key.shape[-2]]
        seen = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        if mask.dtype != torch.bool:
            scores = scores + mask.masked_fill(~seen, 0)
        scores = scores.masked_fill(~seen, float("-inf"))
    if points is not None:
        scores = points[P.attn_scores.name](scores)
    pattern = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(query.dtype)
    if points is not None:
        pattern = points[P.attn_pattern.name](pattern)
    return torch.matmul(pattern, value).transpose(1, 2).contiguous(), pattern
