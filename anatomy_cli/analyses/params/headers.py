"""The parameter breakdown read from checkpoint headers: no torch, no transformers, no tensor data.

* A GGUF file: the tensor table of its header (:func:`anatomy_cli.models.headers.read_gguf`),
  classified by llama.cpp's standard tensor names (``token_embd``, ``blk.N.attn_q``,
  ``blk.N.ffn_up_exps``, ``output_norm``, ``output`` ...). ``rope_freqs`` is a buffer
  (transformers recomputes it) and is not counted. No ``output`` tensor: the head is tied.
* A directory with safetensors files (single or sharded): the JSON headers, classified by
  the same per-family rules as the meta-device count (the checkpoint's own names).
  Buffers some checkpoints store (GPT-2's ``attn.bias`` masks, rotary ``inv_freq``,
  ``position_ids``) are not counted; a head stored next to the embedding it is tied to
  (same shape, ``tie_word_embeddings``) is counted once.

Each row also says how it is stored: types (``Q4_1``, ``F32``, ``BF16`` ...), bytes on disk
and bits per weight; the result gives the memory once dequantized at fp32, bf16 and fp16.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from anatomy_cli.analyses.params.breakdown import ATTENTION
from anatomy_cli.analyses.params.breakdown import BLOCK_CATEGORIES
from anatomy_cli.analyses.params.breakdown import CATEGORIES
from anatomy_cli.analyses.params.breakdown import EMBEDDINGS
from anatomy_cli.analyses.params.breakdown import FFN
from anatomy_cli.analyses.params.breakdown import GENERIC
from anatomy_cli.analyses.params.breakdown import HEAD
from anatomy_cli.analyses.params.breakdown import LABELS
from anatomy_cli.analyses.params.breakdown import NORM
from anatomy_cli.analyses.params.breakdown import POSITION
from anatomy_cli.analyses.params.breakdown import ROUTED
from anatomy_cli.analyses.params.breakdown import ROUTER
from anatomy_cli.analyses.params.breakdown import SHARED
from anatomy_cli.analyses.params.breakdown import TOKEN
from anatomy_cli.analyses.params.breakdown import TOKEN_TYPE
from anatomy_cli.analyses.params.breakdown import LayerRow
from anatomy_cli.analyses.params.breakdown import ParamsResult
from anatomy_cli.analyses.params.breakdown import Row
from anatomy_cli.analyses.params.breakdown import _in_layer
from anatomy_cli.analyses.params.breakdown import _layer_rows
from anatomy_cli.analyses.params.breakdown import _outside_rows
from anatomy_cli.analyses.params.breakdown import _Tensor
from anatomy_cli.analyses.params.breakdown import classify
from anatomy_cli.analyses.params.breakdown import family_for
from anatomy_cli.analyses.params.breakdown import memory_bytes
from anatomy_cli.analyses.params.breakdown import rule_notes
from anatomy_cli.errors import CheckpointError
from anatomy_cli.models.headers import TensorInfo
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.headers import read_safetensors
from anatomy_cli.models.headers import safetensors_files
from anatomy_cli.units import counted
from anatomy_cli.units import human_bytes

_GGUF_RULES = (
    (TOKEN, r"^token_embd\."),
    (POSITION, r"^position_embd\."),
    (TOKEN_TYPE, r"^token_types\."),
    (HEAD, r"^output\."),
    (ATTENTION, r"\.attn_[qk]_norm\."),  # QK-norms belong to attention, as in the transformers tables
    (NORM, r"norm"),
    (SHARED, r"\.ffn_\w*shexp\."),
    (ROUTED, r"\.ffn_\w+_exps\."),
    (ROUTER, r"\.ffn_gate_inp\."),
    (ATTENTION, r"\.attn_"),
    (FFN, r"\.ffn_"),
)
_GGUF_BUFFERS = re.compile(r"(?:^|\.)rope_freqs\.")
_GGUF_LAYER = re.compile(r"^(blk\.(\d+))\.")

_ST_BUFFERS = re.compile(r"\.attn\.(?:masked_)?bias$|\.inv_freq$|(?:^|\.)position_ids$")
_LAYER_RE = re.compile(r"^((?:.*?\.)?(?:h|layers|layer|blocks|block)\.(\d+))\.")
# transformers' config classes whose tie_word_embeddings defaults to False; the rest default to True.
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gpt_neox",
                      "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss", "phi3", "gemma"}
DEQUANTIZED = ("fp32", "bf16", "fp16")


def _gguf_category(name: str) -> str | None:
    for category, pattern in _GGUF_RULES:
        if re.search(pattern, name):
            return category
    return None


def from_gguf(spec: str, path: str, *, dtype: str | None = None, per_layer: bool = False) -> ParamsResult:
    """The breakdown of a GGUF file from its header. Raises CheckpointError for a bad file."""
    header = read_gguf(path)
    kept, disk = [], {}
    for info in header.tensors:
        if _GGUF_BUFFERS.search(info.name):
            continue
        category = _gguf_category(info.name)
        m = _GGUF_LAYER.match(info.name)
        kept.append(_Tensor(info.name, info.n_params, category or NORM, m.group(1) if m else None,
                            int(m.group(2)) if m else None, category is not None))
        disk[info.name] = info
    if not kept:
        raise CheckpointError(f"{spec}: the GGUF file holds no tensors")
    arch = header.architecture
    tied = not any(t.category == HEAD for t in kept)
    n_layers = header.block_count or len({t.layer for t in kept if t.layer})
    notes = [(f"Read from the GGUF header (version {header.version}): memory-mapped, no tensor data read, "
              "nothing dequantized; every tensor once.")]
    return _result(spec, "gguf", path, arch, arch, "gguf", n_layers, kept, disk, tied, dtype, per_layer, notes,
                   quantization=header.quantization, read_from="gguf_header")


def from_safetensors(spec: str, directory: str, *, dtype: str | None = None,
                     per_layer: bool = False) -> ParamsResult | None:
    """The breakdown of a checkpoint directory from its safetensors headers and config.json;
    None when it has no safetensors files. Raises CheckpointError for a bad header or config."""
    files = safetensors_files(directory)
    if not files:
        return None
    try:
        raw = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the meta-device path reports config.json problems
    if not isinstance(raw, dict) or not raw.get("model_type"):
        return None
    model_type = str(raw["model_type"])
    family = family_for(model_type)
    infos: list[TensorInfo] = [t for f in files for t in read_safetensors(f)]
    kept, disk = [], {}
    for info in infos:
        if _ST_BUFFERS.search(info.name):
            continue
        category = classify(info.name, family)
        m = _LAYER_RE.search(info.name)
        kept.append(_Tensor(info.name, info.n_params, category or NORM, m.group(1) if m else None,
                            int(m.group(2)) if m else None, category is not None))
        disk[info.name] = info
    tie = bool(raw.get("tie_word_embeddings", model_type not in _UNTIED_BY_DEFAULT))
    embed = next((disk[t.name] for t in kept if t.category == TOKEN), None)
    tied = tie and embed is not None
    if tied and embed is not None:  # a head stored beside the embedding it is tied to is one parameter
        kept = [t for t in kept if not (t.category == HEAD and disk[t.name].shape == embed.shape)]
    archs = raw.get("architectures") or [""]
    n_layers = int(raw.get("num_hidden_layers") or raw.get("n_layer") or raw.get("num_layers") or 0) or \
        len({t.layer for t in kept if t.layer})
    notes = [(f"Read from the safetensors headers ({counted(len(files), 'file')}): no tensor data read; every "
              "unique parameter tensor once, buffers never.")]
    return _result(spec, "directory", directory, model_type, str(archs[0]), family.name, n_layers, kept, disk,
                   tied, dtype, per_layer, notes, read_from="safetensors_header", family_rules=family)


def storage(infos: list[TensorInfo]) -> dict:
    """How tensors are stored, as :class:`Row` and :class:`LayerRow` say it: ``dtypes`` (the types, most
    parameters first), ``disk_bytes`` and ``bits_per_weight`` (8 x bytes / parameters)."""
    by: dict[str, int] = defaultdict(int)
    for info in infos:
        by[info.dtype] += info.n_params
    n, nbytes = sum(by.values()), sum(i.n_bytes for i in infos)
    return {"dtypes": tuple(sorted(by, key=lambda k: -by[k])), "disk_bytes": nbytes,
            "bits_per_weight": 8 * nbytes / n if n else None}


def _stored(tensors: list[_Tensor], disk: dict[str, TensorInfo], layers: tuple[LayerRow, ...],
            outside: tuple[Row, ...]) -> tuple[tuple[LayerRow, ...], tuple[Row, ...]]:
    """The per-layer rows with their storage: each block's tensors, and outside the blocks each category's."""
    blocks: dict[str | None, list[TensorInfo]] = defaultdict(list)
    rest: dict[str, list[TensorInfo]] = defaultdict(list)
    for t in tensors:
        if _in_layer(t):
            blocks[t.layer].append(disk[t.name])
        else:
            rest[t.category].append(disk[t.name])
    return (tuple(replace(lr, **storage(blocks[lr.name])) for lr in layers),
            tuple(replace(r, **storage(rest[r.key])) for r in outside))


def _result(spec, source, location, model_type, architecture, family_name, n_layers, tensors, disk, tied, dtype,
            per_layer, notes, *, quantization=None, read_from, family_rules=None) -> ParamsResult:
    total = sum(t.numel for t in tensors)

    def mem(n: int) -> int | None:
        return memory_bytes(n, dtype) if dtype else None

    by_cat: dict[str, list[_Tensor]] = defaultdict(list)
    for t in tensors:
        by_cat[t.category].append(t)
    rows = []
    for category in CATEGORIES:
        members = by_cat.get(category, [])
        n = sum(t.numel for t in members)
        if n == 0 and category not in (TOKEN, ATTENTION, NORM, FFN):
            continue
        label = LABELS[category]
        n_block = len({t.layer for t in members if t.layer is not None}) or None
        if category in BLOCK_CATEGORIES and n_block:
            label = f"{label} ({counted(n_block, 'layer')})"
        rows.append(Row(category, label, n, n / total if total else 0.0,
                        n_block if category in BLOCK_CATEGORIES else None, None, mem(n),
                        **storage([disk[t.name] for t in members])))
    excluded = [t for t in tensors if t.category in (*EMBEDDINGS, HEAD)]
    non_embedding = total - sum(t.numel for t in excluded)
    unrecognised = [t.name for t in tensors if not t.recognised]
    disk_total = sum(disk[t.name].n_bytes for t in tensors)
    if tied:
        notes.append("The LM head shares the token embedding (tied weights): no separate head tensor; "
                     "it is counted once, under Token Embedding.")
    notes += rule_notes(unrecognised, family_rules is GENERIC, model_type)
    if any(t.category == ROUTED for t in tensors):
        notes.append("Mixture of experts: a header does not say how many experts a token uses; no active count.")
    dequantized = {d: memory_bytes(total, d) for d in DEQUANTIZED}
    notes.append("Once loaded: " + ", ".join(f"{d} {_gib(b)}" for d, b in dequantized.items())
                 + f" (parameters x bytes per parameter); on disk {_gib(disk_total)}, "
                 f"{8 * disk_total / total:.2f} bits per weight.")
    layer_rows = outside = None
    if per_layer:
        layer_rows, outside = _stored(tensors, disk, tuple(_layer_rows(tensors, total, {}, None, mem)),
                                      tuple(_outside_rows(tensors, total, {}, None, mem)))
    return ParamsResult(
        model=spec, source=source, location=location, model_type=model_type, architecture=architecture,
        family=family_name, n_layers=n_layers, total=total, rows=tuple(rows), non_embedding=non_embedding,
        non_embedding_excludes=tuple(t.name for t in excluded), tied=(), unrecognised=tuple(unrecognised),
        dtype=dtype, memory_bytes=mem(total), layers=layer_rows, outside_layers=outside, notes=tuple(notes),
        read_from=read_from, disk_bytes=disk_total, quantization=quantization, dequantized_bytes=dequantized)


def _gib(n: int) -> str:

    return human_bytes(n)
