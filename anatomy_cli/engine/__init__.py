"""The forward engine: load a model, tokenize, run it with hooks, keep what was asked for.

Library layer: may import models, text, errors and units; never analyses, serve, corpus, output or cli;
no rich, no typer, never prints; errors are :mod:`anatomy_cli.errors`
with one-line messages. See ``docs/engine.md`` for the hook points and the residual
stream's definition.

Hook points (TransformerLens names). In a forward they are ``[batch, pos, d_model]``
(``logits``: ``[batch, pos, vocab]``); a :class:`Cache` holds one prompt, so
``[pos, d_model]``:

* ``hook_embed`` token embedding; ``hook_pos_embed`` learned position embedding (GPT-2, BERT)
* ``blocks.{l}.hook_resid_pre`` block input; ``blocks.{l}.hook_attn_out`` what attention adds;
  ``blocks.{l}.hook_resid_mid`` between attention and MLP (not in parallel-residual blocks);
  ``blocks.{l}.hook_mlp_out`` what the MLP adds; ``blocks.{l}.hook_resid_post`` block output
* ``blocks.{l}.attn.hook_z`` the input of attention's output projection, ``[batch, pos, n_heads * d_head]``:
  head h is columns ``h * d_head : (h + 1) * d_head`` (TransformerLens keeps the heads on their own axis)
* ``ln_final.hook_normalized`` the final norm's output (absent for BERT); ``logits``.

Modules: ``model`` (LoadedModel), ``hooks`` (hook points; :func:`attach`, the one context manager that
registers and removes hooks; :func:`capture`), ``cache``, ``forwarding`` (:func:`forward`, the one model call;
``pad_batch``, the one padding), ``tensors`` (module values and tensors: ``first_tensor``, ``rowwise``, ...),
``running`` (encode, check_length, run), ``decompose`` (the final residual's parts and the unembedding direction
for direct logit attribution), ``interventions`` (patching and ablation: :func:`run_edits`,
:func:`patch_grid`), ``gradients`` (gradients at hook points, attribution patching: only inside
:func:`~anatomy_cli.engine.gradients.grad_mode`), ``token_attribution`` (Captum), ``lens`` (final norm, unembed),
``opening`` (a :class:`ModelSpec` to an OpenedModel: config, tokenizer, ModelInfo), ``loader`` (who opens),
``loading`` (its weights: a LoadedModel; the submodules are named apart from the functions
``engine.load``, ``engine.run`` and ``engine.forward``),
``load_gguf`` (a .gguf file's weights), ``attention`` (attention patterns), ``wrap`` (:func:`from_model`).

Residual stream (``Cache.residual_stream()``): index 0 is the reading named ``embed``
(``blocks.0.hook_resid_pre``), index i the output of block i − 1 (``blocks.{i-1}.hook_resid_post``), raw, before
the final norm; docs/engine.md#layers, :mod:`anatomy_cli.models.sites`.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from anatomy_cli.text import tokenization

# Public names -> the module that defines them. Imported on first use (PEP 562), so ``engine.open_model``
# and ``engine.current_loader`` (anatomy_cli.engine.opening) run before torch is imported.
_EXPORTS = {
    "attention": ("attention_patterns", "eager_attention", "encode_ids", "ordinary_token_ids"),
    "cache": ("Cache",),
    "forwarding": ("forward", "pad_batch"),
    "hooks": ("attach", "attach_modules", "capture", "hook_names", "layer_names", "residual_names"),
    "interventions": ("Edit", "ablation_rows", "patch_grid", "run_edits"),
    "lens": ("final_norm", "unembed"),
    "loading": ("load", "load_weights", "resolve_device"),
    "model": ("DTYPES", "LoadedModel"),
    "loader": ("Loader", "current_loader", "using_loader"),
    "opening": ("OpenedModel", "open_model"),
    "running": ("check_length", "encode", "run"),
    "wrap": ("from_model",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
_TEXT = {"Encoded", "Tokenizer"}

__all__ = [  # the public names (_EXPORTS and _TEXT)
    "Cache",
    "DTYPES",
    "Edit",
    "Encoded",
    "LoadedModel",
    "Loader",
    "OpenedModel",
    "Tokenizer",
    "ablation_rows",
    "attach",
    "attach_modules",
    "attention_patterns",
    "capture",
    "check_length",
    "current_loader",
    "eager_attention",
    "encode",
    "encode_ids",
    "final_norm",
    "forward",
    "from_model",
    "hook_names",
    "layer_names",
    "load",
    "load_weights",
    "open_model",
    "ordinary_token_ids",
    "pad_batch",
    "patch_grid",
    "residual_names",
    "resolve_device",
    "run",
    "run_edits",
    "unembed",
    "using_loader",
]


def __getattr__(name: str) -> object:
    if name in _TEXT:
        return getattr(tokenization, name)
    module = _WHERE.get(name)
    if module is None:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")  # a submodule: engine.attention, engine.hooks
        raise AttributeError(f"module 'anatomy_cli.engine' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"anatomy_cli.engine.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from anatomy_cli.engine.attention import attention_patterns
    from anatomy_cli.engine.attention import eager_attention
    from anatomy_cli.engine.attention import encode_ids
    from anatomy_cli.engine.attention import ordinary_token_ids
    from anatomy_cli.engine.cache import Cache
    from anatomy_cli.engine.forwarding import forward
    from anatomy_cli.engine.forwarding import pad_batch
    from anatomy_cli.engine.hooks import attach
    from anatomy_cli.engine.hooks import attach_modules
    from anatomy_cli.engine.hooks import capture
    from anatomy_cli.engine.hooks import hook_names
    from anatomy_cli.engine.hooks import layer_names
    from anatomy_cli.engine.hooks import residual_names
    from anatomy_cli.engine.interventions import Edit
    from anatomy_cli.engine.interventions import ablation_rows
    from anatomy_cli.engine.interventions import patch_grid
    from anatomy_cli.engine.interventions import run_edits
    from anatomy_cli.engine.lens import final_norm
    from anatomy_cli.engine.lens import unembed
    from anatomy_cli.engine.loader import Loader
    from anatomy_cli.engine.loader import current_loader
    from anatomy_cli.engine.loader import using_loader
    from anatomy_cli.engine.loading import load
    from anatomy_cli.engine.loading import load_weights
    from anatomy_cli.engine.loading import resolve_device
    from anatomy_cli.engine.model import DTYPES
    from anatomy_cli.engine.model import LoadedModel
    from anatomy_cli.engine.opening import OpenedModel
    from anatomy_cli.engine.opening import open_model
    from anatomy_cli.engine.running import check_length
    from anatomy_cli.engine.running import encode
    from anatomy_cli.engine.running import run
    from anatomy_cli.engine.wrap import from_model
    from anatomy_cli.text.tokenization import Encoded
    from anatomy_cli.text.tokenization import Tokenizer
