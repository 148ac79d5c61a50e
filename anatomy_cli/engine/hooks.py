"""Hook points and the one context manager that registers (and always removes) hooks.

Every hook the engine puts on a model goes through :func:`attach_modules` (hook points by name:
:func:`attach`; activations kept: :func:`capture`), which removes them all in ``finally``, also when the
forward raises. See the package docstring for the names and shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING
from typing import Literal
from typing import cast
from typing import overload

import torch

from anatomy_cli.engine import internals
from anatomy_cli.engine import moe as _moe
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.model import Side
from anatomy_cli.engine.tensors import first_tensor
from anatomy_cli.engine.tensors import optional_module
from anatomy_cli.engine.tensors import replace_first
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.adapters import Adapter
from anatomy_cli.models.adapters import Tap

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from anatomy_cli.models.info import MoeInfo

# A hook's function: the activation [batch, pos, width] in, None (leave it) or its replacement out.
HookFn = Callable[[torch.Tensor], "torch.Tensor | None"]
# attach_modules(raw=True): the module's whole value in (a tensor, a tuple, a ModelOutput ...), None or its
# replacement out.
RawHookFn = Callable[[object], object]


def hook_names(lm: LoadedModel) -> list[str]:
    """Every hook point ``lm`` has, in forward order (see the module docstring)."""
    return list(lm.points)


def residual_names(lm: LoadedModel) -> list[str]:
    """The ``n_layers + 1`` names :meth:`Cache.residual_stream` needs, row order."""
    return [sites.name(0, sites.Point.resid_pre)] + layer_names(lm, "resid_post")


def layer_names(lm: LoadedModel, kind: str) -> list[str]:
    """Point ``kind`` (models/sites.py ``Point``'s key: ``resid_post``) of every layer. Raises UsageError if ``lm``
    has no such point."""
    names = sites.names(range(lm.n_layers), kind)
    check_names(lm, names)
    return names


def check_names(lm: LoadedModel, names: Iterable[str]) -> list[str]:
    """``names`` without repeats, in order. Raises UsageError for a name ``lm`` has no hook point for."""
    names = list(dict.fromkeys(names))
    for name in names:
        if name not in lm.points:
            why = " (parallel residual: attention and MLP both read resid_pre)" \
                if sites.is_point(name, sites.Point.resid_mid) and not lm.has_resid_mid else ""
            raise UsageError(f"{lm.name} has no hook point '{name}'{why}")
    return names


def build_points(model: PreTrainedModel, adapter: Adapter, has_mid: bool,
                 has_unembed: bool, moe: MoeInfo | None = None) -> dict[str, tuple[torch.nn.Module, Side]]:
    """``{hook point name: (module, "input" | "output")}`` of a built model, in forward order (``lm.points``).
    ``moe``: the model's routing facts; its MoE blocks get the router's points (:mod:`anatomy_cli.engine.moe`).
    Every name is models/sites.py's (``sites.name``)."""
    P, W = sites.Point, sites.Whole
    base = model.base_model
    embed = optional_module(base, adapter.embed_proj) or base.get_submodule(adapter.embed)
    points: dict[str, tuple[torch.nn.Module, Side]] = {W.embed.value: (embed, "output")}
    if adapter.pos_embed:
        points[W.pos_embed.value] = (base.get_submodule(adapter.pos_embed), "output")
    for layer, block in enumerate(base.get_submodule(adapter.blocks)):
        inside: dict[sites.Point, tuple[torch.nn.Module, Side]] = {
            P.resid_pre: (block, "input"), P.attn_z: (block.get_submodule(adapter.attn_o), "input"),
            P.attn_out: (block.get_submodule(adapter.attn_out.module), adapter.attn_out.side)}
        if has_mid and adapter.resid_mid is not None:  # has_mid: the adapter names a resid_mid
            inside[P.resid_mid] = (block.get_submodule(adapter.resid_mid.module), adapter.resid_mid.side)
        mlp = mlp_of(block, adapter)
        if mlp is not None:
            inside[P.mlp_in] = (mlp, "input")
        if moe is not None and layer in moe.sparse_blocks:
            for point, path in _moe.module_paths(moe).items():
                inside[point] = (block.get_submodule(path), "output")
        inside[P.mlp_out] = (block.get_submodule(adapter.mlp_out.module), adapter.mlp_out.side)
        inside[P.resid_post] = (block, "output")
        inside.update(internals.block_points(block, adapter))
        points.update({sites.name(layer, point): inside[point] for point in P if point in inside})  # forward order
    final = optional_module(base, adapter.final_norm)
    if final is not None:
        points[W.ln_final.value] = (final, "output")
    if has_unembed:
        points[W.logits.value] = (model.get_submodule(adapter.unembed), "output")
    return points


def mlp_of(block: torch.nn.Module, adapter: Adapter) -> torch.nn.Module | None:
    """The feed-forward module of ``block`` (the adapter's first ``mlp`` part: an MoE block's whole MoE module),
    whose input is ``blocks.N.mlp.hook_in`` [batch, pos, d_model] (after the MLP's norm; a transcoder's input);
    None where the family's MLP sees ``[batch * pos, d]`` (OPT: ``mlp_out.flat``) or has no module."""
    if adapter.mlp_out.flat or not adapter.mlp:
        return None
    return optional_module(block, adapter.mlp[0])


_NO_TAP = Tap("")


_layer = sites.block_of


def _tap(lm: LoadedModel, name: str) -> Tap | None:
    """The adapter's :class:`Tap` behind ``blocks.{l}.hook_{attn_out,mlp_out,resid_mid}``, else None."""
    parsed = sites.parse(name)
    point = None if parsed is None else parsed[1]
    adapter = lm.adapter
    taps = {sites.Point.attn_out: adapter.attn_out, sites.Point.mlp_out: adapter.mlp_out,
            sites.Point.resid_mid: adapter.resid_mid}
    return taps.get(point) if isinstance(point, sites.Point) else None


@overload
def attach_modules(hooks: Iterable[tuple[torch.nn.Module, Side, HookFn]], *,
                   raw: Literal[False] = False) -> AbstractContextManager[None]: ...


@overload
def attach_modules(hooks: Iterable[tuple[torch.nn.Module, Side, RawHookFn]], *,
                   raw: Literal[True]) -> AbstractContextManager[None]: ...


@contextmanager
def attach_modules(hooks: Iterable[tuple[torch.nn.Module, Side, HookFn]] |
                   Iterable[tuple[torch.nn.Module, Side, RawHookFn]], *, raw: bool = False) -> Iterator[None]:
    """Register ``(module, side, fn)`` hooks for the block; every one is removed on exit, also when it raises.

    ``side`` ``"input"``: a forward pre-hook (with kwargs) on the module's first argument (or its
    ``hidden_states`` keyword); ``"output"``: a forward hook on what it returns. ``fn`` gets the activation
    (:func:`~anatomy_cli.engine.tensors.first_tensor`; with ``raw``, the module's whole value, e.g. an
    attention module's ``(output, weights)``) and returns None or what replaces it. Hooks of one module run in
    the order given. The one place the engine registers and removes hooks.
    """
    handles = []
    try:
        for module, side, fn in hooks:
            # The overloads pair raw with RawHookFn and not raw with HookFn.
            on_value = cast(RawHookFn, fn) if raw else _on_activation(cast(HookFn, fn))
            if side == "input":
                handles.append(module.register_forward_pre_hook(_pre_hook(on_value), with_kwargs=True))
            elif side == "output":
                handles.append(module.register_forward_hook(_post_hook(on_value)))
            else:
                raise ValueError(f"side must be 'input' or 'output', got {side!r}")
        yield
    finally:
        for handle in handles:
            handle.remove()


def _on_activation(fn: HookFn) -> RawHookFn:
    """``fn`` on the activation in a module value (:func:`first_tensor`), its result put back in that value."""
    def on_value(value: object) -> object:
        new = fn(first_tensor(value))
        return None if new is None else replace_first(value, new)
    return on_value


# torch's hook signatures: (module, args, kwargs) -> None | (args, kwargs); (module, args, output) -> None | output.
PreHook = Callable[[torch.nn.Module, tuple[object, ...], dict[str, object]],
                   "tuple[tuple[object, ...], dict[str, object]] | None"]
PostHook = Callable[[torch.nn.Module, tuple[object, ...], object], object]


def _pre_hook(fn: RawHookFn) -> PreHook:
    def hook(_mod: torch.nn.Module, args: tuple[object, ...],
             kwargs: dict[str, object]) -> tuple[tuple[object, ...], dict[str, object]] | None:
        new = fn(args[0] if args else kwargs["hidden_states"])
        if new is None:
            return None
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new}
    return hook


