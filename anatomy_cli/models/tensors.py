"""A checkpoint's weight tensors, one at a time, under transformers' parameter names.

:func:`open_tensors` reads a resolved :class:`~anatomy_cli.models.resolve.Source` without building the
model: the names, shapes and stored types come from the file headers, and :meth:`TensorReader.read`
returns one tensor (fp32, ``[out, in]`` as transformers holds it) at a time, so two models can be
compared while neither is in memory.

* safetensors (a ``save_pretrained`` directory, a cached Hub snapshot): ``safe_open`` per file, a
  tensor read on request. Buffers stored as weights (GPT-2's ``attn.bias`` masks, rotary ``inv_freq``)
  are left out. Names without the base model's prefix (GPT-2's Hub checkpoint stores ``h.0.attn...``)
  get it, so they equal the model's own names.
* GGUF (llama.cpp): the file memory-mapped, its tensor table read by ``read_gguf`` (the views shaped as
  ``gguf.GGUFReader`` shapes them); a tensor is dequantized by
  ``gguf.quants.dequantize`` when read, then passed through transformers' own per-architecture tensor
  processor (Llama's q/k rows are permuted back, Gemma's norms shifted ...) and named by transformers'
  own GGUF name map (``get_gguf_hf_weights_map``), exactly as ``from_pretrained(gguf_file=...)`` does.

A head tied to the token embedding (``tie_word_embeddings``; a GGUF without ``output.weight``) is
not listed: it is the embedding (:attr:`TensorReader.head_name` names it, :attr:`TensorReader.tied`).

Errors are one line: CheckpointError for a source without weight files (a preset, ``.bin`` weights),
an unreadable file, a tensor whose type gguf cannot dequantize.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from safetensors import safe_open

from anatomy_cli.errors import CheckpointError
from anatomy_cli.models import adapters
from anatomy_cli.models.headers import GGUFHeader
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.headers import read_safetensors
from anatomy_cli.models.headers import safetensors_files
from anatomy_cli.models.resolve import Source
from anatomy_cli.models.resolve import checkpoint_errors

if TYPE_CHECKING:
    import torch
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor
    from transformers.modeling_utils import PreTrainedModel

_BUFFERS = re.compile(r"\.attn\.(?:masked_)?bias$|\.inv_freq$|(?:^|\.)position_ids$|(?:^|\.)rope_freqs\.")


@dataclass(frozen=True)
class StoredTensor:
    """One weight tensor: transformers' ``name``, ``shape`` as transformers holds it (None when only the
    read tensor knows it), ``dtype`` as stored (``Q4_1``, ``Q8_0``, ``F32``, ``BF16`` ...), ``n_params``."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str
    n_params: int


