"""The replacement model of an attribution graph (circuit-tracer's): the model with its attention patterns and
normalisation denominators frozen (detached) at their values on the prompt and each MLP's output detached, so
that what reaches the residual stream from an MLP is a constant the graph splits into transcoder features and an
error node (plus the transcoder's skip path, which stays linear in the MLP's input).

:func:`prepare` runs the real model once on the prompt (batch of ``batch``, all rows the same prompt) under the
frozen rules and keeps what the rows need; :func:`rows` takes one backward per batch of targets.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from anatomy_cli.engine.hooks import attach_modules
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.norm_gain import centred as _centred
from anatomy_cli.engine.norm_gain import eps as _eps
from anatomy_cli.engine.norm_gain import mlp_norm_module
from anatomy_cli.engine.norm_gain import normalized as _normalized
from anatomy_cli.engine.norm_gain import probe as _probe
from anatomy_cli.engine.transcoder import Transcoder as Transcoder  # callers build rep.Transcoder
from anatomy_cli.engine.transcoder import Transcoders
from anatomy_cli.engine.transcoder import as_stack
from anatomy_cli.models import sites

FROZEN_ATTENTION = "anatomy_frozen"


class Freezer:
    """What the prompt's forward fixed: each norm call's denominator, each attention call's pattern and each
    MLP's output less its skip path. ``replay``: later forwards use them (an intervention on the frozen model);
    otherwise a forward records them (and its values equal the real model's). ``normalized``: the last call's
    normalised vector before the gain (``P(x) / s``, linear in ``x``) of each norm :func:`forward` asks it of.
    ``capture`` (None: off): each attention call's ``(query, key, out)`` by module id, as the family's eager
    attention gets them (projected, normed, rotated) and ``out [B, P, heads, d_head]`` (the heads' outputs before
    the output projection); a recording forward with it also keeps each ``out`` (``outs``), and ``hold`` (replaying)
    gives every attention call that recorded output back while ``capture`` gets the output it would have had."""

    def __init__(self) -> None:
        self.scales: dict[int, list[torch.Tensor]] = {}
        self.patterns: dict[int, list[torch.Tensor]] = {}
        self.mlp_const: dict[int, torch.Tensor] = {}
        self.replay = False
        self._calls: dict[int, int] = {}
        self.normalized: dict[int, torch.Tensor | None] = {}
        self.capture: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self.outs: dict[int, torch.Tensor] = {}
        self.hold = False

    def start(self) -> None:
        self._calls = {}

    def take(self, store: dict[int, list[torch.Tensor]], module: torch.nn.Module, value: torch.Tensor
             ) -> torch.Tensor:
        """Record ``value`` for this call of ``module``, or give back the one recorded (replay)."""
        key = id(module)
        i = self._calls.get(key, 0)
        self._calls[key] = i + 1
        if not self.replay:
            store.setdefault(key, []).append(value.detach())
            return value.detach()
        return store[key][i]


_ACTIVE: list[Freezer] = []


def _frozen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The family's own eager attention, then its output again from the detached (or recorded) pattern:
    gradients reach the values only."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    _, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)
    weights = _ACTIVE[-1].take(_ACTIVE[-1].patterns, module, weights)
    if weights.shape[0] != value.shape[0]:  # a replay of B copies with one copy's recorded pattern
        weights = weights.expand(value.shape[0], *weights.shape[1:])
    b, n_heads, q_len, k_len = weights.shape
    kv_heads = value.shape[1]  # grouped-query: head h reads kv head h // (n_heads / kv_heads), so the group's
    w = weights.to(value.dtype).reshape(b, kv_heads, n_heads // kv_heads * q_len, k_len)  # queries stack up
    out = torch.matmul(w, value).reshape(b, n_heads, q_len, -1).transpose(1, 2).contiguous()
    freezer = _ACTIVE[-1]
    if freezer.capture is not None:
        freezer.capture[id(module)] = (query, key, out)
        if not freezer.replay:
            freezer.outs[id(module)] = out.detach()
        elif freezer.hold:
            held = freezer.outs[id(module)]
            out = held.expand(out.shape[0], *held.shape[1:]) if held.shape[0] != out.shape[0] else held
    return out, weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(FROZEN_ATTENTION, _frozen_attention)
    AttentionMaskInterface.register(FROZEN_ATTENTION, eager_mask)


def _norm_hook(module: torch.nn.Module, args: tuple[Any, ...], out: object) -> Any:
    """A LayerNorm / RMSNorm's output with its denominator frozen: equal in value (recording), gradient
    ``gain / s``; replaying, ``gain * P(x) / s + beta`` with the recorded ``s``."""
    if not isinstance(out, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    freezer = _ACTIVE[-1]
    xf = x.float()
    gain, beta, centred = _gain(module, x)
    xd = xf.detach()
    if centred:
        s = (xd.var(-1, unbiased=False, keepdim=True) + _eps(module)).sqrt()
    else:
        s = (xd.pow(2).mean(-1, keepdim=True) + _eps(module)).sqrt()
    s = freezer.take(freezer.scales, module, s)
    if id(module) in freezer.normalized:  # ln2.hook_normalized, as engine/norm_gain.py computes it, s frozen
        freezer.normalized[id(module)] = _normalized(x, centred, _eps(module), s)
    if freezer.replay:
        px = xf - xf.mean(-1, keepdim=True) if centred else xf
        return (gain * px / s + beta).to(out.dtype)
    delta = xf - xd
    if centred:
        delta = delta - delta.mean(-1, keepdim=True)
    return out.detach() + (delta * (gain / s)).to(out.dtype)  # one multiply in the backward


def _gain(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The norm's per-channel gain and bias, read by probing it with 0 and ±1 (mean 0, RMS 1): Llama's
    ``weight``, Gemma's ``1 + weight``, LayerNorm's ``weight`` and ``bias``; and whether it subtracts the mean
    (engine/norm_gain.py ``centred``)."""
    cached = getattr(module, "_anatomy_gain", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    gain, beta = _probe(module, x.shape[-1], x.device, x.dtype)
    found = (gain, beta, _centred(module, x.shape[-1], x.device, x.dtype))
    object.__setattr__(module, "_anatomy_gain", found)
    return found


def _norm_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if "norm" in type(m).__name__.lower() and not list(m.children())]


@contextmanager
def frozen(lm: LoadedModel, freezer: Freezer | None = None) -> Iterator[Freezer]:
    """The model with frozen attention patterns and norm denominators; parameters need no gradient. Yields the
    :class:`Freezer` (a new one, recording, unless one is given)."""
    _register()
    freezer = freezer or Freezer()
    model = lm.model
    configs = list({id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values())
    saved = [(c, getattr(c, "_attn_implementation", None)) for c in configs]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    norms = _norm_modules(model)
    for m in norms:
        if hasattr(m, "_anatomy_gain"):
            object.__delattr__(m, "_anatomy_gain")
    handles = [m.register_forward_hook(_norm_hook) for m in norms]
    _ACTIVE.append(freezer)
    try:
        for c, _ in saved:
            c._attn_implementation = FROZEN_ATTENTION
        for p, _ in grads:
            p.requires_grad_(False)
        with torch.enable_grad():
            yield freezer
    finally:
        _ACTIVE.pop()
        for h in handles:
            h.remove()
        for m in norms:  # the gains read for this run: nothing stays on the model (a served one is shared)
            if hasattr(m, "_anatomy_gain"):
                object.__delattr__(m, "_anatomy_gain")
        for c, impl in saved:
            c._attn_implementation = impl
        for p, g in grads:
            p.requires_grad_(g)


def mlp_module(lm: LoadedModel, layer: int) -> torch.nn.Module:
    """The feed-forward module of block ``layer`` (its input is the transcoder's input, ``mlp.hook_in``)."""
    block = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer]
    module: torch.nn.Module = block.get_submodule(lm.adapter.mlp[0])
    return module


@dataclass
class Forward:
    """One frozen forward (batch ``B`` copies of the prompt): ``mlp_in[l] [B, P, d]``, ``mlp_out[l]`` (what
    reaches the residual: skip + detached rest), ``embed [B, P, d]`` (a leaf), ``final [B, P, d]`` (the final
    norm's output) and ``logits [B, P, V]``."""

    mlp_in: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    embed: torch.Tensor
    final: torch.Tensor
    logits: torch.Tensor


def _shared(mlp: torch.nn.Module, batch: int) -> list[Any]:
    """Hooks that run ``mlp`` on the first of ``batch`` copies and repeat its output over the batch."""
    def first(value: torch.Tensor) -> torch.Tensor | None:
        return value[:1] if batch > 1 and value.shape[0] == batch else None

    def repeat(value: torch.Tensor) -> torch.Tensor | None:
        return value.expand(batch, *value.shape[1:]).contiguous() if batch > 1 and value.shape[0] == 1 else None

    return [(mlp, "input", first), (mlp, "output", repeat)]


def forward(lm: LoadedModel, ids: torch.Tensor, transcoders: Transcoders, batch: int,
            edit: Any = None, last_logits: bool = False, shared_mlp: bool = False) -> Forward:
    """Run the frozen model on ``ids [P]`` repeated ``batch`` times, inside :func:`frozen`.
    ``edit(layer, value) -> value`` changes what an MLP writes (layer -1: the embedding) (interventions, with
    the freezer replaying). ``last_logits``: ``logits [B, 1, V]``, the last position's only, where the model's
    forward takes ``logits_to_keep`` (the attribution's batch forward reads no logits). ``shared_mlp``: each MLP
    runs on the first copy only and its output is repeated over the batch (every copy is the same prompt, and
    the replacement model reads an MLP's output as a constant: no gradient goes through it). Transcoders of
    ``ln2.hook_normalized`` (``before_gain``) read, as ``mlp_in``, the pre-MLP norm's vector before its gain,
    ``P(x) / s`` of the norm's input ``x`` with its frozen denominator ``s``: linear in ``x``, a gain of 0 or not."""
    n = lm.n_layers
    stack = as_stack(transcoders)
    norms = [mlp_norm_module(lm, layer) for layer in range(n)] if stack.before_gain else []
    normalized = _ACTIVE[-1].normalized
    normalized.clear()
    normalized.update({id(m): None for m in norms})
    mlp_in: list[Any] = [None] * n
    mlp_out: list[Any] = [None] * n
    got: dict[str, torch.Tensor] = {}

    def take_in(layer: int, value: object) -> None:
        if norms:
            mlp_in[layer] = normalized[id(norms[layer])]
        else:
            mlp_in[layer] = value if isinstance(value, torch.Tensor) else value[0]  # type: ignore[index]
        return None

    def put_out(layer: int, value: torch.Tensor) -> torch.Tensor:
        skip = stack.layer(layer).skip(mlp_in[layer]).to(value.dtype)
        freezer = _ACTIVE[-1]
        if freezer.replay:
            const = freezer.mlp_const[layer]
        else:
            const = freezer.mlp_const[layer] = (value - skip).detach()
        out = skip + const
        if not out.requires_grad and torch.is_grad_enabled():
            out.requires_grad_(True)
        if edit is not None:
            out = edit(layer, out)
        mlp_out[layer] = out
        return out

    def embed(value: torch.Tensor) -> torch.Tensor:
        if edit is not None:
            value = edit(-1, value)
        got["embed"] = value.detach().requires_grad_(torch.is_grad_enabled())
        return got["embed"]

    hooks: list[Any] = [(lm.points[sites.Whole.embed][0], "output", embed)]
    for layer in range(n):
        mlp = mlp_module(lm, layer)
        hooks.append((mlp, "input", lambda v, layer=layer: take_in(layer, v)))
        if shared_mlp:
            hooks += _shared(mlp, batch)
        module, side = lm.points[sites.name(layer, sites.Point.mlp_out)]
        hooks.append((module, side, lambda v, layer=layer: put_out(layer, v)))
    if sites.Whole.ln_final in lm.points:
        hooks.append((lm.points[sites.Whole.ln_final][0], "output", lambda v: got.__setitem__("final", v)))
    _ACTIVE[-1].start()
    extra = {"logits_to_keep": 1} if last_logits and _keeps_logits(lm.model) else {}
    try:
        with attach_modules(hooks):
            out = lm.model(input_ids=ids.to(lm.device)[None].expand(batch, -1), use_cache=False, **extra)
    finally:
        normalized.clear()
    return Forward(mlp_in, mlp_out, got["embed"], got.get("final", got["embed"]), out.logits)


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes transformers' ``logits_to_keep``."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters
