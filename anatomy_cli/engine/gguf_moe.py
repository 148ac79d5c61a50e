"""Tensor processors for GGUF mixture-of-experts files: those transformers' own GGUF reader cannot load (Mixtral
written as ``llama``, OLMoE), and for Qwen2-MoE and Qwen3-MoE transformers' own, each checked for a
``gate_up_proj`` of which the file fills one half only (the other would stay zeros).

* Mixtral as llama.cpp writes it: architecture ``llama`` with experts. LLaMA's q/k row permutation is undone and
  the expert stacks ``ffn_{gate,up,down}_exps`` ([n_experts, f, d]) gathered into transformers' ``gate_up_proj``
  and ``down_proj`` as Qwen2-MoE's are. Older llama.cpp files store each expert as its own tensor,
  ``blk.N.ffn_gate.E.weight``, ``blk.N.ffn_up.E.weight``, ``blk.N.ffn_down.E.weight``: those are stacked in
  expert order (one block's stack held at a time) and then gathered the same way.
* OLMoE (``olmoe``): the expert stacks as Qwen2-MoE's; its rotary embedding rotates halves (NeoX), which
  convert_hf_to_gguf.py writes without permuting q/k, and ``attn_q_norm``/``attn_k_norm`` are transformers' own
  full-width ``q_norm``/``k_norm``.

Used by :mod:`anatomy_cli.engine.load_gguf` (which turns a ValueError raised here into a one-line CheckpointError
naming the file); the config dict is :func:`anatomy_cli.models.gguf.config_dict`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor

# An older llama.cpp Mixtral file's one expert: block, which matrix, expert index.
PER_EXPERT = re.compile(r"blk\.(?P<bid>\d+)\.ffn_(?P<w>gate|up|down)\.(?P<xid>\d+)\.weight")


def moe_processor(config: dict[str, Any]) -> TensorProcessor | None:
    """The processor for a Mixtral (``llama`` with experts), OLMoE, Qwen2-MoE or Qwen3-MoE file's config dict;
    None for the others. Each remembers which halves of ``gate_up_proj`` it filled (:func:`half_filled`)."""
    if config.get("model_type") == "mixtral":
        return _llama_moe_processor(config)
    if config.get("model_type") in ("olmoe", "qwen2_moe", "qwen3_moe"):
        processor: TensorProcessor = _gathering()(config)
        return processor
    return None


def half_filled(processor: TensorProcessor) -> list[tuple[str, str]]:
    """``(parameter, the missing half: gate or up)`` for each ``gate_up_proj`` the file filled one half of (the
    other half would stay zeros)."""
    halves: dict[str, set[str]] = getattr(processor, "halves", {})
    return [(name, "up" if "gate" in seen else "gate") for name, seen in halves.items()
            if "down" not in seen and seen != {"gate", "up"}]


def _gathering() -> type[Any]:
    """transformers' Qwen2-MoE processor (the expert stacks gathered into ``gate_up_proj``/``down_proj``) that
    records the halves it fills."""
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import Qwen2MoeTensorProcessor

    class Gathering(Qwen2MoeTensorProcessor):
        def __init__(self, config: Mapping[str, object]) -> None:
            super().__init__(config=config)  # type: ignore[no-untyped-call]
            self.halves: dict[str, set[str]] = {}

        def _set_moe_expert_tensor(self, weights: np.ndarray, parsed_parameters: dict[str, dict[str, Any]],
                                   hf_name: str, w: str) -> None:
            self.halves.setdefault(hf_name, set()).add(w)
            super()._set_moe_expert_tensor(weights, parsed_parameters, hf_name, w)

    return Gathering


def _llama_moe_processor(config: dict[str, Any]) -> TensorProcessor:
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import GGUFTensor
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    n_experts = int(config["num_local_experts"])

    class LlamaMoe(_gathering()):  # type: ignore[misc]
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__(config)
            self.stacks: dict[str, tuple[np.ndarray, set[int]]] = {}  # a block's experts read so far, and which

        def process(self, weights: Any, name: str, **kwargs: Any) -> Any:
            if ".attn_q." in name or ".attn_k." in name:
                return LlamaTensorProcessor(config=self.config).process(weights, name, **kwargs)
            if m := PER_EXPERT.fullmatch(name):
                self._one_expert(weights, m, kwargs)
                return GGUFTensor(weights, None, {})  # type: ignore[arg-type]  # as transformers returns it
            return super().process(weights, name, **kwargs)

        def _one_expert(self, weights: np.ndarray, m: re.Match[str], kwargs: Mapping[str, object]) -> None:
            """Expert E's matrix into its block's stack; the stack, once all ``n_experts`` are in, processed as
            the merged ``ffn_*_exps`` tensor of a newer file."""
            expert, merged = int(m["xid"]), f"blk.{m['bid']}.ffn_{m['w']}_exps"
            if expert >= n_experts:
                raise ValueError(f"GGUF tensor {m[0]} names expert {expert}; the file's metadata says "
                                 f"{n_experts} experts (llama.expert_count)")
            stack, seen = self.stacks.setdefault(merged, (np.zeros((n_experts, *weights.shape), np.float32), set()))
            stack[expert] = weights
            seen.add(expert)
            if len(seen) == n_experts:
                del self.stacks[merged]
                super().process(stack, f"{merged}.weight", **kwargs)

    processor: TensorProcessor = LlamaMoe(config)
    return processor
