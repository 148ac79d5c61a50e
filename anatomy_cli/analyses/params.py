"""Exact parameter breakdown of a model from its config alone.

The model is built on PyTorch's meta device (shapes, no storage), so a 70B
config costs a few hundred MB of RSS and a few seconds. Every unique parameter
tensor (``model.named_parameters()``, which yields a tied tensor once) lands in
exactly one category, chosen by the first matching rule of its family's table
of name patterns (the checkpoint's own names). Buffers are never counted.

Categories, in row order: token embedding, position embedding, token-type
embedding, attention, FFN, router, routed experts, shared experts,
"LayerNorm + other" (block and final norms, plus any name no rule recognises),
LM head. Mixture-of-experts layers also get an *active* count: the parameters
one token uses, i.e. everything except the routed experts the router does not
pick (top-k of n).

Entry points: :func:`resolve_config` (preset, local directory or Hub id),
:func:`build_meta_model`, :func:`count_parameters`, :func:`plan_placement`,
and :func:`analyse` which chains them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from anatomy_cli import hub
from anatomy_cli.bigmodel import compress_names, parse_max_memory  # noqa: F401 (parse_max_memory: re-exported)
from anatomy_cli.errors import (AnatomyError, CheckpointError, ModelNotFound, OfflineError, UnsupportedArchitecture,
                                UsageError)

# ---------------------------------------------------------------------------
# Categories and the per-family rule tables

TOKEN = "token_embedding"
POSITION = "position_embedding"
TOKEN_TYPE = "token_type_embedding"
ATTENTION = "attention"
FFN = "ffn"
ROUTER = "router"
ROUTED = "routed_experts"
SHARED = "shared_experts"
NORM = "norm_other"
HEAD = "lm_head"

CATEGORIES = (TOKEN, POSITION, TOKEN_TYPE, ATTENTION, FFN, ROUTER, ROUTED, SHARED, NORM, HEAD)
LABELS = {
    TOKEN: "Token Embedding",
    POSITION: "Position Embedding",
    TOKEN_TYPE: "Token-type Embedding",
    ATTENTION: "Attention",
    FFN: "FFN",
    ROUTER: "Router",
    ROUTED: "Routed experts",
    SHARED: "Shared experts",
    NORM: "LayerNorm + other",
    HEAD: "LM head",
}
# Categories that live inside the blocks; their labels carry the layer count.
BLOCK_CATEGORIES = (ATTENTION, FFN, ROUTER, ROUTED, SHARED)
EMBEDDINGS = (TOKEN, POSITION, TOKEN_TYPE)
# Per-layer columns, in order.
LAYER_CATEGORIES = (ATTENTION, FFN, ROUTER, ROUTED, SHARED, NORM)

_S = r"(?:^|\.)"  # start of a name or of a path component

_MOE_RULES = (
    (SHARED, r"\.mlp\.shared_experts?(?:_gate)?\."),  # DeepSeek shared_experts; Qwen2-MoE shared_expert(+_gate)
    (ROUTER, r"\.mlp\.(?:gate|router)\."),  # the routing linear (not gate_proj)
    (ROUTED, r"\.mlp\.experts\."),  # fused [n_experts, ...] tensors or experts.<i>.*
)


@dataclass(frozen=True)
class Family:
    """A named table of (category, regex) rules; the first rule that matches wins."""

    name: str
    model_types: tuple[str, ...]
    rules: tuple[tuple[str, str], ...]


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", ("gpt2",), (
        (TOKEN, _S + r"wte\."),
        (POSITION, _S + r"wpe\."),
        (ATTENTION, r"\.(?:attn|crossattention)\."),
        (FFN, r"\.mlp\."),
        (NORM, _S + r"ln_(?:1|2|f|cross_attn)\."),
        (HEAD, r"^lm_head\."),
    )),
    Family("llama", ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                     "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss"), (
        (TOKEN, _S + r"embed_tokens\."),
        (ATTENTION, r"\.self_attn\."),  # includes QK-norms, MLA's latent norms, gpt-oss sinks
        *_MOE_RULES,
        (FFN, r"\.mlp\."),
        (NORM, r"\.(?:input_layernorm|post_attention_layernorm)\.|" + _S + r"norm\."),
        (HEAD, r"^lm_head\."),
    )),
    Family("gpt_neox", ("gpt_neox",), (
        (TOKEN, _S + r"embed_in\."),
        (ATTENTION, r"\.attention\."),
        (FFN, r"\.mlp\."),
        (NORM, r"\.(?:input_layernorm|post_attention_layernorm)\.|" + _S + r"final_layer_norm\."),
        (HEAD, r"^(?:lm_head|embed_out)\."),
    )),
    Family("opt", ("opt",), (
        (TOKEN, _S + r"embed_tokens\."),
        (POSITION, _S + r"embed_positions\."),
        (ATTENTION, r"\.self_attn\."),
        (FFN, r"\.fc[12]\."),
        (NORM, r"layer_norm\.|" + _S + r"project_(?:in|out)\."),
        (HEAD, r"^lm_head\."),
    )),
    Family("bert", ("bert", "roberta", "xlm-roberta", "distilbert"), (
        (HEAD, r"^(?:cls|lm_head|vocab_transform|vocab_layer_norm|vocab_projector)\."),
        (TOKEN, _S + r"embeddings\.word_embeddings\."),
        (POSITION, _S + r"embeddings\.position_embeddings\."),
        (TOKEN_TYPE, _S + r"embeddings\.token_type_embeddings\."),
        (NORM, r"LayerNorm\.|layer_norm\.|" + _S + r"pooler\."),
        (ATTENTION, r"\.attention\."),
        (FFN, r"\.(?:intermediate|output)\.dense\.|\.ffn\."),
    )),
)

# Best effort for every other architecture: the usual names across transformers.
GENERIC = Family("generic", (), (
    (POSITION, _S + r"(?:wpe|embed_positions|position_embeddings|pos_emb\w*)\."),
    (TOKEN_TYPE, _S + r"token_type_embeddings\."),
    (TOKEN, _S + r"(?:wte|embed_tokens|word_embeddings|embed_in|tok_embeddings)\."),
    (HEAD, r"^(?:lm_head|embed_out|output)\."),
    (SHARED, r"\.shared_experts?(?:_gate)?\."),
    (ROUTER, r"\.(?:mlp|moe|block_sparse_moe|feed_forward)\.(?:gate|router)\."),
    (ROUTED, r"\.experts\."),
    (NORM, r"(?i)norm|" + _S + r"ln\w*\."),
    (ATTENTION, r"(?i)attn|attention"),  # T5's SelfAttention / EncDecAttention too
    (FFN, r"(?i)mlp|ffn|feed_?forward|densereludense|" + _S + r"fc\d\.|intermediate|dense_(?:h_to_4h|4h_to_h)"),
))

# The block a tensor belongs to: the first "<stack>.<i>" in its name, e.g. transformer.h.3,
# model.layers.3, encoder.block.3 (a path, so encoder and decoder blocks stay apart).
_LAYER_RE = re.compile(r"^((?:.*?\.)?(?:h|layers|layer|blocks|block)\.(\d+))\.")
_EXPERT_INDEX_RE = re.compile(r"\.experts\.(\d+)\.")

# Bytes per parameter as bits (int4 packs two parameters per byte).
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}

# Config attributes that hold the number of experts each token is routed to, and the number of routed experts.
_TOP_K_ATTRS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "num_selected_experts", "moe_k")
_N_EXPERTS_ATTRS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def family_for(model_type: str) -> Family:
    """The rule table for ``model_type``; :data:`GENERIC` when none claims it."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return GENERIC


