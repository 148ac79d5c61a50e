"""Loading a GGUF file's weights (llama.cpp) into a transformers model, tensor by tensor.

The header is parsed once (:func:`anatomy_cli.models.headers.read_gguf`) and checked so that each failure is
one line: a truncated or corrupt file, an architecture transformers cannot read from GGUF (the message names
those it can), a tensor type ``gguf`` cannot dequantize. The config comes from that header
(:mod:`anatomy_cli.models.gguf`), the tokenizer from the user cache (:mod:`anatomy_cli.models.gguf_tokenizer`).

The weights (:func:`load_weights`): the model is built with empty weights (accelerate's ``init_empty_weights``:
parameters on the meta device, buffers such as rotary frequencies computed as usual); then each GGUF tensor is
read and dequantized a block of rows at a time by the ``gguf`` package straight into a tensor of the asked dtype
that becomes the parameter, named by transformers' own GGUF name map (``get_gguf_hf_weights_map``). Tensors that
transformers' per-architecture ``TensorProcessor`` changes (LLaMA's q/k row permutation, Gemma's norms stored as
``w + 1``, MoE experts) are dequantized whole to float32, processed by that same processor, then cast. So the
peak is the model at ``dtype`` plus one such tensor, and the file's pages are never mapped.

A placement (``--device-map``) and the architectures of transformers' newer GGUF path (Qwen3.5, LFM2: its own
lazy loader) go through ``from_pretrained(folder, gguf_file=name)`` instead, with the config built here.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import torch

from anatomy_cli.engine.gguf_moe import half_filled
from anatomy_cli.engine.gguf_moe import moe_processor
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UnsupportedArchitecture
from anatomy_cli.errors import UsageError
from anatomy_cli.models import gguf
from anatomy_cli.models.headers import GGUFHeader
from anatomy_cli.models.headers import TensorInfo
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.resolve import Source
from anatomy_cli.models.resolve import checkpoint_errors

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor


class ModelClass(Protocol):
    """One of transformers' ``AutoModel*`` classes: builds the model of a config, or loads its weights."""

    def from_config(self, config: PreTrainedConfig, **kwargs: object) -> PreTrainedModel: ...

    # The model; with ``output_loading_info=True``, ``(model, {"missing_keys": ..., ...})``.
    def from_pretrained(self, path: str, **kwargs: object) -> Any: ...


