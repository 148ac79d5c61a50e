"""Hooks for one's own experiments: read or edit activations at anatomy's hook points, by TransformerLens names
(``hook_embed``, ``blocks.{l}.hook_resid_pre``, ``blocks.{l}.attn.hook_pattern``, ``blocks.{l}.attn.hook_z``, ...,
``ln_final.hook_normalized``, ``logits``; docs/engine.md). The engine's one hook context, made public: every
hook is removed when the block ends, also when it raises. No torch at import time."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


def hook_names(lm: LoadedModel) -> list[str]:
    """Every hook point ``lm`` has, in forward order."""
    from anatomy_cli.engine import hooks as engine_hooks

    return engine_hooks.hook_names(lm)


@contextmanager
def hooks(lm: LoadedModel, fns: Mapping[str, Callable[[Any], Any]] | Iterable[tuple[str, Callable[[Any], Any]]]
          ) -> Iterator[LoadedModel]:
    """Inside the block, ``fn(activation)`` runs at hook point ``name`` in every forward of ``lm.model``;
    ``activation`` is ``[batch, pos, width]`` (``width``: d_model, ``n_heads * d_head`` for ``attn.hook_z``,
    the vocabulary for ``logits``; the attention, MLP and norm internals in TransformerLens' shapes:
    ``attn.hook_q`` ``[batch, pos, head, d_head]``, ``attn.hook_pattern`` ``[batch, head, query, key]``, ...,
    docs/engine.md); a tensor ``fn`` returns replaces it, None leaves it. ``fns``: ``{name: fn}``
    or ``(name, fn)`` pairs. Yields ``lm``. Raises UsageError for an unknown name before any hook is attached."""
    from anatomy_cli.engine import hooks as engine_hooks

    with engine_hooks.attach(lm, fns):
        yield lm


@contextmanager
def capture(lm: LoadedModel, names: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Inside the block, each forward of ``lm.model`` fills the yielded ``{name: tensor}`` (detached, on
    ``lm.device``; ``[batch, pos, width]``; ``logits`` soft-capped as the model's own). Hooks removed on exit."""
    from anatomy_cli.engine import hooks as engine_hooks

    with engine_hooks.capture(lm, names) as store:
        yield store
