"""What to load and how: one frozen :class:`ModelSpec`, built once from a command's options.

It travels whole: from the command to the engine (:func:`anatomy_cli.engine.load`), across the
serve protocol as its JSON form (:meth:`ModelSpec.to_dict` / :meth:`ModelSpec.from_dict`), and
into the server's model cache as its key. Standard library only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePath
from typing import Any

from anatomy_cli.errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    """A model and how to load it.

    ``model``: a preset name, Hugging Face id, directory or ``.gguf`` file (see
    :func:`anatomy_cli.models.resolve.resolve`). ``device``: auto|cpu|cuda|mps; ``dtype``:
    fp32|bf16|fp16; ``init``: pretrained|random. ``device_map`` (auto|balanced|sequential),
    ``max_memory`` (the ``--max-memory`` text, e.g. ``0=20GiB,cpu=60GiB``) and ``offload_folder``
    place a big model through accelerate (see :mod:`anatomy_cli.models.bigmodel`).
    """

    model: str = "gpt2"
    device: str = "auto"
    dtype: str = "fp32"
    init: str = "pretrained"
    trust_remote_code: bool = False
    device_map: str | None = None
    max_memory: str | None = None
    offload_folder: str | None = None

    def __post_init__(self) -> None:
        # Enum members (typer's choices) become their values, paths their text: the spec is plain data.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Enum):
                object.__setattr__(self, f.name, value.value)
            elif isinstance(value, PurePath):
                object.__setattr__(self, f.name, str(value))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, plain strings, booleans and nulls."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Inverse of :meth:`to_dict`. Raises UsageError naming an unknown key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown model option(s): {', '.join(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)
