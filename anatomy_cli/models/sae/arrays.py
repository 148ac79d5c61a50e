"""An SAE file's arrays, read whole or as shapes only (models/sae/read.py's ``values=False``): a safetensors file
through its header, a Gemma Scope ``params.npz`` through its members' ``.npy`` headers. A shape-only array is a
zero-strided stand-in (``np.broadcast_to``, no memory): its shape is all the checks and a cost estimate read.
Every failure is one CheckpointError line.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
from safetensors import SafetensorError

from anatomy_cli.errors import CheckpointError
from anatomy_cli.models.headers import read_safetensors

Array = npt.NDArray[np.generic]


def _stand_in(shape: tuple[int, ...]) -> Array:
    """An array of ``shape`` that holds no memory (``values=False``): only its shape is read."""
    return np.broadcast_to(np.float32(0), shape)


def safetensors_arrays(path: Path, values: bool = True) -> dict[str, Array]:
    """A safetensors file's arrays (numpy); ``values=False``: stand-ins of their shapes from its header
    (models/headers.py ``read_safetensors``, which also refuses a truncated file: the one message for it, whether
    the values are read or not)."""
    from safetensors.numpy import load_file

    if not values:
        return {t.name: _stand_in(t.shape) for t in read_safetensors(path)}
    try:
        return dict(load_file(str(path)))
    except (SafetensorError, OSError, ValueError) as e:
        read_safetensors(path)  # a truncated file or no safetensors: the header's own words, as values=False says
        size = path.stat().st_size
        raise CheckpointError(f"{path} cannot be read (truncated or not safetensors: {size} bytes; {e})") from None


def npz_arrays(path: Path, values: bool = True) -> dict[str, Array]:
    """A params.npz's arrays; ``values=False``: their shapes from the members' .npy headers (no data read)."""
    try:
        if values:
            with np.load(path) as npz:
                return {name: np.asarray(npz[name]) for name in npz.files}
        out = {}
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                with z.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    out[member.removesuffix(".npy")] = _stand_in(tuple(read_header(f)[0]))
        return out
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path} cannot be read (truncated or not an .npz: {e})") from None
