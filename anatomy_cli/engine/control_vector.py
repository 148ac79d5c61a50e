"""llama.cpp control vectors: the GGUF file ``--control-vector`` reads.

Layout (what repeng's ``export_gguf`` writes and llama.cpp's ``llama_control_vector_load`` reads): architecture
``controlvector``, ``controlvector.model_hint`` (the model type, e.g. ``llama``), ``controlvector.layer_count``
(how many directions), one F32 tensor ``direction.{N}`` ``[n_embd]`` per layer.

Numbering: llama.cpp adds ``direction.N`` to the output of its layer N (0-based, the same count as
transformers' ``model.layers[N]``), after the layer's last residual addition: that is anatomy's
``blocks.N.hook_resid_post``. So anatomy's block L is ``direction.L`` with no offset. llama.cpp keeps no vector
for layer 0 (its buffer starts at layer 1), so block 0 cannot be exported, and only ``resid_post`` vectors
have a llama.cpp equivalent.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    from gguf import GGUFReader

ARCH = "controlvector"


def check_exportable(layers: list[int], site: str) -> None:
    """UsageError unless blocks ``layers`` at ``site`` have a llama.cpp control vector (resid_post, block >= 1)."""
    if site != "resid_post":
        raise UsageError(f"llama.cpp adds control vectors at block outputs (resid_post); this vector is at {site}")
    if 0 in layers:
        raise UsageError("llama.cpp has no control vector for layer 0 (its directions start at 1): "
                         "make the vector at --layer 1 or later")


def write(directions: dict[int, np.ndarray], path: Path, *, model_hint: str, site: str = "resid_post") -> None:
    """Write ``{block: [d_model] vector}`` (already scaled as llama.cpp should add it) to ``path``.

    Raises UsageError for a site other than ``resid_post`` or a block 0 direction, AnatomyError when the file
    cannot be written."""
    import gguf

    check_exportable(list(directions), site)
    try:
        writer = gguf.GGUFWriter(str(path), ARCH)
        writer.add_string(f"{ARCH}.model_hint", model_hint)
        writer.add_uint32(f"{ARCH}.layer_count", len(directions))
        for layer in sorted(directions):
            writer.add_tensor(f"direction.{layer}", np.ascontiguousarray(directions[layer], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except OSError as e:
        raise AnatomyError(f"cannot write {path}: {e.strerror or e}") from None


def read(path: Path) -> tuple[dict[int, np.ndarray], str | None]:
    """A control vector file's ``{block: [n_embd] float32}`` (``direction.N`` -> block N's ``resid_post``) and
    its model hint. Raises UsageError for a GGUF file that is not a control vector."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError and others for a file that is not GGUF
        raise UsageError(f"{path} is not a GGUF file: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
    arch = _string(reader, "general.architecture")
    if arch != ARCH:
        raise UsageError(f"{path} is a GGUF file of architecture {arch!r}, not a control vector ({ARCH})")
    directions = {}
    for tensor in reader.tensors:
        if tensor.name.startswith("direction."):
            try:
                layer = int(tensor.name.split(".", 1)[1])
            except ValueError:
                raise UsageError(f"{path}: tensor {tensor.name} is not direction.<layer>") from None
            directions[layer] = np.array(tensor.data, dtype=np.float32).reshape(-1)
    if not directions:
        raise UsageError(f"{path} has no direction.N tensors")
    return directions, _string(reader, f"{ARCH}.model_hint")


def _string(reader: GGUFReader, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None or not len(field.parts):
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
