"""The model in JSON: the one record every command's output starts with.

``{"model": "gpt2", "untrained": false, "dtype": "fp32", "dequantized_from": null}``: ``model`` is the spec as
given (a preset, Hub id, directory or file; the headings say the short label), ``untrained`` True for random
weights (``--init random``), ``dtype`` the weights' dtype as ``--dtype`` names it, ``dequantized_from`` the GGUF
quantization the weights were dequantized from, else None. ``tasks.session.prompt_record`` puts the prompt after it.
No torch at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models.headers import quantization_label
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.resolve import resolve

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.spec import ModelSpec


def dtype_name(lm: LoadedModel) -> str:
    """``fp32``, ``bf16`` or ``fp16``: the weights' dtype as ``--dtype`` names it (engine.DTYPES)."""
    from anatomy_cli.engine.model import DTYPES  # torch is loaded already: lm holds its tensors

    return next((name for name, dtype in DTYPES.items() if dtype == lm.dtype), str(lm.dtype))


def model_record(lm: LoadedModel) -> dict[str, Any]:
    """The loaded model's record: ``model``, ``untrained``, ``dtype``, ``dequantized_from``."""
    return {"model": lm.name, "untrained": lm.untrained, "dtype": dtype_name(lm),
            "dequantized_from": lm.dequantized_from}


def spec_record(spec: ModelSpec) -> dict[str, Any]:
    """The same record for a model this process has not loaded (`corpus --ray`: the workers load it), from its
    spec; ``dequantized_from`` read from a GGUF file's header, as loading it would say."""
    return {"model": spec.model, "untrained": spec.init == "random", "dtype": spec.dtype,
            "dequantized_from": None if spec.init == "random" else _quantization(spec)}


def _quantization(spec: ModelSpec) -> str | None:
    source = resolve(spec.model, need="weights", init=spec.init)
    return quantization_label(read_gguf(source.ref)) if source.kind == "gguf" else None