def classify(name: str, family: Family) -> str | None:
    """The category of parameter ``name`` by ``family``'s rules, or None when no rule matches."""
    for category, pattern in family.rules:
        if re.search(pattern, name):
            return category
    return None


def memory_bytes(n_params: int, dtype: str) -> int:
    """Bytes to hold ``n_params`` parameters in ``dtype`` (one of :data:`DTYPE_BITS`), rounded up."""
    return math.ceil(n_params * DTYPE_BITS[dtype] / 8)


# ---------------------------------------------------------------------------
# Model resolution: preset, local directory, Hugging Face id (config.json only)


@dataclass(frozen=True)
class ResolvedConfig:
    """A ``transformers`` config and where it came from.

    ``source`` is ``preset``, ``directory`` or ``hub``; ``location`` is the
    directory or cached config.json path (empty for presets).
    """

    spec: str
    config: Any
    source: str
    location: str = ""


def _first_sentence(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.split(". ")[0].rstrip(".")


def _config_from_file(spec: str, path: str, trust_remote_code: bool):
    import transformers
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{spec}: config.json is not valid JSON ({exc})") from exc
    except OSError as exc:  # transformers reports invalid JSON as OSError
        raise CheckpointError(f"{spec}: cannot read config.json: {_first_sentence(exc)}") from exc
    except StrictDataclassError as exc:  # v5 configs validate their fields (e.g. hidden % heads)
        raise CheckpointError(f"{spec}: config.json is inconsistent: {_first_sentence(exc.__cause__ or exc)}") from exc
    except (ValueError, KeyError) as exc:
        m = re.search(r"model type `([^`]*)`", str(exc))
        if "Should have a `model_type`" in str(exc):
            raise UnsupportedArchitecture(f"{spec}: config.json has no model_type") from exc
        if m:
            raise UnsupportedArchitecture(
                f"{spec}: model_type '{m.group(1)}' is unknown to transformers {transformers.__version__} "
                "(try a newer transformers, or --trust-remote-code if the repository ships its own code)") from exc
        raise UnsupportedArchitecture(f"{spec}: config.json is not a known transformers architecture: "
                                      f"{_first_sentence(exc)}") from exc


def resolve_config(spec: str, *, trust_remote_code: bool = False) -> ResolvedConfig:
    """Find the config for ``spec``: a built-in preset, a local directory with
    config.json, or a Hugging Face model id (only config.json is fetched; the local
    cache first; ``HF_HUB_OFFLINE`` respected).

    Raises ModelNotFound (nothing matches), OfflineError (offline and not cached),
    CheckpointError (config.json unreadable), UnsupportedArchitecture (unknown model_type).
    """
    from anatomy_cli import presets

    if spec in presets.PRESETS:
        return ResolvedConfig(spec, presets.preset_config(spec), "preset")
    expanded = os.path.expanduser(spec)
    if os.path.isdir(expanded):
        config_path = os.path.join(expanded, "config.json")
        if not os.path.isfile(config_path):
            raise ModelNotFound(f"model '{spec}': directory has no config.json")
        return ResolvedConfig(spec, _config_from_file(spec, expanded, trust_remote_code), "directory", expanded)
    if os.path.exists(expanded):
        raise ModelNotFound(f"model '{spec}': not a directory (give the directory that holds config.json)")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec:
        raise ModelNotFound(f"model '{spec}': no such directory")
    return ResolvedConfig(spec, *_hub_config(spec, trust_remote_code))


def _hub_config(spec: str, trust_remote_code: bool) -> tuple[Any, str, str]:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HFValidationError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)

    from anatomy_cli.presets import preset_names

    known = "not a preset (" + ", ".join(preset_names()) + "), not a local directory"
    try:
        cached = try_to_load_from_cache(spec, "config.json")
    except HFValidationError as exc:
        raise ModelNotFound(f"model '{spec}': {known}, and not a valid Hugging Face model id") from exc
    if isinstance(cached, str):
        path = cached
    elif hub.offline():
        raise OfflineError(f"model '{spec}': {known}, and not in the Hugging Face cache (offline: HF_HUB_OFFLINE is set or the Hub cannot be reached)")
    else:
        try:
            path = hf_hub_download(spec, "config.json")
        except GatedRepoError as exc:
            raise ModelNotFound(f"model '{spec}': the repository is gated; log in with an accepted licence") from exc
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise ModelNotFound(f"model '{spec}': {known}, and not found on the Hugging Face Hub") from exc
        except LocalEntryNotFoundError as exc:  # a subclass of EntryNotFoundError: test it first
            raise OfflineError(f"model '{spec}': {known}, not in the Hugging Face cache, and the Hub "
                               "cannot be reached") from exc
        except EntryNotFoundError as exc:
            raise ModelNotFound(f"model '{spec}': the repository has no config.json") from exc
    # Remote code needs the repository id so transformers can fetch its .py files.
    target = spec if trust_remote_code else path
    return _config_from_file(spec, target, trust_remote_code), "hub", path