def _post_hook(fn: RawHookFn) -> PostHook:
    def hook(_mod: torch.nn.Module, _args: tuple[object, ...], output: object) -> object:
        return fn(output)
    return hook


@contextmanager
def attach(lm: LoadedModel, hooks: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]]) -> Iterator[None]:
    """Hooks at hook points for the block: ``fn`` runs on the activation at ``name`` (``[batch, pos, width]``)
    at every forward, on the input or output side of its module as ``lm.points[name]`` says, and a tensor it
    returns replaces the activation. ``hooks``: ``{name: fn}``, or ``(name, fn)`` pairs when several target one
    point (they run in the order given). Removed on exit, also when the block raises. Raises UsageError for an
    unknown name, before any hook is registered.
    """
    pairs = list(hooks.items() if isinstance(hooks, Mapping) else hooks)
    names = check_names(lm, [name for name, _ in pairs])
    pairs = internals.views(lm, _moe_views(lm, pairs))
    with internals.implementation(lm, names), attach_modules((*lm.points[name], fn) for name, fn in pairs):
        yield


def _moe_views(lm: LoadedModel, pairs: list[tuple[str, HookFn]]) -> list[tuple[str, HookFn]]:
    """The MoE points' functions see what the point holds (``[batch, pos, …]``, :func:`moe.view`) and may not
    replace it; hooks at each such block's input record its ``[batch, pos]`` first."""
    moe = lm.info.moe
    layers = sorted({_layer(name) for name, _ in pairs if _moe.kind(name) is not None})
    if moe is None or not layers:
        return pairs
    shapes: dict[int, torch.Size] = {}

    def shape(layer: int, t: torch.Tensor) -> None:
        shapes[layer] = t.shape[:2]

    def wrapped(name: str, fn: HookFn, t: torch.Tensor) -> None:
        if fn(_moe.view(moe, name, t, shapes[_layer(name)])) is not None:
            raise _moe.read_only(name)

    out: list[tuple[str, HookFn]] = [(sites.name(layer, sites.Point.resid_pre), partial(shape, layer))
                                     for layer in layers]
    return out + [(name, partial(wrapped, name, fn) if _moe.kind(name) is not None else fn) for name, fn in pairs]