@dataclass
class TensorReader:
    """The weight tensors of one checkpoint, read one at a time (see the module docstring).

    ``tensors``: name -> :class:`StoredTensor`, in file order (a tied head left out). ``model_type``:
    the config's; ``n_layers``; ``tied``: the head is the token embedding; ``embed_name`` /
    ``head_name``: the two names (None when the model has none); ``kind``: ``gguf`` | ``safetensors``.
    """

    spec: str
    kind: str
    model_type: str
    n_layers: int
    tensors: dict[str, StoredTensor]
    tied: bool
    embed_name: str | None
    head_name: str | None
    _read: Callable[[str], torch.Tensor] | None = field(repr=False, default=None)
    _close: Callable[[], None] | None = field(repr=False, default=None)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as a float32 torch tensor (dequantized for GGUF). Raises CheckpointError."""
        import torch

        if name not in self.tensors or self._read is None:
            raise CheckpointError(f"{self.spec}: no tensor {name}")
        with checkpoint_errors(f"{self.spec}: cannot read tensor {name}"):
            return self._read(name).to(torch.float32)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_tensors(source: Source, config: PreTrainedConfig) -> TensorReader:
    """A :class:`TensorReader` over ``source`` (kind ``gguf``, ``dir`` or a cached ``hub`` id) whose
    transformers config is ``config`` (:func:`anatomy_cli.models.model_files.read_config`).

    Raises CheckpointError: a preset (no weight files), a directory without safetensors files,
    an unreadable file.
    """
    if source.kind == "gguf":
        return _open_gguf(source, config)
    if source.kind == "preset":
        raise CheckpointError(f"{source.spec}: a preset has no weight files to compare (give a directory, "
                              f"a .gguf file or a cached Hugging Face id)")
    folder = Path(source.ref) if source.kind == "dir" else _hub_snapshot(source)
    return _open_safetensors(source.spec, folder, config)


def _hub_snapshot(source: Source) -> Path:
    from huggingface_hub import snapshot_download

    with checkpoint_errors(f"{source.spec}: cannot find its safetensors files"):
        return Path(snapshot_download(source.ref, allow_patterns=["*.safetensors", "*.safetensors.index.json",
                                                                  "config.json"],
                                      local_files_only=source.local_only))


def _meta_model(config: PreTrainedConfig) -> PreTrainedModel:
    """The model for ``config`` on the meta device (names, tying; no storage)."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    causal = adapters.for_config(config).causal
    archs = getattr(config, "architectures", None) or []
    auto: type[transformers.AutoModel | transformers.AutoModelForCausalLM | transformers.AutoModelForMaskedLM]
    if causal:
        auto = transformers.AutoModelForCausalLM
    elif any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        auto = transformers.AutoModelForMaskedLM
    else:
        auto = transformers.AutoModel
    auto_model: PreTrainedModel
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            auto_model = auto.from_config(config)
            return auto_model
    finally:
        hf_logging.set_verbosity(previous)


def _tying(model: PreTrainedModel) -> tuple[bool, str | None, str | None]:
    """(tied, embedding name, head name) of a meta model, by parameter identity."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = None
    emb_names = names.get(id(emb.weight), []) if emb is not None else []
    emb_name = emb_names[0] if emb_names else None
    head_names = names.get(id(head.weight), []) if head is not None and hasattr(head, "weight") else []
    tied = head is not None and emb is not None and head.weight is emb.weight
    if tied:
        head_name = next((n for n in head_names if n != emb_name), None)
    else:
        head_name = head_names[0] if head_names else None
    return tied, emb_name, head_name


def _n_layers(config: PreTrainedConfig) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0) or 0)


def _open_safetensors(spec: str, folder: Path, config: PreTrainedConfig) -> TensorReader:

    files = safetensors_files(folder)
    if not files:
        raise CheckpointError(f"{spec}: no safetensors weights (model.safetensors) to read one tensor at a time")
    model = _meta_model(config)
    tied, emb_name, head_name = _tying(model)
    known = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    prefix = getattr(model, "base_model_prefix", "") or ""
    where: dict[str, tuple[Path, str]] = {}
    tensors: dict[str, StoredTensor] = {}
    for path in files:
        for info in read_safetensors(path):
            if _BUFFERS.search(info.name):
                continue
            name = info.name
            if name not in known and prefix and f"{prefix}.{name}" in known:
                name = f"{prefix}.{name}"
            if tied and name == head_name:
                continue  # the head is the embedding: compared once
            where[name] = (path, info.name)
            tensors[name] = StoredTensor(name, info.shape, info.dtype, info.n_params)
    handles: dict[Path, safe_open] = {}

    def read(name: str) -> torch.Tensor:
        path, stored = where[name]
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        tensor: torch.Tensor = handles[path].get_tensor(stored)
        return tensor

    return TensorReader(spec, "safetensors", config.model_type, _n_layers(config), tensors, tied, emb_name,
                        head_name, read, handles.clear)


def _weights_map(build: Callable[[PreTrainedModel, TensorProcessor], dict[str, str]], model: PreTrainedModel,
                 processor: TensorProcessor) -> dict[str, str]:
    """transformers' GGUF -> transformers name map. It walks every submodule and rebuilds gguf's name table
    for each (SmolLM2: 397 times, 6.5 s); the table depends only on (architecture, layers), so it is built once."""
    import gguf

    real = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real)
    try:
        return build(model, processor)
    finally:
        gguf.get_tensor_name_map = real


@dataclass(frozen=True)
class _GGUFTensor:
    """A GGUF file's tensor as ``gguf.GGUFReader`` lists it, with what ``dequantize`` and :func:`_open_gguf` read:
    its ggml type, its shape (ggml order), its element count and its data, a view of the file's memory map."""

    name: str
    tensor_type: Any
    shape: tuple[int, ...]
    n_elements: int
    data: Any


