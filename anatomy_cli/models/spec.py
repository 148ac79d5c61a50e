"""What to load and how: one frozen :class:`ModelSpec`, built once from a command's options.

It travels whole: from the command to the engine (:func:`anatomy_cli.engine.loading.load`), across the
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
from anatomy_cli.models import bigmodel

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
INITS = ("pretrained", "random")


@dataclass(frozen=True)
class ModelSpec:
    """A model and how to load it.

    ``model``: a preset name, Hugging Face id, directory or ``.gguf`` file (see
    :func:`anatomy_cli.models.resolve.resolve`). ``device``: auto|cpu|cuda|mps; ``dtype``:
    fp32|bf16|fp16; ``init``: pretrained|random. ``device_map`` (auto|balanced|sequential),
    ``max_memory`` (the ``--max-memory`` text, e.g. ``0=20GiB,cpu=60GiB``) and ``offload_folder``
    place a big model through accelerate (see :mod:`anatomy_cli.models.bigmodel`).

    Validated once, here: enum members become their values, paths their text; an unknown device, dtype,
    init or device map, ``--device`` with ``--device-map``, ``--max-memory`` or ``--offload-folder``
    without a device map, bad ``--max-memory`` syntax and a device map with ``--init random`` raise
    UsageError. (Whether this machine has the GPU a budget names is checked when the weights load.)
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
        self._validate()

    def _validate(self) -> None:
        if str(self.device).split(":")[0] not in DEVICES:
            raise UsageError(f"unknown device '{self.device}'; use auto, cpu, cuda or mps")
        if self.dtype not in DTYPE_NAMES:
            raise UsageError(f"unknown dtype '{self.dtype}'; use {', '.join(DTYPE_NAMES)}")
        if self.init not in INITS:
            raise UsageError(f"unknown init '{self.init}'; use pretrained or random")

        if self.device_map is None:
            bigmodel.placement_kwargs(None, self.max_memory, self.offload_folder)  # a budget needs a map
            return
        if self.device != "auto":
            raise UsageError(f"--device {self.device} and --device-map exclude each other: "
                             "the device map decides where each block goes")
        if self.device_map not in bigmodel.DEVICE_MAPS:
            raise UsageError(f"unknown --device-map '{self.device_map}'; use {', '.join(bigmodel.DEVICE_MAPS)}")
        if self.init == "random":
            raise UsageError("--device-map places a checkpoint's weights as they are read; --init random builds "
                             "the whole model in memory first: use --device, or save the model and load that "
                             "directory")
        if isinstance(self.max_memory, str):
            bigmodel.parse_max_memory(self.max_memory)

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
