"""Hook points and the one context manager that registers (and always removes) hooks.

See the package docstring for the names and shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError, UsageError
from anatomy_cli.models.adapters import Adapter, Tap


def hook_names(lm: LoadedModel) -> list[str]:
    """Every hook point ``lm`` has, in forward order (see the module docstring)."""
    return list(lm.points)


def residual_names(lm: LoadedModel) -> list[str]:
    """The ``n_layers + 1`` names :meth:`Cache.residual_stream` needs, row order."""
    return ["blocks.0.hook_resid_pre"] + layer_names(lm, "resid_post")


def layer_names(lm: LoadedModel, kind: str) -> list[str]:
    """``blocks.{l}.hook_{kind}`` for every layer. Raises UsageError if ``lm`` has no such point."""
    names = [f"blocks.{layer}.hook_{kind}" for layer in range(lm.n_layers)]
    _check_names(lm, names)
    return names


def _check_names(lm: LoadedModel, names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    for name in names:
        if name not in lm.points:
            why = " (parallel residual: attention and MLP both read resid_pre)" \
                if name.endswith("hook_resid_mid") and not lm.has_resid_mid else ""
            raise UsageError(f"{lm.name} has no hook point '{name}'{why}")
    return names


def _optional(root: Any, path: str | None) -> Any:
    """The module at ``path`` under ``root``, or None when the path is unset or the model leaves it out
    (OPT's ``project_in`` is None unless the embedding width differs from d_model)."""
    if not path:
        return None
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _points(model: Any, adapter: Adapter, has_mid: bool, has_unembed: bool) -> dict[str, tuple[Any, str]]:
    base = model.base_model
    embed = _optional(base, adapter.embed_proj) or base.get_submodule(adapter.embed)
    points: dict[str, tuple[Any, str]] = {"hook_embed": (embed, "output")}
    if adapter.pos_embed:
        points["hook_pos_embed"] = (base.get_submodule(adapter.pos_embed), "output")
    for layer, block in enumerate(base.get_submodule(adapter.blocks)):
        p = f"blocks.{layer}."
        points[p + "hook_resid_pre"] = (block, "input")
        points[p + "attn.hook_z"] = (block.get_submodule(adapter.attn_o), "input")
        points[p + "hook_attn_out"] = (block.get_submodule(adapter.attn_out.module), adapter.attn_out.side)
        if has_mid:
            points[p + "hook_resid_mid"] = (block.get_submodule(adapter.resid_mid.module), adapter.resid_mid.side)
        points[p + "hook_mlp_out"] = (block.get_submodule(adapter.mlp_out.module), adapter.mlp_out.side)
        points[p + "hook_resid_post"] = (block, "output")
    final = _optional(base, adapter.final_norm)
    if final is not None:
        points["ln_final.hook_normalized"] = (final, "output")
    if has_unembed:
        points["logits"] = (model.get_submodule(adapter.unembed), "output")
    return points


_SUBLAYER_TAPS = ("attn_out", "mlp_out", "resid_mid")
_NO_TAP = Tap("")


def _layer(name: str) -> int:
    return int(name.split(".")[1])


def _tap(lm: LoadedModel, name: str) -> Tap | None:
    """The adapter's :class:`Tap` behind ``blocks.{l}.hook_{attn_out,mlp_out,resid_mid}``, else None."""
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "blocks" and parts[2].startswith("hook_"):
        kind = parts[2][5:]
        if kind in _SUBLAYER_TAPS:
            return getattr(lm.adapter, kind)
    return None


def _first_tensor(value: Any) -> torch.Tensor:
    """The activation in a module's input or output.

    A plain tensor is the activation itself (a GPT-2 block returns ``[batch, pos, d]``:
    indexing it with ``[0]`` would pick batch item 0); a tuple/list (attention modules
    return ``(output, weights)``) or a ModelOutput holds it first.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise AnatomyError(f"cannot find the activation in a module value of type {type(value).__name__}")


@contextmanager
def capture(lm: LoadedModel, names: Iterable[str], *,
            positions: torch.Tensor | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks for one run: every forward of ``lm.model`` inside the block fills the yielded dict.

    Yields ``{name: tensor [batch, pos, d_model]}`` (``logits``: ``[batch, pos, vocab]``;
    a point computed once for the whole batch, such as a broadcast position embedding,
    may have batch 1), detached and moved to ``lm.device``. ``positions``: LongTensor
    ``[batch, k]`` of position indices; only those are kept (``[batch, k, d_model]``).
    A later forward in the same block overwrites. The hooks are removed on exit, also
    when the forward raises. ``logits`` are soft-capped as the model's own (``lm.cap_logits``); a
    tap the block sees flattened (OPT's MLP, ``[batch * pos, d]``) is given back its batch shape.
    Raises UsageError for an unknown name. Prefer :func:`run`.
    """
    store: dict[str, torch.Tensor] = {}
    handles = []
    shapes: dict[int, torch.Size] = {}  # block index -> its input's [batch, pos], for flat taps

    def keep(name: str, value: Any) -> None:
        t = _first_tensor(value).detach()
        tap = _tap(lm, name)
        if tap is not None and tap.flat and t.dim() == 2:
            t = t.view(*shapes[_layer(name)], t.shape[-1])
        if tap is not None and tap.copy and positions is None:
            t = t.clone()
        if name == "logits":
            t = lm.cap_logits(t)
        if positions is not None:
            if t.shape[0] == 1 and positions.shape[0] > 1:
                t = t.expand(positions.shape[0], *t.shape[1:])
            idx = positions.to(t.device)
            t = t.gather(1, idx[:, :, None].expand(-1, -1, t.shape[-1]))
        store[name] = t.to(lm.device)

    try:
        names = _check_names(lm, names)
        for layer in sorted({_layer(n) for n in names if (_tap(lm, n) or _NO_TAP).flat}):
            def shape_hook(_mod, args, kwargs, layer=layer):
                shapes[layer] = _first_tensor(args[0] if args else kwargs["hidden_states"]).shape[:2]
            block = lm.points[f"blocks.{layer}.hook_resid_pre"][0]
            handles.append(block.register_forward_pre_hook(shape_hook, with_kwargs=True))
        for name in names:
            module, side = lm.points[name]
            if side == "input":
                def pre_hook(_mod, args, kwargs, name=name):
                    keep(name, args[0] if args else kwargs["hidden_states"])
                handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            else:
                def hook(_mod, _args, output, name=name):
                    keep(name, output)
                handles.append(module.register_forward_hook(hook))
        yield store
    finally:
        for handle in handles:
            handle.remove()
