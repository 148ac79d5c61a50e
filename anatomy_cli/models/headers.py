"""What a checkpoint file says about its tensors, read from its header alone. No torch, no transformers.

* GGUF (llama.cpp): the key/value metadata and the tensor table, from a memory map. The
  layout is gguf's (``GGUF`` magic, version, counts, typed values, then one entry per tensor:
  name, shape, ``GGMLQuantizationType``, offset); the type names, block sizes and bytes per
  block come from the ``gguf`` package (``GGML_QUANT_SIZES``, :func:`gguf_constants`). The walk itself is written
  here because ``gguf.GGUFReader`` turns every vocabulary string into a numpy view: 2.5-4 s
  on SmolLM2's 49,152 tokens and merges, longer than importing torch. Tests check this
  reader against ``GGUFReader`` field by field.
* safetensors: the 8-byte little-endian header length and the JSON header of each file
  (``model.safetensors``, or the shards listed in ``model.safetensors.index.json``). No
  tensor data is read.

Errors are :class:`~anatomy_cli.errors.CheckpointError` with one-line messages: not a GGUF
file, a truncated or corrupt file, a header that is not JSON.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from anatomy_cli.errors import CheckpointError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor: ``name`` as in the file, ``shape`` (GGUF: ggml order, fastest axis first),
    ``dtype`` (``Q4_1``, ``F32``, ``BF16`` ...), ``n_params`` elements and ``n_bytes`` on disk;
    ``offset``: GGUF, where its data starts, from the start of the data section (safetensors: 0)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    n_params: int
    n_bytes: int
    offset: int = 0


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's header. ``fields`` holds every key; an array value longer than 64 entries
    is kept as its length only (``array_lengths``), e.g. ``tokenizer.ggml.tokens``. ``data_start``: the byte
    where the tensor data section begins (everything before it is the header)."""

    path: str
    version: int
    fields: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[TensorInfo, ...]
    file_size: int
    data_start: int = 0

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))

    @property
    def quantization(self) -> str:
        """The one quantization label every command shows (``params``, ``models``, the ``dequantized from`` of
        the weight commands): :func:`quantization_label`."""
        return quantization_label(self)

    @property
    def block_count(self) -> int | None:
        """The blocks the header states (``{architecture}.block_count``); None where it states no positive whole
        number. An upper bound: a header may count extra blocks (MTP), never fewer."""
        n = self.field("block_count")
        return n if isinstance(n, int) and n > 0 else None

    @property
    def context_length(self) -> int | None:
        """The context the header states (``{architecture}.context_length``, which transformers' GGUF reader makes
        the config's ``max_position_embeddings``: ``ModelInfo.n_ctx``); None where it states no positive whole
        number."""
        n = self.field("context_length")
        return n if isinstance(n, int) and n > 0 else None

    def field(self, suffix: str, default: object = None) -> Any:
        """``{architecture}.{suffix}``, e.g. ``field("block_count")``."""
        return self.fields.get(f"{self.architecture}.{suffix}", default)


# llama.cpp's LlamaFileType values carry this bit when the type was guessed from the tensors.
_GUESSED = 1024


def file_type_name(header: GGUFHeader) -> str | None:
    """``general.file_type`` as llama.cpp names it (``Q4_K_M``, ``Q4_1``, ``F32``); None when absent or unknown."""
    value = header.fields.get("general.file_type")
    if not isinstance(value, int):
        return None
    try:
        name: str = gguf_constants().LlamaFileType(value & ~_GUESSED).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _file_type_base(name: str) -> str:
    # The tensor type a file type is named after: Q4_K_M and Q4_K_S -> Q4_K; Q4_1, F16, IQ2_XS -> themselves.
    return re.sub(r"^(Q\d_K)_[SML]$", r"\1", name)


def quantization_label(header: GGUFHeader) -> str:
    """What the weights were quantized as: the file type, then the set of types its matrices are stored in
    when that set is not just the file type: ``Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)``, ``Q4_1 (Q4_1, Q8_0)``, ``F32``.

    Only tensors of two or more dimensions count: llama.cpp keeps every 1-D tensor (norms, biases) in F32
    whatever the file type, so listing F32 would say nothing about the choice made. Without a known
    ``general.file_type``, or when no matrix is stored in the type the file type is named after (a file
    requantized without updating it), the tensors win: the label is the set alone (``Q8_0``).
    """
    mix = sorted({t.dtype for t in header.tensors if len(t.shape) >= 2} or {t.dtype for t in header.tensors})
    name = file_type_name(header)
    if name is None or (mix and _file_type_base(name) not in mix):
        return ", ".join(mix)
    return name if mix in ([], [name]) else f"{name} ({', '.join(mix)})"


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise CheckpointError(f"{self.path}: the GGUF header is truncated (file ends at byte {len(self.buf)})")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise CheckpointError(f"{self.path}: the GGUF header is truncated (file ends at byte {len(self.buf)})")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        # The hot loop of a header read (SmolLM2: 98,052 vocabulary strings): one unpack per string.
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:
            pos = len(buf) + 1
        if pos > len(buf):
            raise CheckpointError(f"{self.path}: the GGUF header is truncated (file ends at byte {len(buf)})")
        self.pos = pos


_U64 = struct.Struct("<Q")
# GGUFValueType -> struct format for the fixed-size scalars.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LONG_ARRAY = 64


