"""Helpers on module values and tensors that several engine modules share.

A module's input or output is a plain tensor, a tuple/list (attention modules return ``(output, weights)``)
or a ModelOutput; :func:`first_tensor` finds the activation in it and :func:`replace_first` puts a new one
back. :func:`rowwise` applies a row-by-row module (a norm, an LM head) to ``[..., d]``;
:func:`optional_module` looks a module path up where a model may leave it out.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping

import torch

from anatomy_cli.errors import AnatomyError


def first_tensor(value: object) -> torch.Tensor:
    """The activation in a module's input or output.

    A plain tensor is the activation itself (a GPT-2 block returns ``[batch, pos, d]``:
    indexing it with ``[0]`` would pick batch item 0); a tuple/list (attention modules
    return ``(output, weights)``) or a ModelOutput holds it first.
    """
    if isinstance(value, torch.Tensor):
        return value
    items = list(value.values()) if isinstance(value, Mapping) else value
    if isinstance(items, (tuple, list)) and items and isinstance(items[0], torch.Tensor):
        return items[0]
    raise AnatomyError(f"cannot find the activation in a module value of type {type(value).__name__}")


def replace_first(value: object, new: torch.Tensor) -> torch.Tensor | tuple[object, ...] | list[object]:
    """``value`` with its activation (see :func:`first_tensor`) replaced by ``new``."""
    if isinstance(value, torch.Tensor):
        return new
    if isinstance(value, tuple):
        return (new, *value[1:])
    if isinstance(value, list):
        return [new, *value[1:]]
    raise AnatomyError(f"cannot replace the activation in a module value of type {type(value).__name__}")


def optional_module(root: torch.nn.Module, path: str | None) -> torch.nn.Module | None:
    """The module at ``path`` under ``root``, or None when the path is unset or the model leaves it out
    (OPT's ``project_in`` is None unless the embedding width differs from d_model)."""
    if not path:
        return None
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


# CPU BLAS multiplies 4-15 rows by a [out, in] weight one row at a time: the logit lens of
# GPT-2 small (13 rows x the [50257, 768] head) takes 60 ms, 16 rows take 25 ms.
_MIN_ROWS = 16


def rowwise(module: Callable[[torch.Tensor], object], h: torch.Tensor) -> torch.Tensor:
    """``module(h)`` for a module acting on each row alone (a norm, an LM head); ``h [..., d]``.

    On the CPU, 4-15 rows are padded with zero rows to 16 and the result cut back.
    """
    flat = h.reshape(-1, h.shape[-1])
    n = flat.shape[0]
    if flat.device.type == "cpu" and 3 < n < _MIN_ROWS:
        flat = torch.cat([flat, flat.new_zeros(_MIN_ROWS - n, flat.shape[-1])])
    out = first_tensor(module(flat))[:n]
    return out.reshape(*h.shape[:-1], out.shape[-1])
