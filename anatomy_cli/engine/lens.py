"""The final norm and the LM head applied to any residual vector: the logit lens."""

from __future__ import annotations

import torch

from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.tensors import optional_module
from anatomy_cli.engine.tensors import rowwise
from anatomy_cli.errors import AnatomyError
from anatomy_cli.models import sites


def _apply(lm: LoadedModel, module: torch.nn.Module, h: torch.Tensor, grad: bool = False) -> torch.Tensor:
    param = next(module.parameters(), None)
    if param is not None:
        h = h.to(dtype=param.dtype, device=param.device if param.device.type != "meta" else h.device)
    with torch.inference_mode(not grad):
        return rowwise(module, h)


def final_norm(lm: LoadedModel, h: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
    """The final norm applied to ``h [..., d_model]``, its statistics computed from ``h`` itself.

    Returns ``[..., d_model]`` on ``h``'s device. Identity for models without a final
    norm (BERT: post-LN, each block already ends in a LayerNorm).
    """
    if sites.Whole.ln_final not in lm.points:
        return h
    return _apply(lm, lm.points[sites.Whole.ln_final][0], h, grad).to(h.device)


def unembed(lm: LoadedModel, h: torch.Tensor, *, softcap: bool = True, normed: bool = False,
            grad: bool = False) -> torch.Tensor:
    """The logit lens: the LM head applied to ``final_norm(h)``; ``h [..., d_model]`` -> ``[..., vocab]``.

    At the last layer this equals the model's own logits: OPT-350m's ``project_out`` runs
    between the final norm and the head, and Gemma 2's final soft-capping
    (``lm.cap_logits``) is applied unless ``softcap=False`` (the raw head output, linear in
    the normed vector: what a direct logit attribution decomposes). For BERT the head is
    the whole MLM head (dense, GELU, LayerNorm, decoder). Raises AnatomyError when the
    model has no unembedding (e.g. a bare ``BertModel`` checkpoint). ``normed=True``: ``h`` is
    already :func:`final_norm`'s output (the norm applied once to many rows, then the head in blocks).
    ``grad=True``: differentiable in ``h`` (not under ``inference_mode``; the caller enables autograd, e.g. in
    :func:`~anatomy_cli.engine.gradients.grad_mode`): `fit-lens tuned` trains through it.
    """
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read tokens from")
    x = h if normed else final_norm(lm, h, grad=grad)
    proj = optional_module(lm.model.base_model, lm.adapter.unembed_proj)
    if proj is not None:
        x = _apply(lm, proj, x, grad)
    logits = _apply(lm, lm.points["logits"][0], x, grad).to(h.device)
    return lm.cap_logits(logits) if softcap else logits