# ---------------------------------------------------------------------------
# Building on the meta device


def _auto_class_for(config: Any, trust_remote_code: bool):
    """The Auto class whose mapping holds this config's first listed architecture, or a sensible default head."""
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
    from transformers.models.auto import modeling_auto as ma

    heads = (
        (AutoModelForCausalLM, ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        (AutoModelForMaskedLM, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
        (AutoModelForSeq2SeqLM, ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
        (AutoModel, ma.MODEL_MAPPING_NAMES),
    )
    model_type = getattr(config, "model_type", "")
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code and auto_map:
        for auto, _ in heads:
            if auto.__name__ in auto_map:
                return auto, None
    for arch in getattr(config, "architectures", None) or ():
        for auto, mapping in heads:
            names = mapping.get(model_type)
            if arch == names or (isinstance(names, (list, tuple)) and arch in names):
                return auto, None
        cls = getattr(transformers, arch, None)
        if cls is not None and hasattr(cls, "_from_config"):
            return None, cls  # e.g. a classification head: count what the checkpoint holds
    causal = model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if causal and (not masked or getattr(config, "is_decoder", False)):
        return AutoModelForCausalLM, None
    for auto, mapping in heads[1:]:
        if model_type in mapping:
            return auto, None
    return AutoModelForCausalLM, None


def build_meta_model(config: Any, *, trust_remote_code: bool = False):
    """Instantiate the model for ``config`` on the meta device (no weight memory).

    Uses ``torch.device("meta")``: unlike accelerate's ``init_empty_weights`` in
    transformers 5.x it keeps tied weights tied. Raises AnatomyError when the config
    cannot be built.
    """
    import torch
    from transformers.utils import logging as hf_logging

    auto, cls = _auto_class_for(config, trust_remote_code)
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # construction chatter is not a result
    try:
        with torch.device("meta"):
            if cls is not None:
                model = cls._from_config(config)
            else:
                model = auto.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError, AttributeError, KeyError, RuntimeError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AnatomyError(f"cannot build {type(config).__name__} on the meta device: {first}") from exc
    finally:
        hf_logging.set_verbosity(previous)
    return model


# ---------------------------------------------------------------------------
# Counting


@dataclass(frozen=True)
class Row:
    """One row of the breakdown. ``active`` only for MoE models; ``memory_bytes`` only with a dtype."""

    key: str
    label: str
    parameters: int
    share: float
    layers: int | None = None
    active: int | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class LayerRow:
    """One block (``name`` its module path, ``index`` its number in the stack): parameters
    per category (see :data:`LAYER_CATEGORIES`), its total and active count."""

    name: str
    index: int
    parameters: dict[str, int]
    total: int
    share: float
    active: int | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class MoEInfo:
    """Routing shape: ``n_experts`` routed experts per MoE layer, ``top_k`` picked per token."""

    n_experts: int
    top_k: int | None
    moe_layers: int
    dense_layers: int
    active: int | None
    unselected: int | None


@dataclass(frozen=True)
class Placement:
    """accelerate's plan for ``max_memory`` (bytes per device) at ``dtype``.

    ``device_map`` maps module names to devices (ints are GPUs, or "cpu"/"mps"/"disk");
    ``devices`` lists, per device, its modules, parameter count, bytes and budget.
    """

    max_memory: dict[str, int]
    dtype: str
    balanced: bool
    device_map: dict[str, str]
    devices: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"max_memory": dict(self.max_memory), "dtype": self.dtype, "balanced": self.balanced,
                "device_map": dict(self.device_map), "devices": [dict(d) for d in self.devices]}


@dataclass(frozen=True)
class ParamsResult:
    """The breakdown of one model. Rows sum to ``total``; ``total`` is the sum over
    unique parameter tensors (tied tensors once, buffers never)."""

    model: str
    source: str
    location: str
    model_type: str
    architecture: str
    family: str
    n_layers: int
    total: int
    rows: tuple[Row, ...]
    non_embedding: int
    non_embedding_excludes: tuple[str, ...]
    tied: tuple[tuple[str, str], ...]  # (alias name, counted name)
    unrecognised: tuple[str, ...]
    moe: MoEInfo | None = None
    dtype: str | None = None
    memory_bytes: int | None = None
    layers: tuple[LayerRow, ...] | None = None
    outside_layers: tuple[Row, ...] | None = None
    placement: Placement | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "source": self.source,
            "location": self.location,
            "model_type": self.model_type,
            "architecture": self.architecture,
            "family": self.family,
            "n_layers": self.n_layers,
            "total": self.total,
            "non_embedding": self.non_embedding,
            "non_embedding_excludes": list(self.non_embedding_excludes),
            "active": self.moe.active if self.moe else None,
            "dtype": self.dtype,
            "memory_bytes": self.memory_bytes,
            "rows": [_row_dict(r) for r in self.rows],
            "tied": [{"name": a, "shares": b} for a, b in self.tied],
            "unrecognised": list(self.unrecognised),
            "moe": None if self.moe is None else {
                "n_experts": self.moe.n_experts, "top_k": self.moe.top_k, "moe_layers": self.moe.moe_layers,
                "dense_layers": self.moe.dense_layers, "active": self.moe.active, "unselected": self.moe.unselected},
            "layers": None if self.layers is None else [
                {"name": lr.name, "index": lr.index, **lr.parameters, "total": lr.total, "share": lr.share,
                 "active": lr.active, "memory_bytes": lr.memory_bytes} for lr in self.layers],
            "outside_layers": None if self.outside_layers is None else [_row_dict(r) for r in self.outside_layers],
            "placement": None if self.placement is None else self.placement.to_dict(),
            "notes": list(self.notes),
        }


def _row_dict(row: Row) -> dict[str, Any]:
    return {"key": row.key, "label": row.label, "layers": row.layers, "parameters": row.parameters,
            "share": row.share, "active": row.active, "memory_bytes": row.memory_bytes}


@dataclass
class _Tensor:
    name: str
    numel: int
    category: str
    layer: str | None  # block path
    index: int | None  # block number
    recognised: bool
    per_expert: dict[int, int] | None = None  # routed experts: expert index -> parameters


def _classify_all(model: Any, family: Family, n_experts: int | None) -> list[_Tensor]:
    input_emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    try:
        output_emb = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        output_emb = None
    by_identity: dict[int, str] = {}
    if output_emb is not None:
        for p in output_emb.parameters():
            by_identity[id(p)] = HEAD
    if input_emb is not None and getattr(input_emb, "weight", None) is not None:
        by_identity[id(input_emb.weight)] = TOKEN
    tensors = []
    for name, p in model.named_parameters():  # remove_duplicate=True: a tied tensor appears once
        category = classify(name, family)
        recognised = category is not None
        if category is None and id(p) in by_identity:
            category, recognised = by_identity[id(p)], True
        if category is None:
            category = NORM
        m = _LAYER_RE.search(name)
        t = _Tensor(name, p.numel(), category, m.group(1) if m else None, int(m.group(2)) if m else None,
                    recognised)
        if category == ROUTED:
            t.per_expert = _per_expert(name, p, n_experts)
        tensors.append(t)
    return tensors


def _per_expert(name: str, p: Any, n_experts: int | None) -> dict[int, int]:
    """Parameters each routed expert holds in tensor ``p``: one expert per
    ``experts.<i>.`` module, or a slice along dim 0 of a fused [n_experts, ...] tensor.
    A fused tensor whose dim 0 is not the config's expert count (e.g. [n_experts * d_ff, d])
    is split evenly into that many experts."""
    m = _EXPERT_INDEX_RE.search(name)
    if m:
        return {int(m.group(1)): p.numel()}
    if p.dim() == 0:
        return {0: p.numel()}
    if n_experts and p.shape[0] != n_experts and p.numel() % n_experts == 0:
        return dict.fromkeys(range(n_experts), p.numel() // n_experts)
    per = p[0].numel()  # one slice along the expert dimension (meta: no data touched)
    return dict.fromkeys(range(p.shape[0]), per)


def _config_int(config: Any, attrs: tuple[str, ...]) -> int | None:
    for attr in attrs:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _top_k(config: Any, model: Any) -> int | None:
    value = _config_int(config, _TOP_K_ATTRS)
    if value is not None:
        return value
    for module in model.modules():  # e.g. routers that keep their own top_k
        value = getattr(module, "top_k", None)
        if isinstance(value, int) and value > 0 and hasattr(module, "num_experts"):
            return value
    return None


def _tied_pairs(model: Any) -> list[tuple[str, str]]:
    seen: dict[int, str] = {}
    pairs = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            pairs.append((name, seen[id(p)]))
        else:
            seen[id(p)] = name
    return pairs


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt(n: int) -> str:
    return f"{n:,}"


def _short_list(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def count_parameters(model: Any, resolved: ResolvedConfig, *, dtype: str | None = None,
                     per_layer: bool = False) -> ParamsResult:
    """Break ``model``'s unique parameters into rows (see the module docstring).

    ``dtype`` (a key of :data:`DTYPE_BITS`) adds memory in bytes for the resident
    weights (all parameters, every expert included). ``per_layer`` adds one
    :class:`LayerRow` per block. Raises UsageError for an unknown dtype.
    """
    if dtype is not None and dtype not in DTYPE_BITS:
        raise UsageError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPE_BITS)})")
    config = resolved.config
    model_type = getattr(config, "model_type", "") or ""
    family = family_for(model_type)
    tensors = _classify_all(model, family, _config_int(config, _N_EXPERTS_ATTRS))
    total = sum(t.numel for t in tensors)

    sums: dict[str, int] = defaultdict(int)
    layers_of: dict[str, set[str]] = defaultdict(set)
    for t in tensors:
        sums[t.category] += t.numel
        if t.layer is not None:
            layers_of[t.category].add(t.layer)

    # Routed experts: per layer, the top-k experts run; the rest are idle for this token.
    moe = None
    routed_active_by_layer: dict[str | None, int] = {}
    expert_sizes: dict[str | None, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for t in tensors:
        if t.per_expert:
            for e, n in t.per_expert.items():
                expert_sizes[t.layer][e] += n
    if expert_sizes:
        k = _top_k(config, model)
        n_experts = max(len(sizes) for sizes in expert_sizes.values())
        unselected = None
        if k is not None:
            for layer, sizes in expert_sizes.items():
                routed_active_by_layer[layer] = sum(sorted(sizes.values(), reverse=True)[:k])
            unselected = sums[ROUTED] - sum(routed_active_by_layer.values())
        dense_layers = len(layers_of[FFN] - set(expert_sizes))
        moe = MoEInfo(n_experts=n_experts, top_k=k, moe_layers=len(expert_sizes), dense_layers=dense_layers,
                      active=None if unselected is None else total - unselected, unselected=unselected)

    def active_of(category: str, n: int) -> int | None:
        if moe is None or moe.active is None:
            return None
        return sum(routed_active_by_layer.values()) if category == ROUTED else n

    def mem(n: int) -> int | None:
        return memory_bytes(n, dtype) if dtype else None

    rows = []
    for category in CATEGORIES:
        n = sums.get(category, 0)
        if n == 0 and category not in (TOKEN, ATTENTION, NORM) and not (category == FFN and moe is None):
            continue
        label = LABELS[category]
        n_layers = len(layers_of[category]) or None
        if category in BLOCK_CATEGORIES and n_layers:
            detail = _plural(n_layers, "layer")
            if category == FFN and moe is not None:
                detail = _plural(n_layers, "dense layer")
            if category == ROUTED and moe is not None and moe.top_k is not None:
                detail += f", top-{moe.top_k} of {moe.n_experts}"
            label = f"{label} ({detail})"
        if category == HEAD and family.name == "bert" and _is_tied_head(model):
            label = "LM head (untied parts)"
        rows.append(Row(category, label, n, n / total if total else 0.0,
                        n_layers if category in BLOCK_CATEGORIES else None, active_of(category, n), mem(n)))

    n_layers = (int(getattr(config, "num_hidden_layers", 0) or 0)
                or len({t.layer for t in tensors if t.layer is not None}))
    excluded = [t for t in tensors if t.category in (*EMBEDDINGS, HEAD)]
    non_embedding = total - sum(t.numel for t in excluded)
    tied = _tied_pairs(model)
    unrecognised = [t.name for t in tensors if not t.recognised]

    layer_rows = outside = None
    if per_layer:
        layer_rows = tuple(_layer_rows(tensors, total, routed_active_by_layer, moe, mem))
        outside = tuple(_outside_rows(tensors, total, routed_active_by_layer, moe, mem))

    notes = _notes(resolved, family, total, non_embedding, excluded, tied, unrecognised, moe, dtype, model)
    return ParamsResult(
        model=resolved.spec, source=resolved.source, location=resolved.location, model_type=model_type,
        architecture=type(model).__name__, family=family.name, n_layers=n_layers, total=total, rows=tuple(rows),
        non_embedding=non_embedding, non_embedding_excludes=tuple(t.name for t in excluded), tied=tuple(tied),
        unrecognised=tuple(unrecognised), moe=moe, dtype=dtype, memory_bytes=mem(total), layers=layer_rows,
        outside_layers=outside,
        notes=tuple(notes),
    )


def _is_tied_head(model: Any) -> bool:
    try:
        out = model.get_output_embeddings()
        inp = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    return out is not None and inp is not None and getattr(out, "weight", None) is getattr(inp, "weight", False)


def _in_layer(t: _Tensor) -> bool:
    return t.layer is not None and t.category in LAYER_CATEGORIES


def _layer_rows(tensors: list[_Tensor], total: int, routed_active: dict[str | None, int],
                moe: MoEInfo | None, mem) -> list[LayerRow]:
    per: dict[str, dict[str, int]] = {}  # block path -> counts, in model order
    index: dict[str, int] = {}
    for t in tensors:
        if _in_layer(t):
            per.setdefault(t.layer, dict.fromkeys(LAYER_CATEGORIES, 0))[t.category] += t.numel
            index[t.layer] = t.index
    out = []
    for name, counts in per.items():
        layer_total = sum(counts.values())
        active = None
        if moe is not None and moe.active is not None:
            active = layer_total - counts[ROUTED] + routed_active.get(name, 0)
        out.append(LayerRow(name, index[name], dict(counts), layer_total, layer_total / total if total else 0.0,
                            active, mem(layer_total)))
    return out


def _outside_rows(tensors: list[_Tensor], total: int, routed_active: dict[str | None, int],
                  moe: MoEInfo | None, mem) -> list[Row]:
    """The tensors no block holds (embeddings, final norm, head), one row per category."""
    sums: dict[str, int] = defaultdict(int)
    for t in tensors:
        if not _in_layer(t):
            sums[t.category] += t.numel
    rows = []
    for category in CATEGORIES:
        n = sums.get(category, 0)
        if not n:
            continue
        label = "Final norm + other" if category == NORM else LABELS[category]
        active = None
        if moe is not None and moe.active is not None:
            active = routed_active.get(None, 0) if category == ROUTED else n
        rows.append(Row(category, label, n, n / total if total else 0.0, None, active, mem(n)))
    return rows


def _notes(resolved, family, total, non_embedding, excluded, tied, unrecognised, moe, dtype, model) -> list[str]:
    notes = ["Counted on the meta device from the config alone (no weights): every unique parameter tensor "
             "once, buffers never."]
    if _is_tied_head(model):
        notes.append("The LM head shares the token embedding (tied weights); it is counted once, under "
                     "Token Embedding.")
    other_ties = [(a, b) for a, b in tied if not (_is_tied_head(model) and b == _input_weight_name(model))]
    if other_ties:
        notes.append("Also tied (counted once): " + _short_list([f"{a} = {b}" for a, b in other_ties]) + ".")
    if excluded:
        tied_head = _is_tied_head(model)
        roles = {TOKEN: "token embedding" + (", also the LM head" if tied_head else ""),
                 POSITION: "position embedding", TOKEN_TYPE: "token-type embedding", HEAD: "LM head"}
        names = [f"{t.name} ({roles[t.category]})" for t in excluded]
        notes.append(f"Non-embedding parameters: {_fmt(non_embedding)} = the total minus {_short_list(names, 6)}.")
    if unrecognised:
        n = len(unrecognised)
        notes.append(f"{_plural(n, 'tensor')} matched no rule of the '{family.name}' table and "
                     f"{'is' if n == 1 else 'are'} counted in LayerNorm + other: {_short_list(unrecognised)}.")
    if family is GENERIC:
        notes.append(f"model_type '{getattr(resolved.config, 'model_type', '')}' has no rule table: the total is "
                     "exact, the split into rows is best effort.")
    if moe is not None:
        if moe.top_k is None:
            notes.append("Mixture of experts: the config does not say how many experts a token uses, "
                         "so no active count.")
        else:
            dense = f"; {_plural(moe.dense_layers, 'dense FFN layer')}" if moe.dense_layers else ""
            notes.append(f"Active = parameters used for one token: everything except the routed experts the "
                         f"router does not pick (top-{moe.top_k} of {moe.n_experts} in each of "
                         f"{_plural(moe.moe_layers, 'MoE layer')}{dense}). Active {_fmt(moe.active)} of "
                         f"{_fmt(total)}.")
    if dtype:
        note = (f"Memory: parameters x {DTYPE_BITS[dtype] / 8:g} bytes ({dtype}); the weights that must be resident"
                f"{', every expert included' if moe is not None else ''}; no activations, KV cache or "
                "optimizer state")
        if dtype in ("int8", "int4"):
            note += ", and no quantization scales"
        notes.append(note + ".")
    return notes


def _input_weight_name(model: Any) -> str | None:
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(inp, "weight", None)
    for name, p in model.named_parameters():
        if p is weight:
            return name
    return None


# ---------------------------------------------------------------------------
# Placement estimate (accelerate's planner on the meta model)


def plan_placement(model: Any, max_memory: dict[int | str, int], dtype: str) -> Placement:
    """Where accelerate would put each block for ``max_memory`` at ``dtype``.

    Uses ``accelerate.utils.infer_auto_device_map`` with the model's
    ``_no_split_modules`` (and ``get_balanced_memory`` first when more than one GPU
    is given, as ``device_map="auto"`` does). GPU budgets are taken as given: no GPU
    needs to be present. Modules that fit nowhere go to ``disk``.
    """
    import torch
    from accelerate.utils import CustomDtype, get_balanced_memory, infer_auto_device_map

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8,
                   "int4": CustomDtype.INT4}[dtype]
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    budget = dict(max_memory)
    gpus = [k for k in budget if isinstance(k, int)]
    # accelerate warns that absent GPUs are "not available"; for an estimate that is expected.
    acc_logger = logging.getLogger("accelerate.utils.modeling")
    level = acc_logger.level
    acc_logger.setLevel(logging.ERROR)
    try:
        if len(gpus) > 1:
            budget = get_balanced_memory(model, max_memory=dict(budget), no_split_module_classes=no_split,
                                         dtype=torch_dtype, low_zero=False)
        device_map = infer_auto_device_map(model, max_memory=dict(budget), no_split_module_classes=no_split,
                                           dtype=torch_dtype)
    finally:
        acc_logger.setLevel(level)

    keys = sorted(device_map, key=len, reverse=True)
    counts: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        owner = next((k for k in keys if k == "" or name == k or name.startswith(k + ".")), None)
        device = str(device_map[owner]) if owner is not None else "unplaced"
        counts[device] += p.numel()
    order = [str(k) for k in max_memory] + ["disk"]
    devices = []
    for device in dict.fromkeys(order + list(counts)):
        modules = [m for m, d in device_map.items() if str(d) == device]
        if not modules and device not in counts:
            continue
        budget_key: int | str = int(device) if device.isdigit() else device
        devices.append({"device": device, "modules": compress_names(modules), "parameters": counts.get(device, 0),
                        "memory_bytes": memory_bytes(counts.get(device, 0), dtype),
                        "budget_bytes": max_memory.get(budget_key)})
    return Placement(max_memory={str(k): v for k, v in max_memory.items()}, dtype=dtype, balanced=len(gpus) > 1,
                     device_map={k: str(v) for k, v in device_map.items()}, devices=tuple(devices))


