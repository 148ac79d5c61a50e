"""`diff` on weights, before any tensor: the two checkpoints' headers (config.json, GGUF metadata).

Two models of different families or shapes are told apart from what their headers say, at once: no
tensor is listed or read (listing a GGUF's tensors the transformers way can take half a minute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.errors import UnsupportedArchitecture
from anatomy_cli.errors import UsageError
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.model_files import read_config
from anatomy_cli.models.resolve import resolve
from anatomy_cli.models.resolve import short_name

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig

    from anatomy_cli.models.resolve import Source

# The shape facts (ModelInfo fields) two models must share for their tensors to pair up, in words.
_SHAPES = (("n_layers", "layers"), ("d_model", "width (d_model)"), ("n_heads", "attention heads"),
           ("n_kv_heads", "key/value heads"), ("d_head", "head width"), ("lm_head_rows", "vocabulary rows"))


@dataclass(frozen=True)
class Header:
    """A ``--model`` spec, its resolved :class:`~anatomy_cli.models.resolve.Source` and its transformers config."""

    spec: str
    source: Source
    config: PreTrainedConfig


def read_header(spec: str, *, trust_remote_code: bool = False) -> Header:
    """``spec``'s header, no tensor read. Raises what resolving and reading the config raise."""

    source = resolve(spec, need="weights")
    return Header(spec, source, read_config(source, trust_remote_code=trust_remote_code))


def check_headers(a: Header, b: Header) -> None:
    """Raise UsageError when the headers say A and B differ in family or shape (the first fact that differs)."""

    name_a, name_b = short_name(a.spec), short_name(b.spec)
    info_a: ModelInfo | None
    info_b: ModelInfo | None
    try:
        info_a, info_b = ModelInfo.from_config(a.config), ModelInfo.from_config(b.config)
    except (UnsupportedArchitecture, AttributeError, TypeError, ValueError):
        info_a = info_b = None  # a family without an adapter: its model_type, then the tensors decide
    family_a, family_b = ((info_a.adapter.name, info_b.adapter.name) if info_a and info_b
                          else (str(a.config.model_type), str(b.config.model_type)))
    if family_a != family_b:
        type_a, type_b = a.config.model_type, b.config.model_type
        raise UsageError(f"{name_a} is a {type_a} model and {name_b} a {type_b} model (from their headers): "
                         f"the two models differ in architecture")
    for field, words in _SHAPES if info_a and info_b else ():
        va, vb = getattr(info_a, field), getattr(info_b, field)
        if va != vb:
            raise UsageError(f"{name_a} has {va} {words} and {name_b} {vb} (from their headers): "
                             f"the two models differ in shape")