_GGUF_PLAIN = {"F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "I16": "int16", "I32": "int32",
               "I64": "int64"}  # stored as numpy numbers; every other type as bytes, as GGUFReader keeps them


def _gguf_tensors(header: GGUFHeader) -> list[_GGUFTensor]:
    """The tensors of ``header``'s file as views of one read-only memory map, shaped as ``gguf.GGUFReader`` shapes
    them, from the tensor table :func:`read_gguf` read (GGUFReader itself takes 2.5-4 s on SmolLM2 making a numpy
    view of every vocabulary string)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    buf = np.memmap(header.path, dtype=np.uint8, mode="r")
    out = []
    for t in header.tensors:
        kind = GGMLQuantizationType[t.dtype]
        raw = buf[header.data_start + t.offset:header.data_start + t.offset + t.n_bytes]
        dims = tuple(reversed(t.shape))
        data = (raw.view(np.dtype(_GGUF_PLAIN[t.dtype])).reshape(dims) if t.dtype in _GGUF_PLAIN
                else raw.reshape(quant_shape_to_byte_shape(dims, kind)))
        out.append(_GGUFTensor(t.name, kind, t.shape, t.n_params, data))
    return out


def _open_gguf(source: Source, config: PreTrainedConfig) -> TensorReader:
    import numpy as np
    import torch
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map


    header = read_gguf(source.ref)  # one-line errors for a truncated or corrupt file, before gguf's reader
    with checkpoint_errors(f"{source.spec}: cannot read the GGUF tensors"):
        stored = _gguf_tensors(header)
    model = _meta_model(config)
    tied, emb_name, head_name = _tying(model)
    # transformers' processor takes the config as a dict of its own keys (num_attention_heads, ...).
    processor_class: type[TensorProcessor] = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)
    processor = processor_class(config=config.to_dict())
    mapping = _weights_map(get_gguf_hf_weights_map, model, processor)
    by_gguf = {t.name: t for t in stored}
    sources: dict[str, list[str]] = {}
    for gguf_name in by_gguf:
        hf = mapping.get(gguf_name)
        if hf is None or _BUFFERS.search(gguf_name) or (tied and hf == head_name):
            continue
        sources.setdefault(hf, []).append(gguf_name)
    tensors: dict[str, StoredTensor] = {}
    for hf, names in sources.items():
        parts = [by_gguf[n] for n in names]
        dtypes = list(dict.fromkeys(p.tensor_type.name for p in parts))
        shape = tuple(reversed(parts[0].shape)) if len(parts) == 1 else None
        tensors[hf] = StoredTensor(hf, shape, "+".join(dtypes), sum(int(p.n_elements) for p in parts))

    def read(name: str) -> torch.Tensor:
        parsed: dict[str, Any] = {"tensors": {}}
        out = None
        for gguf_name in sources[name]:
            t = by_gguf[gguf_name]
            try:
                weights = dequantize(t.data, t.tensor_type)
            except NotImplementedError:
                raise CheckpointError(f"{source.spec}: tensor {gguf_name} has type {t.tensor_type.name}, which the "
                                      f"gguf package cannot dequantize") from None
            result = processor.process(weights=weights, name=gguf_name, tensor_key_mapping=mapping,
                                       parsed_parameters=parsed)
            if result.name is not None:
                w = np.ascontiguousarray(result.weights)
                out = torch.from_numpy(w if w.flags.writeable else w.copy())  # F32 tensors: views of the map
        return out if out is not None else parsed["tensors"][name]

    return TensorReader(source.spec, "gguf", config.model_type, _n_layers(config), tensors, tied, emb_name,
                        head_name, read, None)