# ---------------------------------------------------------------------------


def analyse(spec: str, *, dtype: str | None = None, per_layer: bool = False, trust_remote_code: bool = False,
            max_memory: dict[int | str, int] | None = None) -> ParamsResult:
    """Resolve ``spec``, build it on the meta device and count (see :func:`count_parameters`).

    With ``max_memory``, also plan the placement (at ``dtype``, else the config's
    dtype, else fp32). Raises ModelNotFound, OfflineError, CheckpointError,
    UnsupportedArchitecture, AnatomyError, UsageError.
    """
    import dataclasses

    resolved = resolve_config(spec, trust_remote_code=trust_remote_code)
    model = build_meta_model(resolved.config, trust_remote_code=trust_remote_code)
    result = count_parameters(model, resolved, dtype=dtype, per_layer=per_layer)
    if max_memory is not None:
        plan_dtype = dtype or _config_dtype(resolved.config)
        placement = plan_placement(model, max_memory, plan_dtype)
        no_split = ", ".join(getattr(model, "_no_split_modules", None) or []) or "none"
        note = (f"Placement: accelerate's infer_auto_device_map on the meta model at {plan_dtype} (never split: "
                f"{no_split}); GPU budgets are taken as given; 'disk' holds what fits no budget: with --device-map it "
                "is read from disk at every forward (docs/big-models.md).")
        result = dataclasses.replace(result, placement=placement, notes=(*result.notes, note))
    return result


def _config_dtype(config: Any) -> str:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(value).replace("torch.", "") if value is not None else ""
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(name, "fp32")
