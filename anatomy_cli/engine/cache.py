"""The per-prompt activation cache that :func:`~anatomy_cli.engine.running` returns."""

from __future__ import annotations

import torch

from anatomy_cli.models import sites
from anatomy_cli.text.tokenization import Encoded


class Cache:
    """The activations of one prompt, real tokens only.

    Tensors are ``[pos, d_model]`` (``logits``: ``[pos, vocab]``) in the model's dtype on
    ``lm.device``, where pos runs over ``positions`` (the absolute token positions kept,
    all of them unless :func:`run` was given positions). Keys are hook names or
    ``(kind, layer)`` pairs: ``cache["resid_post", -1]`` is ``blocks.{L-1}.hook_resid_post``.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], *, encoded: Encoded, positions: list[int],
                 n_layers: int):
        self._tensors = tensors
        self.encoded = encoded
        self.positions = positions
        self.n_layers = n_layers

    @property
    def names(self) -> list[str]:
        return list(self._tensors)

    def _name(self, key: str | tuple[str, int]) -> str:
        if isinstance(key, tuple):
            kind, layer = key
            if not -self.n_layers <= layer < self.n_layers:
                raise KeyError(f"layer {layer} is out of range for {self.n_layers} layers")
            try:
                return sites.name(layer % self.n_layers, kind)
            except ValueError:
                raise KeyError(f"'{kind}' is not a hook point inside a block") from None
        return key

    def __getitem__(self, key: str | tuple[str, int]) -> torch.Tensor:
        name = self._name(key)
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"'{name}' was not captured (captured: {', '.join(self._tensors) or 'nothing'})") \
                from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (str, tuple)) and self._name(key) in self._tensors

    def get(self, key: str | tuple[str, int], default: torch.Tensor | None = None) -> torch.Tensor | None:
        return self[key] if key in self else default

    @property
    def logits(self) -> torch.Tensor:
        """``[pos, vocab]``: the model's own logits at the kept positions."""
        return self["logits"]

    def stack(self, kind: str) -> torch.Tensor:
        """``[n_layers, pos, d_model]``: ``blocks.{l}.hook_{kind}`` for l = 0..L-1."""
        return torch.stack([self[kind, layer] for layer in range(self.n_layers)])

    def residual_stream(self) -> torch.Tensor:
        """``[n_layers + 1, pos, d_model]``: index 0 the reading named ``embed`` (``blocks.0.hook_resid_pre``),
        index i the output of block i - 1 (raw, before the final norm); names: ``sites.residual_label(i)``.
        Needs the names from :func:`residual_names`."""
        return torch.stack([self["resid_pre", 0]] + [self["resid_post", layer] for layer in range(self.n_layers)])