def readable_architectures() -> list[str]:
    """GGUF ``general.architecture`` values transformers can turn into a config, and those anatomy reads itself
    (:data:`anatomy_cli.models.gguf.OWN_ARCHITECTURES`: OLMoE)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted({*GGUF_SUPPORTED_ARCHITECTURES, *gguf.OWN_ARCHITECTURES})


def _dequantizable(dtype: str) -> bool:
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType
    from gguf import dequantize

    kind = GGMLQuantizationType[dtype]
    _, type_size = GGML_QUANT_SIZES[kind]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def check_header(source: Source) -> GGUFHeader:
    """The header of ``source`` (a ``gguf`` Source), checked for what loading needs.

    Raises CheckpointError (truncated, corrupt, a tensor type gguf cannot dequantize),
    UnsupportedArchitecture (neither transformers nor anatomy reads the architecture from GGUF).
    """
    header = read_gguf(source.ref)
    arch = header.architecture
    readable = readable_architectures()
    if not arch:
        raise CheckpointError(f"{source.spec}: the GGUF header has no general.architecture")
    if arch not in readable and arch.replace("moe", "_moe") not in readable and arch.replace("-", "_") not in readable:
        raise UnsupportedArchitecture(f"{source.spec}: GGUF architecture '{arch}' cannot be read by transformers or "
                                      f"anatomy; they read {', '.join(readable)}")
    for dtype in dict.fromkeys(t.dtype for t in header.tensors):
        if not _dequantizable(dtype):
            import gguf.quants

            names = ["F32", "F16"] + sorted(t.name for t in gguf.quants._type_traits)
            raise CheckpointError(f"{source.spec}: tensor type {dtype} cannot be dequantized by the gguf package "
                                  f"(it dequantizes {', '.join(names)})")
    return header


def load_weights(source: Source, header: GGUFHeader, config: PreTrainedConfig, cls: ModelClass, dtype: torch.dtype,
                 placement: dict[str, object]) -> PreTrainedModel:
    """The model of ``config`` (an ``AutoModel*`` class ``cls``) in eval mode, its weights dequantized to ``dtype``.

    Raises CheckpointError (a tensor whose shape differs from the model's, weights the model needs that the file
    lacks, a file that ends early, anything transformers raises while loading).
    """
    from transformers.integrations.gguf import GGUF_ARCHS

    if placement and config.model_type == "mixtral" and header.architecture == "llama":
        raise UsageError(f"{source.spec}: a Mixtral GGUF file (llama.cpp's `llama` with experts) loads on one "
                         f"device: drop --device-map/--max-memory, or use --device")
    if placement and header.architecture in gguf.OWN_ARCHITECTURES:
        raise UsageError(f"{source.spec}: a GGUF file of architecture {header.architecture} (read by anatomy, not by "
                         f"transformers) loads on one device: drop --device-map/--max-memory, or use --device")
    if placement or header.architecture in GGUF_ARCHS:
        return _from_pretrained(source, config, cls, dtype, placement)
    with checkpoint_errors(f"{source.spec}: cannot load the GGUF weights"):
        return _stream(source, header, config, cls, dtype)


def _processor(header: GGUFHeader) -> TensorProcessor:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor

    config = gguf.config_dict(header)
    moe = moe_processor(config)  # MoE: the experts gathered (Mixtral written as `llama`, OLMoE: anatomy's own)
    if moe is not None:
        return moe
    cls: type[TensorProcessor] = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)
    return cls(config=config)


# transformers' own renames of a model_type to gguf-py's architecture name (get_gguf_hf_weights_map).
# Mixtral: llama.cpp writes it as `llama` (anatomy's own rename: transformers reads no Mixtral GGUF).
_GGUF_ARCH_NAMES = {"cohere": "command-r", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3",
                    "gemma4_text": "gemma4", "umt5": "t5", "minimax_m2": "minimax-m2", "gpt_oss": "gpt-oss",
                    "mixtral": "llama"}


def weights_map(model: PreTrainedModel, processor: TensorProcessor) -> dict[str, str]:
    """``{gguf tensor name: model parameter name}``: what transformers' ``get_gguf_hf_weights_map`` returns, with
    gguf-py's name table built once instead of once per submodule (397 times, 7-28 s, for SmolLM2). The same
    rules: every submodule's state-dict names are looked up relative to it, in module order; within one module
    the last name wins, across modules the first; names the table lacks go to the processor's fallback."""
    from gguf import MODEL_ARCH_NAMES
    from gguf import get_tensor_name_map

    model_type = _GGUF_ARCH_NAMES.get(model.config.model_type, model.config.model_type)
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == model_type), None)
    if arch is None:
        raise CheckpointError(f"the installed gguf package has no tensor names for model type {model_type}")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    keys = list(model.state_dict())
    out: dict[str, str] = {}
    for prefix, _ in model.named_modules():
        qual = f"{prefix}." if prefix else ""
        local: dict[str, str] = {}
        for key in keys:
            if not key.startswith(qual):
                continue
            hf_name = processor.preprocess_name(key[len(qual):])
            name, suffix = hf_name, ""
            if hf_name.endswith((".weight", ".bias")):
                name, suffix = hf_name.rsplit(".", 1)
                suffix = "." + suffix
            gguf_name = table.get_name(name)
            if gguf_name is None:
                processor.perform_fallback_tensor_mapping(local, suffix, qual, hf_name)
            else:
                local[gguf_name + suffix] = qual + hf_name
        for key, value in local.items():
            out.setdefault(key, value)
    return out


