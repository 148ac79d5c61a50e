"""The loaded model: what :func:`~anatomy_cli.engine.loading.load` returns and every engine function takes."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Literal

import torch

from anatomy_cli.models.adapters import Adapter
from anatomy_cli.models.info import FromInfo
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.text.tokenization import Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Where a hook point sits on its module: its first argument or what it returns.
Side = Literal["input", "output"]


@dataclass
class LoadedModel:
    """A model ready for :func:`run`. Build with :func:`load` / :func:`load_weights` (or :func:`from_model`).

    ``info`` is the model's one description (:class:`~anatomy_cli.models.info.ModelInfo`): its shape,
    context and vocabulary are read from there (``n_layers``, ``d_model``, ``n_ctx``, ``vocab_size`` below
    are its fields, not facts worked out again).
    ``device`` is where inputs go and where every captured tensor is moved (the
    embedding's device, also under a ``device_map``); ``dtype`` the weights' dtype.
    ``untrained`` is True for ``init="random"``: outputs must say so.
    ``points`` maps each hook name to ``(module, "input" | "output")``.
    ``embed_scale``: what the embedding module multiplies table rows by (Gemma: sqrt(d_model));
    ``hook_embed`` already includes it.
    ``dequantized_from`` is the GGUF quantization the weights were dequantized from: ``general.file_type``, then
    the types the file's matrices are stored in when they are not just that one (``Q4_K_M (Q4_K, Q5_0, Q6_K,
    Q8_0)``, ``Q4_1 (Q4_1, Q8_0)``, ``F32``; 1-D tensors, always F32, are left out). None when the weights were
    not quantized on disk.
    ``label``: the short name headings and plot titles use (:func:`anatomy_cli.models.resolve.label`;
    None: ``name``).
    ``load_seconds``: the wall seconds the last :func:`anatomy_cli.tasks.session.load_weights` of this model took
    (a server's cache answers in about none; 0: not loaded through it): the fits' estimates count it.
    """

    model: PreTrainedModel = field(repr=False)
    tokenizer: Tokenizer = field(repr=False)
    info: ModelInfo = field(repr=False)
    name: str
    untrained: bool
    device: torch.device
    dtype: torch.dtype
    has_unembed: bool
    points: dict[str, tuple[torch.nn.Module, Side]] = field(repr=False, default_factory=dict)
    embed_scale: float = 1.0
    dequantized_from: str | None = None
    label: str | None = None
    load_seconds: float = 0.0

    @property
    def display(self) -> str:
        """The model's one display name (``info.label``; the spec where none was decided)."""
        return self.label or self.name

    # Fields of ``info``, read from there.
    adapter = FromInfo[Adapter]()
    n_layers = FromInfo[int]()
    d_model = FromInfo[int]()
    n_heads = FromInfo[int]()  # query heads per layer
    d_head = FromInfo[int]()  # the width of one head (hook_z is [batch, pos, n_heads * d_head])
    n_ctx = FromInfo[int | None]()  # the longest prompt the model takes (None: no limit known)
    vocab_size = FromInfo[int]("lm_head_rows")  # the LM head's rows: the width of the logits
    is_causal = FromInfo[bool]()
    has_resid_mid = FromInfo[bool]()
    logit_softcap = FromInfo[float | None]()  # Gemma 2: logits = c * tanh(raw / c); see cap_logits
    position_offset = FromInfo[int]()  # position id of the first token (RoBERTa: pad_token_id + 1)

    def cap_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Final logit soft-capping, ``c * tanh(logits / c)`` (Gemma 2), as the model's own head applies it.

        ``logits [..., vocab]`` -> same shape; returned unchanged when ``logit_softcap`` is None.
        """
        if not self.logit_softcap:
            return logits
        return torch.tanh(logits / self.logit_softcap) * self.logit_softcap
