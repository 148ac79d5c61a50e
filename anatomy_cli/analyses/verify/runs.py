"""The runs every section of `anatomy verify` reads, each computed once: the engine's batched run of the
prompts with every hook point, the same prompts one by one, and transformers' own forward of each prompt
(``output_hidden_states``; ``output_attentions`` under eager attention)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from anatomy_cli import engine
from anatomy_cli.engine.model import DTYPES
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.models import sites
from anatomy_cli.text.tokenization import Encoded


def dtype_name(lm: LoadedModel) -> str:
    return next((name for name, dtype in DTYPES.items() if dtype == lm.dtype), "fp32")


@dataclass
class Runs:
    """``lm`` and its prompts ``encoded``; the runs are computed on first use and kept."""

    lm: LoadedModel
    encoded: list[Encoded]
    batch_size: int = 8

    @property
    def dtype(self) -> str:
        return dtype_name(self.lm)

    @cached_property
    def names(self) -> list[str]:
        """Every hook point but the internals (models/sites.py ``INTERNALS``: no residual-stream width)."""
        return [n for n in engine.hook_names(self.lm) if not sites.is_internal(n)]

    @cached_property
    def batched(self) -> list[engine.Cache]:
        """The engine's run of all prompts in padded batches, every hook point, every position."""
        return engine.run(self.lm, self.encoded, self.names, batch_size=self.batch_size)

    @cached_property
    def single(self) -> list[engine.Cache]:
        """The same, one prompt per forward (no padding)."""
        return [engine.run(self.lm, [enc], self.names, batch_size=1)[0] for enc in self.encoded]

    @cached_property
    def reference(self) -> list[Any]:
        """transformers' own forward of each prompt alone (batch 1, the model's default attention): its output
        with ``hidden_states`` ([n_layers + 1] x [1, pos, d_model]) and ``logits`` ([1, pos, vocab])."""
        out = []
        with torch.inference_mode():
            for enc in self.encoded:
                ids = torch.tensor([enc.ids], device=self.lm.device)
                out.append(self.lm.model(input_ids=ids, output_hidden_states=True))
        return out

    @cached_property
    def reference_attentions(self) -> list[tuple[torch.Tensor, ...]]:
        """transformers' ``output_attentions`` of each prompt alone under eager attention: per layer
        ``[1, n_heads, pos, pos]``."""
        out = []
        with engine.eager_attention(self.lm), torch.inference_mode():
            for enc in self.encoded:
                ids = torch.tensor([enc.ids], device=self.lm.device)
                out.append(tuple(self.lm.model(input_ids=ids, output_attentions=True).attentions))
        return out
