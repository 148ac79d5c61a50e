"""Wrap a built ``transformers`` model and its tokenizer as a :class:`LoadedModel`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from anatomy_cli.engine.hooks import build_points
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.models import adapters as _adapters
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.text.tokenization import Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from anatomy_cli.text.protocol import HFTokenizer


def _input_device(model: PreTrainedModel) -> torch.device:
    emb = model.get_input_embeddings()
    dev = getattr(getattr(emb, "_hf_hook", None), "execution_device", None)  # accelerate dispatch
    if dev is not None:
        return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return emb.weight.device if emb.weight.device.type != "meta" else torch.device("cpu")


def from_model(model: PreTrainedModel, tokenizer: Tokenizer | HFTokenizer | PreTrainedTokenizerBase, *, name: str,
               untrained: bool = False, info: ModelInfo | None = None) -> LoadedModel:
    """Wrap an already built ``transformers`` model and its tokenizer (HF fast or :class:`Tokenizer`).

    ``info``: the opened model's description (None: read from ``model.config`` and the tokenizer).
    Puts the model in eval mode. Raises UnsupportedArchitecture when no adapter fits.
    """
    model.eval()
    if isinstance(tokenizer, Tokenizer):
        tok = tokenizer
    else:
        tok = Tokenizer(tokenizer, add_special_tokens=not _adapters.for_config(model.config).causal)
    info = info or ModelInfo.from_config(model.config, tok)
    adapter = info.adapter
    has_unembed = bool(adapter.unembed and model is not model.base_model and _has_module(model, adapter.unembed))
    # The built model decides: a bare encoder handed in has no head, whatever its config names.
    info = replace(info, has_lm_head=has_unembed, label=info.label or name)
    return LoadedModel(
        model=model, tokenizer=tok, info=info, name=name, untrained=untrained,
        device=_input_device(model), dtype=next(model.parameters()).dtype,
        has_unembed=has_unembed, points=build_points(model, adapter, info.has_resid_mid, has_unembed,
                                                          moe=info.moe),
        embed_scale=float(getattr(model.get_input_embeddings(), "scalar_embed_scale", 1.0)),
        label=info.label, dequantized_from=info.quantization,
    )


def _has_module(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True
