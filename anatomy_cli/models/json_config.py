"""config.json read as JSON, no torch: :class:`JsonConfig`, the config the light open path (models/light.py)
hands to :class:`~anatomy_cli.models.info.ModelInfo` and the adapters in place of transformers' own."""

from __future__ import annotations

from typing import Any

# transformers' attribute_map for the architectures whose config.json uses other names.
_ALIASES = {
    "gpt2": {"num_hidden_layers": "n_layer", "max_position_embeddings": "n_positions", "hidden_size": "n_embd",
             "num_attention_heads": "n_head"},
    "gptj": {"num_hidden_layers": "n_layer", "max_position_embeddings": "n_positions", "hidden_size": "n_embd",
             "num_attention_heads": "n_head"},
}


class JsonConfig:
    """config.json's values as attributes (``config.model_type``, ``config.num_hidden_layers``), with the
    architecture's own names mapped as transformers maps them (GPT-2's ``n_layer``). A key config.json
    does not hold raises AttributeError (transformers' class default is not known here), so
    ``getattr(config, key, None)`` is None. ``get_text_config()`` answers as transformers' does: the nested
    ``text_config`` when there is one, else the config itself."""

    def __init__(self, values: dict[str, object]):
        self.__dict__["_values"] = dict(values)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__["_values"]
        if name in values:
            return values[name]
        alias = _ALIASES.get(values.get("model_type"), {}).get(name)
        if alias is not None and alias in values:
            return values[alias]
        raise AttributeError(name)

    def get_text_config(self) -> JsonConfig:
        nested = self.__dict__["_values"].get("text_config")
        return JsonConfig(nested) if isinstance(nested, dict) else self

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__["_values"])