@contextmanager
def capture(lm: LoadedModel, names: Iterable[str], *,
            positions: torch.Tensor | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks for one run: every forward of ``lm.model`` inside the block fills the yielded dict.

    Yields ``{name: tensor [batch, pos, d_model]}`` (``logits``: ``[batch, pos, vocab]``; the internals'
    own shapes, engine/internals.py;
    a point computed once for the whole batch, such as a broadcast position embedding,
    may have batch 1), detached and moved to ``lm.device``. ``positions``: LongTensor
    ``[batch, k]`` of position indices; only those are kept (``[batch, k, d_model]``).
    A later forward in the same block overwrites. The hooks are removed on exit, also
    when the forward raises. ``logits`` are soft-capped as the model's own (``lm.cap_logits``); a
    tap the block sees flattened (OPT's MLP, ``[batch * pos, d]``) is given back its batch shape.
    Raises UsageError for an unknown name. Prefer :func:`run`.
    """
    store: dict[str, torch.Tensor] = {}
    shapes: dict[int, torch.Size] = {}  # block index -> its input's [batch, pos], for flat taps

    def keep(name: str, t: torch.Tensor) -> None:
        t = t.detach()
        tap = _tap(lm, name)
        if tap is not None and tap.flat and t.dim() == 2:
            t = t.view(*shapes[_layer(name)], t.shape[-1])
        if tap is not None and tap.copy and positions is None:
            t = t.clone()
        if name == sites.Whole.logits:
            t = lm.cap_logits(t)
        if positions is not None:
            t = at_positions(t, positions, sites.position_axis(name))
        store[name] = t.to(lm.device)

    def shape(layer: int, t: torch.Tensor) -> None:
        shapes[layer] = t.shape[:2]

    names = check_names(lm, names)
    hooks: list[tuple[str, HookFn]] = [
        (sites.name(layer, sites.Point.resid_pre), partial(shape, layer))
        for layer in sorted({_layer(n) for n in names if (_tap(lm, n) or _NO_TAP).flat})]
    hooks += [(name, partial(keep, name)) for name in names]
    with attach(lm, hooks):
        yield store


def at_positions(t: torch.Tensor, positions: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """``t``'s rows at ``positions`` (LongTensor ``[batch, k]``) along its position axis ``axis``: ``[batch, pos,
    …]`` → ``[batch, k, …]`` (a pattern's ``[batch, head, query, key]`` at axis 2: ``[batch, head, k, key]``); a
    ``t`` of batch 1 (computed once for the batch) is broadcast first."""
    if t.shape[0] == 1 and positions.shape[0] > 1:
        t = t.expand(positions.shape[0], *t.shape[1:])
    shape = [positions.shape[0]] + [1] * (t.dim() - 1)
    shape[axis] = positions.shape[1]
    size = list(t.shape)
    size[axis] = positions.shape[1]
    return t.gather(axis, positions.to(t.device).view(shape).expand(size))