def _untouched(processor: TensorProcessor, info: TensorInfo, mapping: dict[str, str]) -> bool:
    """True when the processor hands this tensor back as it is (most weights): then it can be filled a block
    of rows at a time. Asked with a one-element stand-in; a processor that fails on it reshapes the tensor."""
    import numpy as np

    probe = np.zeros((1, 1), dtype=np.float32)
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}
    try:
        out = processor.process(weights=probe, name=info.name, tensor_key_mapping=mapping, parsed_parameters=parsed)
    except Exception:
        return False
    return out.weights is probe and out.name == info.name and not parsed["tensors"]


def _assign(model: torch.nn.Module, name: str, tensor: torch.Tensor, spec: str) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    old = module._parameters.get(leaf)
    if old is None:
        return
    if tuple(old.shape) != tuple(tensor.shape):
        raise CheckpointError(f"{spec}: GGUF tensor for {name} has shape {tuple(tensor.shape)}, the model "
                              f"{tuple(old.shape)}; the file's metadata and tensors disagree")
    module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=old.requires_grad)


def _stream(source: Source, header: GGUFHeader, config: PreTrainedConfig, cls: ModelClass,
            dtype: torch.dtype) -> PreTrainedModel:
    import numpy as np
    from accelerate import init_empty_weights
    with init_empty_weights(include_buffers=False):
        model = cls.from_config(config, dtype=dtype)
    processor = _processor(header)
    mapping = weights_map(model, processor)
    params = dict(model.named_parameters())
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}
    with open(header.path, "rb") as f:
        for info in header.tensors:
            if info.name in mapping and _untouched(processor, info, mapping):
                name = mapping[info.name]
                if name not in params:
                    continue
                shape = gguf.tensor_shape(info)
                out = torch.empty(shape, dtype=dtype)
                rows = out.view(-1, info.shape[0])
                for first, values in gguf.row_blocks(f, header, info):
                    rows[first:first + len(values)] = torch.from_numpy(values)
                _assign(model, name, out, source.spec)
                continue
            result = processor.process(weights=gguf.read_tensor(f, header, info), name=info.name,
                                       tensor_key_mapping=mapping, parsed_parameters=parsed)
            if result.name in mapping:
                tensor = torch.from_numpy(np.ascontiguousarray(result.weights))
                _assign(model, mapping[result.name], tensor.to(dtype), source.spec)
    if partial := half_filled(processor):
        name, half = partial[0]
        raise CheckpointError(f"{source.spec}: the GGUF file lacks the {half} half of {name} (its "
                              f"ffn_{half}_exps or ffn_{half}.E tensors); it is partial")
    for name, tensor in parsed.pop("tensors").items():  # what a processor gathered itself (MoE experts)
        _assign(model, name, tensor.to(dtype), source.spec)
    model.tie_weights()
    missing = sorted(n for n, p in model.named_parameters() if p.is_meta)
    if missing:
        raise CheckpointError(f"{source.spec}: the GGUF file lacks {len(missing)} weight(s) the model needs "
                              f"(e.g. {', '.join(missing[:3])}); it is partial or of another architecture")
    return model.eval()


def _from_pretrained(source: Source, config: PreTrainedConfig, cls: ModelClass, dtype: torch.dtype,
                     placement: dict[str, object]) -> PreTrainedModel:
    """transformers' own GGUF loader (placements; its newer GGUF path), always dequantizing."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import GgufConfig

    path = Path(source.ref).resolve()
    bar = gguf_utils.tqdm
    if not sys.stderr.isatty():  # as for transformers' own progress bars: none in a pipeline or a log
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    # Its advice for --dtype bf16/fp16 ("pass dtype=torch.float32 ...") names an API the user never sees.
    quantizer_log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = quantizer_log.level
    quantizer_log.setLevel(logging.ERROR)
    # Always dequantized: the hooks and the analyses read dense weights, and the heading says so. Without
    # this, transformers keeps the blocks packed wherever a GGUF matmul kernel (`kernels`) is installed.
    try:
        with checkpoint_errors(f"{source.spec}: cannot load the GGUF weights"):
            return cls.from_pretrained(str(path.parent), gguf_file=path.name, config=config, dtype=dtype,
                                       local_files_only=True, quantization_config=GgufConfig(dequantize=True),
                                       **placement)
    finally:
        gguf_utils.tqdm = bar
        quantizer_log.setLevel(level)
