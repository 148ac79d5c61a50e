"""A GGUF file read once: its quantization label, its identity, the transformers config from its metadata, and its
tensors dequantized a block of rows at a time.

Everything here starts from the header :func:`anatomy_cli.models.headers.read_gguf` parsed (tens of milliseconds,
where ``gguf.GGUFReader`` takes 4 s on SmolLM2 and 18 s on Gemma 3 because it makes a numpy view of every vocabulary
string). The config is built by transformers' own tables (``GGUF_CONFIG_MAPPING``, ``GGUF_CONFIG_DEFAULTS_MAPPING``,
and ``get_gguf_config`` for the architectures of its newer GGUF path) from those metadata, with the same
per-architecture adjustments ``transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`` makes; a test checks
the result against ``AutoConfig.from_pretrained(gguf_file=...)``. Tensor data are read with ``pread`` into a buffer
that lives for one block of rows, so the file's pages never count towards the process's memory.

No torch; transformers and numpy are imported inside the functions that need them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from io import BufferedIOBase
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.errors import CheckpointError
from anatomy_cli.models.headers import GGUFHeader
from anatomy_cli.models.headers import TensorInfo
from anatomy_cli.models.headers import file_type_name as file_type_name  # the label lives with the header
from anatomy_cli.models.headers import quantization_label as quantization_label

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from transformers.configuration_utils import PreTrainedConfig

def identity(header: GGUFHeader) -> str:
    """A key that changes whenever the file does: size, mtime (ns) and a SHA-256 of the header bytes (vocabulary
    included). Raises CheckpointError when the file cannot be read."""
    try:
        st = os.stat(header.path)
        with open(header.path, "rb") as f:
            digest = hashlib.sha256(f.read(header.data_start or st.st_size)).hexdigest()
    except OSError as exc:
        raise CheckpointError(f"{header.path}: cannot read: {exc.strerror or exc}") from None
    return f"{st.st_size}-{st.st_mtime_ns}-{digest}"


def _metadata(header: GGUFHeader) -> dict[str, Any]:
    # The long arrays (vocabulary, merges, scores) are their lengths, as transformers' own fast reader leaves them.
    return {**header.fields, **header.array_lengths}


# Architectures transformers' GGUF reader lacks that anatomy reads itself: {llama.cpp's name: the transformers
# model type whose metadata renames they share}. OLMoE (convert_hf_to_gguf.py's OlmoeModel): Qwen3-MoE's keys.
OWN_ARCHITECTURES = {"olmoe": "qwen3_moe"}


def config_dict(header: GGUFHeader) -> dict[str, Any]:
    """The transformers config dict of the file (``model_type`` included), from the parsed header alone.

    Raises ValueError for an architecture transformers cannot read from GGUF.
    """
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    from transformers.integrations.gguf import get_gguf_config
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    metadata, names = _metadata(header), [t.name for t in header.tensors]
    architecture = str(metadata["general.architecture"])
    if architecture in GGUF_CONFIG_ARCHS:
        built: dict[str, Any] = get_gguf_config(metadata, tuple(names))
        return built
    # From here on: load_gguf_checkpoint(return_tensors=False)["config"], step by step, on these metadata.
    model_name = [metadata["general.name"]] if "general.name" in metadata else []
    config: dict[str, Any] = {}
    updated = architecture
    if "llama" in architecture and "mistral" in model_name:
        updated = "mistral"
    elif "t5" in architecture:
        config["is_gated_act"] = True
        umt5 = bool(model_name) and "umt5" in str(model_name[0]).lower()
        updated = "umt5" if umt5 else "t5"
        if "t5encoder" in architecture:
            config["architectures"] = ["UMT5EncoderModel" if umt5 else "T5EncoderModel"]
    for old, new in (("qwen2moe", "qwen2_moe"), ("gpt_oss", "gpt_oss"), ("gpt-oss", "gpt_oss"),
                     ("qwen3moe", "qwen3_moe"), ("minimax-m2", "minimax_m2")):
        if old in architecture:
            updated = new
            break
    if "stablelm" in architecture:
        config["use_qkv_bias"] = any(b in n for n in names for b in ("attn_q.bias", "attn_k.bias", "attn_v.bias"))
        config["use_parallel_residual"] = not any("ffn_norm" in n for n in names)
    if (architecture not in GGUF_SUPPORTED_ARCHITECTURES and updated not in GGUF_SUPPORTED_ARCHITECTURES
            and architecture not in OWN_ARCHITECTURES):
        raise ValueError(f"GGUF model with architecture {architecture} is not supported yet.")
    config["tie_word_embeddings"] = "output.weight" not in names or architecture in ("falcon", "bloom")
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {}
                                                       ).items():
        config.setdefault(key, value)
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    if architecture in OWN_ARCHITECTURES:
        renames = {**renames, architecture: {**renames[OWN_ARCHITECTURES[architecture]],
                                             "attention.clamp_kqv": "clip_qkv", "attention.key_length": None}}
    for gguf_key, value in metadata.items():
        prefix, _, config_key = gguf_key.replace(architecture, updated).partition(".")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, updated)
        target = renames.get(prefix, {}).get(config_key, -1)
        if target not in (-1, None):
            config[target] = value
    _adjust(config, metadata)
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = metadata["tokenizer.ggml.tokens"]
    return config


def _adjust(config: dict[str, Any], metadata: dict[str, Any]) -> None:
    """load_gguf_checkpoint's per-architecture fixes after the renaming, and the expert widths it leaves at the
    config's defaults (Qwen2-MoE's 1408 and 5632, Qwen3-MoE's 768: right for Qwen1.5-MoE-A2.7B and
    Qwen3-30B-A3B only; llama.cpp writes them as ``expert_feed_forward_length``,
    ``expert_shared_feed_forward_length``)."""
    model_type = config.get("model_type")
    arch = str(metadata.get("general.architecture"))
    if model_type == "llama" and int(metadata.get("llama.expert_count") or 0) > 0:
        # llama.cpp writes Mixtral as `llama` with experts; transformers' GGUF reader drops them (a dense LLaMA)
        model_type = config["model_type"] = "mixtral"
        config["num_local_experts"] = int(metadata["llama.expert_count"])
        config["num_experts_per_tok"] = int(metadata["llama.expert_used_count"])
    for key, name in (("expert_feed_forward_length", "moe_intermediate_size"),
                      ("expert_shared_feed_forward_length", "shared_expert_intermediate_size")):
        if model_type in ("qwen2_moe", "qwen3_moe") and f"{arch}.{key}" in metadata:
            config[name] = int(metadata[f"{arch}.{key}"])
    if model_type == "olmoe":  # llama.cpp's OLMoE keeps the top-k probabilities as they are (norm_w false)
        config["norm_topk_prob"] = False
    if model_type == "gemma3":  # the file holds the text backbone only
        config["model_type"] = "gemma3_text"
    elif model_type == "gemma4":
        config["model_type"] = "gemma4_text"
        config["eos_token_id"] = [1, 106, 50]
    elif model_type == "minimax_m2" and isinstance(config.get("scoring_func"), int):
        config["scoring_func"] = {0: "none", 1: "softmax", 2: "sigmoid"}.get(config["scoring_func"], "softmax")
    elif model_type == "lfm2":
        heads = config["num_key_value_heads"]
        config["num_key_value_heads"] = max(heads)
        config["block_auto_adjust_ff_dim"] = False
        config["full_attn_idxs"] = [i for i, n in enumerate(heads) if n > 0]
    rope = {k.removeprefix("gpt-oss.rope.scaling."): v for k, v in metadata.items()
            if k.startswith("gpt-oss.rope.scaling.")}
    if model_type == "gpt_oss" and "type" in rope:
        scaling: dict[str, Any] = {"rope_type": rope.pop("type")}
        for key, value in rope.items():
            if key in ("factor", "attention_factor", "beta_fast", "beta_slow"):
                value = float(value)
            elif key in ("original_context_length", "original_max_position_embeddings"):
                key, value = "original_max_position_embeddings", int(value)
            scaling[key] = value
        config["rope_scaling"] = scaling


def read_config(header: GGUFHeader, spec: str) -> PreTrainedConfig:
    """The transformers config of the file. Raises CheckpointError when transformers cannot build one."""
    from transformers import AutoConfig

    try:
        d = config_dict(header)
        model_type = d.pop("model_type")
        config: PreTrainedConfig = AutoConfig.for_model(model_type, **d)
    except (ValueError, TypeError, KeyError) as exc:
        first = " ".join(str(exc).split()).split(". ")[0] or type(exc).__name__
        raise CheckpointError(f"{spec}: cannot read a config from the GGUF metadata: {first}") from None
    config._name_or_path = str(Path(header.path).resolve().parent)  # as from_pretrained(folder, gguf_file=) sets it
    return config


# ----------------------------------------------------------------------------------------- tensor data

CHUNK_ELEMENTS = 1 << 22  # rows dequantized together: ~4M values, 16 MB of float32 at most


def tensor_shape(info: TensorInfo) -> tuple[int, ...]:
    """The tensor's shape in torch (row-major) order: ggml lists the fastest axis first."""
    return tuple(reversed(info.shape))


