"""Built-in model shapes that need no network: data, not code paths.

Each preset is a ``model_type`` plus config keyword arguments for the
corresponding ``transformers`` config class; the published shapes of the
original checkpoints. Used by ``params`` (counting on the meta device) and by
``--init random`` (a randomly initialised model, labelled untrained).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig

_GPT2 = dict(vocab_size=50257, n_positions=1024, bos_token_id=50256, eos_token_id=50256)

PRESETS: dict[str, tuple[str, dict[str, int | float | bool]]] = {
    "gpt2": ("gpt2", dict(_GPT2, n_embd=768, n_layer=12, n_head=12)),
    "gpt2-medium": ("gpt2", dict(_GPT2, n_embd=1024, n_layer=24, n_head=16)),
    "gpt2-large": ("gpt2", dict(_GPT2, n_embd=1280, n_layer=36, n_head=20)),
    "gpt2-xl": ("gpt2", dict(_GPT2, n_embd=1600, n_layer=48, n_head=25)),
    # LLaMA-1 7B (Touvron et al. 2023): untied LM head, SwiGLU FFN of 11008.
    "llama-7b": ("llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                               max_position_embeddings=2048, rms_norm_eps=1e-6,
                               tie_word_embeddings=False)),
    # Mixtral 8x7B v0.1: 8 routed experts, top-2 per token, grouped-query attention.
    "mixtral-8x7b": ("mixtral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                     num_local_experts=8, num_experts_per_tok=2,
                                     max_position_embeddings=32768, rms_norm_eps=1e-5,
                                     rope_theta=1e6, tie_word_embeddings=False)),
}

# Hub ids of the real checkpoints behind the presets, for loading real weights.
HUB_IDS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "llama-7b": "huggyllama/llama-7b",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset_config(name: str) -> PreTrainedConfig:
    """The ``transformers`` config for preset ``name``. Raises KeyError when unknown."""
    from transformers import AutoConfig

    model_type, kwargs = PRESETS[name]
    config: PreTrainedConfig = AutoConfig.for_model(model_type, **kwargs)
    return config
