"""The loaded model: what :func:`~anatomy_cli.engine.load` returns and every engine function takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from anatomy_cli.models.adapters import Adapter
from anatomy_cli.text.tokenization import Tokenizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready for :func:`run`. Build with :func:`load` (or :func:`from_model`).

    ``device`` is where inputs go and where every captured tensor is moved (the
    embedding's device, also under a ``device_map``); ``dtype`` the weights' dtype.
    ``untrained`` is True for ``init="random"``: outputs must say so.
    ``n_ctx`` is the longest prompt the model takes (None: no limit known).
    ``points`` maps each hook name to ``(module, "input" | "output")``.
    ``logit_softcap``, ``embed_scale``, ``position_offset``: family quirks the engine applies
    (see ``docs/engine.md``, Architectures); ``hook_embed`` already includes ``embed_scale``.
    ``dequantized_from`` is the GGUF quantization the weights were dequantized from: ``general.file_type``, then
    the types the file's matrices are stored in when they are not just that one (``Q4_K_M (Q4_K, Q5_0, Q6_K,
    Q8_0)``, ``Q4_1 (Q4_1, Q8_0)``, ``F32``; 1-D tensors, always F32, are left out). None when the weights were
    not quantized on disk.
    ``label``: the short name headings and plot titles use (:func:`anatomy_cli.models.resolve.label`;
    None: ``name``).
    """

    model: Any = field(repr=False)
    tokenizer: Tokenizer = field(repr=False)
    adapter: Adapter = field(repr=False)
    name: str
    untrained: bool
    device: torch.device
    dtype: torch.dtype
    n_layers: int
    d_model: int
    n_heads: int                   # query heads per layer
    d_head: int                    # width of one head (hook_z is [batch, pos, n_heads * d_head])
    n_ctx: int | None
    vocab_size: int
    is_causal: bool
    has_unembed: bool
    has_resid_mid: bool
    points: dict[str, tuple[torch.nn.Module, str]] = field(repr=False, default_factory=dict)
    logit_softcap: float | None = None  # Gemma 2: logits = c * tanh(raw / c); see cap_logits
    embed_scale: float = 1.0       # what the embedding module multiplies table rows by (Gemma: sqrt(d_model))
    position_offset: int = 0       # position id of the first token (RoBERTa: pad_token_id + 1)
    dequantized_from: str | None = None
    label: str | None = None       # short name for headings and titles (GGUF general.name, a directory's name)

    def cap_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Final logit soft-capping, ``c * tanh(logits / c)`` (Gemma 2), as the model's own head applies it.

        ``logits [..., vocab]`` -> same shape; returned unchanged when ``logit_softcap`` is None.
        """
        if not self.logit_softcap:
            return logits
        return torch.tanh(logits / self.logit_softcap) * self.logit_softcap
