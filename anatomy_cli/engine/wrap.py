"""Wrap a built ``transformers`` model and its tokenizer as a :class:`LoadedModel`."""

from __future__ import annotations

from typing import Any

import torch

from anatomy_cli.engine.hooks import build_points
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.models import adapters as _adapters
from anatomy_cli.text.tokenization import Tokenizer


def _input_device(model: Any) -> torch.device:
    emb = model.get_input_embeddings()
    dev = getattr(getattr(emb, "_hf_hook", None), "execution_device", None)  # accelerate dispatch
    if dev is not None:
        return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return emb.weight.device if emb.weight.device.type != "meta" else torch.device("cpu")


def from_model(model: Any, tokenizer: Any, *, name: str, untrained: bool = False) -> LoadedModel:
    """Wrap an already built ``transformers`` model and its tokenizer (HF fast or :class:`Tokenizer`).

    Puts the model in eval mode. Raises UnsupportedArchitecture when no adapter fits.
    """
    config = model.config
    adapter = _adapters.for_config(config)
    text = config.get_text_config()  # a multimodal config (Gemma 3) keeps the decoder's sizes here
    model.eval()
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer, add_special_tokens=not adapter.causal)
    has_mid = _adapters.has_resid_mid(adapter, config)
    has_unembed = bool(adapter.unembed) and model is not model.base_model and _has_module(model, adapter.unembed)
    points = build_points(model, adapter, has_mid, has_unembed)
    # RoBERTa numbers positions from pad_token_id + 1, so its table of 514 takes 512 tokens.
    offset = int(config.pad_token_id) + 1 if adapter.positions_after_pad else 0
    n_ctx = getattr(text, "max_position_embeddings", None)
    n_ctx = n_ctx - offset if n_ctx else None
    n_heads = int(getattr(text, "num_attention_heads", None) or text.n_head)
    d_head = int(getattr(text, "head_dim", None) or text.hidden_size // n_heads)
    return LoadedModel(
        model=model, tokenizer=tok, adapter=adapter, name=name, untrained=untrained,
        device=_input_device(model), dtype=next(model.parameters()).dtype,
        n_layers=len(model.base_model.get_submodule(adapter.blocks)), d_model=text.hidden_size,
        n_heads=n_heads, d_head=d_head,
        n_ctx=int(n_ctx) if n_ctx else None, vocab_size=text.vocab_size, is_causal=adapter.causal,
        has_unembed=has_unembed, has_resid_mid=has_mid, points=points,
        logit_softcap=getattr(text, "final_logit_softcapping", None) or None,
        embed_scale=float(getattr(model.get_input_embeddings(), "scalar_embed_scale", 1.0)),
        position_offset=offset,
    )


def _has_module(model: Any, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True