def _value(cur: _Cursor, vtype: int, key: str, lengths: dict[str, int]) -> Any:
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype])[0]
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        etype, count = cur.unpack("<IQ")
        if count > _LONG_ARRAY:
            lengths[key] = count
            if etype == _STRING:
                cur.skip_strings(count)
            elif etype in _SCALARS:
                cur.pos += count * struct.calcsize(_SCALARS[etype])
            else:
                raise CheckpointError(f"{cur.path}: GGUF key {key} is a long array of arrays (unsupported)")
            return None
        return [_value(cur, etype, key, lengths) for _ in range(count)]
    raise CheckpointError(f"{cur.path}: GGUF key {key} has unknown value type {vtype}: the file is corrupt")


@functools.lru_cache(maxsize=1)
def gguf_constants() -> ModuleType:
    """The ``gguf`` package's ``constants`` module (``GGMLQuantizationType``, ``GGML_QUANT_SIZES``).

    Executed on its own when the package is not imported yet: ``import gguf`` imports numpy and
    the reader, writer and quantizers (most of a header read's time), while ``constants.py``
    needs only ``enum``.
    """
    if "gguf.constants" in sys.modules:
        return sys.modules["gguf.constants"]
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("reading GGUF files needs the gguf package (pip install gguf)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "constants.py")
    loader_spec = importlib.util.spec_from_file_location("_anatomy_gguf_constants", path)
    if loader_spec is None or loader_spec.loader is None:
        raise CheckpointError(f"reading GGUF files needs the gguf package, and {path} cannot be loaded")
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return module


def is_gguf(path: str | Path) -> bool:
    """True when the file starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def read_gguf(path: str | Path) -> GGUFHeader:
    """The header of a GGUF file, memory-mapped; tensor data is never touched.

    Raises CheckpointError: not a GGUF file, a version other than 2 or 3, a truncated
    header, tensors that reach past the end of the file, an unknown tensor type.
    """
    constants = gguf_constants()
    GGML_QUANT_SIZES, GGMLQuantizationType = constants.GGML_QUANT_SIZES, constants.GGMLQuantizationType
    path = str(path)
    try:
        with open(path, "rb") as f:
            size = Path(path).stat().st_size
            if size < 24:
                raise CheckpointError(f"{path}: not a GGUF file ({size} bytes)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        if buf[:4] != GGUF_MAGIC:
            raise CheckpointError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
        cur = _Cursor(buf, path)
        cur.pos = 4
        version, n_tensors, n_kv = cur.unpack("<IQQ")
        if version not in (2, 3):
            raise CheckpointError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        fields: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string()
            (vtype,) = cur.unpack("<I")
            fields[key] = _value(cur, vtype, key, lengths)
        raw = []
        for _ in range(n_tensors):
            name = cur.string()
            (n_dims,) = cur.unpack("<I")
            dims = cur.unpack(f"<{n_dims}Q")
            qtype, offset = cur.unpack("<IQ")
            raw.append((name, dims, qtype, offset))
        align = int(fields.get("general.alignment", 32) or 32)
        data_start = -(-cur.pos // align) * align
    finally:
        buf.close()
    tensors = []
    for name, dims, qtype, offset in raw:
        try:
            kind = GGMLQuantizationType(qtype)
        except ValueError:
            raise CheckpointError(f"{path}: tensor {name} has unknown type {qtype}: the file is corrupt or newer "
                                  f"than the installed gguf package") from None
        block, type_size = GGML_QUANT_SIZES[kind]
        n = math.prod(dims)
        n_bytes = n // block * type_size
        if data_start + offset + n_bytes > size:
            raise CheckpointError(f"{path}: truncated: tensor {name} ends at byte {data_start + offset + n_bytes:,}, "
                                  f"the file at {size:,}")
        tensors.append(TensorInfo(name, tuple(int(d) for d in dims), kind.name, n, n_bytes, int(offset)))
    return GGUFHeader(path, version, fields, lengths, tuple(tensors), size, data_start)


# ---------------------------------------------------------------------------- safetensors

_ST_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
             "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_files(directory: str | Path) -> list[Path]:
    """The checkpoint's safetensors files: the shards named by ``model.safetensors.index.json``,
    else ``model.safetensors``; empty when there are none. Raises CheckpointError for a bad index
    or a missing shard."""
    d = Path(directory)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = list(dict.fromkeys(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: not a safetensors index (no weight_map)") from None
        missing = [n for n in names if not (d / n).is_file()]
        if missing:
            raise CheckpointError(f"{d}: shard {missing[0]} named in model.safetensors.index.json is missing")
        return [d / n for n in names]
    single = d / "model.safetensors"
    return [single] if single.is_file() else []


def read_safetensors(path: str | Path) -> list[TensorInfo]:
    """The tensors in one safetensors file's header (dtype and shape; bytes from the offsets).

    Raises CheckpointError for a truncated file or a header that is not safetensors JSON.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise CheckpointError(f"{path}: not a safetensors file or truncated (header length {n:,}, "
                                  f"file {size:,} bytes)")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise CheckpointError(f"{path}: the safetensors header is not valid JSON") from None
    out = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            shape = tuple(int(s) for s in entry["shape"])
            dtype = str(entry["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name} has no dtype, shape or offsets in the header") from None
        if 8 + n + end > size:
            raise CheckpointError(f"{path}: truncated: tensor {name} ends at byte {8 + n + end:,}, "
                                  f"the file at {size:,}")
        out.append(TensorInfo(name, shape, dtype, math.prod(shape), end - start))
    return out