def _read(f: BufferedIOBase, header: GGUFHeader, info: TensorInfo, start: int, n_bytes: int) -> npt.NDArray[np.uint8]:
    import numpy as np

    at = header.data_start + info.offset + start
    raw = np.empty(n_bytes, dtype=np.uint8)
    got = f.readinto(raw.data) if f.seek(at) == at else 0
    if got != n_bytes:
        raise CheckpointError(f"{header.path}: truncated: tensor {info.name} ends past the end of the file")
    return raw


def _values(raw: npt.NDArray[np.uint8], info: TensorInfo, rows: int) -> npt.NDArray[np.float32]:
    """``rows`` rows of ``info`` as float32 numpy values ``[rows, row_length]``."""
    import numpy as np

    row_length = info.shape[0]
    if info.dtype == "F32":
        return raw.view(np.float32).reshape(rows, row_length)
    if info.dtype == "F16":  # float32 as gguf's dequantize gives it: processors (norm - 1) then round alike
        return raw.view(np.float16).astype(np.float32).reshape(rows, row_length)
    import gguf

    kind = gguf.GGMLQuantizationType[info.dtype]
    return gguf.quants.dequantize(raw.reshape(rows, -1), kind).reshape(rows, row_length)


def row_blocks(f: BufferedIOBase, header: GGUFHeader, info: TensorInfo,
               chunk_elements: int = CHUNK_ELEMENTS) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
    """``(first_row, values)`` for consecutive blocks of the tensor's rows, dequantized to float32 numpy
    arrays ``[rows, row_length]``. A row is the fastest ggml axis; ``f`` is the file opened
    in binary mode. Raises CheckpointError for a file that ends early."""
    row_length = info.shape[0] if info.shape else 1
    n_rows = info.n_params // row_length if row_length else 0
    row_bytes = info.n_bytes // n_rows if n_rows else 0
    step = max(1, chunk_elements // max(row_length, 1))
    for first in range(0, n_rows, step):
        rows = min(step, n_rows - first)
        yield first, _values(_read(f, header, info, first * row_bytes, rows * row_bytes), info, rows)


def read_tensor(f: BufferedIOBase, header: GGUFHeader, info: TensorInfo) -> npt.NDArray[np.float32]:
    """The whole tensor dequantized to a numpy array of :func:`tensor_shape` (one full-size float32 copy)."""
    import numpy as np

    blocks = [values for _, values in row_blocks(f, header, info, chunk_elements=max(info.n_params, 1))]
    out = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    return out.reshape(tensor_shape(info))
