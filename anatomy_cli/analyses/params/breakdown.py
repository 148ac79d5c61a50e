"""The breakdown's result: rows, per-layer rows, MoE routing, placement, and how rows are built.

Every unique parameter tensor lands in exactly one category (:mod:`.rules`), chosen by the
first matching rule of its family's table of name patterns (the checkpoint's own names).
Buffers are never counted. Categories, in row order: token embedding, position embedding,
token-type embedding, attention, FFN, router, routed experts, shared experts, "LayerNorm +
other", LM head. Mixture-of-experts layers also get an *active* count: the parameters one
token uses (everything except the routed experts the router does not pick, top-k of n).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field

from anatomy_cli.analyses.params.rules import _EXPERT_INDEX_RE  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import _LAYER_RE  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import _N_EXPERTS_ATTRS  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import _TOP_K_ATTRS  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import ATTENTION  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import BLOCK_CATEGORIES  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import CATEGORIES
from anatomy_cli.analyses.params.rules import DTYPE_BITS  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import EMBEDDINGS  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import FAMILIES  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import FFN  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import GENERIC  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import HEAD  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import LABELS
from anatomy_cli.analyses.params.rules import LAYER_CATEGORIES
from anatomy_cli.analyses.params.rules import NORM
from anatomy_cli.analyses.params.rules import POSITION  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import ROUTED
from anatomy_cli.analyses.params.rules import ROUTER  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import SHARED  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import TOKEN  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import TOKEN_TYPE  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import Family  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import classify  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import family_for  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.analyses.params.rules import memory_bytes  # noqa: F401 (re-exported: the breakdown's vocabulary)
from anatomy_cli.models.bigmodel import compress_names  # noqa: F401 (parse_max_memory: re-exported)
from anatomy_cli.models.bigmodel import parse_max_memory  # noqa: F401 (parse_max_memory: re-exported)
from anatomy_cli.units import counted

# ---------------------------------------------------------------------------
# The breakdown: rows, per-layer rows, the result


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
    dtypes: tuple[str, ...] = ()           # header sources: storage types, most parameters first
    disk_bytes: int | None = None          # header sources: bytes on disk
    bits_per_weight: float | None = None   # header sources: 8 * disk_bytes / parameters


@dataclass(frozen=True)
class LayerRow:
    """One block (``name`` its module path, ``index`` its number in the stack): parameters
    per category (see :data:`LAYER_CATEGORIES`), its total and active count; from a header, how its
    tensors are stored (as :class:`Row`'s)."""

    name: str
    index: int
    parameters: dict[str, int]
    total: int
    share: float
    active: int | None = None
    memory_bytes: int | None = None
    dtypes: tuple[str, ...] = ()
    disk_bytes: int | None = None
    bits_per_weight: float | None = None


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
    devices: tuple[dict[str, object], ...]

    def to_dict(self) -> dict[str, object]:
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
    read_from: str = "meta"                       # "meta" | "gguf_header" | "safetensors_header"
    disk_bytes: int | None = None                 # header sources: all tensors' bytes on disk
    quantization: str | None = None               # GGUF: the type holding most parameters (Q4_1)
    dequantized_bytes: dict[str, int] | None = None  # header sources: fp32/bf16/fp16 -> bytes once loaded

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def to_dict(self) -> dict[str, object]:
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
                 "active": lr.active, "memory_bytes": lr.memory_bytes, "dtypes": list(lr.dtypes),
                 "disk_bytes": lr.disk_bytes, "bits_per_weight": lr.bits_per_weight} for lr in self.layers],
            "outside_layers": None if self.outside_layers is None else [_row_dict(r) for r in self.outside_layers],
            "placement": None if self.placement is None else self.placement.to_dict(),
            "read_from": self.read_from,
            "disk_bytes": self.disk_bytes,
            "bits_per_weight": None if self.disk_bytes is None else _bpw(self.disk_bytes, self.total),
            "quantization": self.quantization,
            "dequantized_bytes": None if self.dequantized_bytes is None else dict(self.dequantized_bytes),
            "notes": list(self.notes),
        }


def _bpw(n_bytes: int, n_params: int) -> float | None:
    return 8 * n_bytes / n_params if n_params else None


def _row_dict(row: Row) -> dict[str, object]:
    return {"key": row.key, "label": row.label, "layers": row.layers, "parameters": row.parameters,
            "share": row.share, "active": row.active, "memory_bytes": row.memory_bytes,
            "dtypes": list(row.dtypes), "disk_bytes": row.disk_bytes, "bits_per_weight": row.bits_per_weight}


@dataclass
class _Tensor:
    name: str
    numel: int
    category: str
    layer: str | None  # block path
    index: int | None  # block number
    recognised: bool
    per_expert: dict[int, int] | None = None  # routed experts: expert index -> parameters


def rule_notes(unrecognised: list[str], generic: bool, model_type: str, table: str | None = None) -> list[str]:
    """The notes on tensors no rule matched (``table``: the family table they were matched against) and on a
    model type with no table of its own; the headers and the meta count say them alike."""
    notes = []
    if unrecognised:
        n = len(unrecognised)
        against = f" of the '{table}' table" if table else ""
        notes.append(f"{counted(n, 'tensor')} matched no rule{against} and {'is' if n == 1 else 'are'} counted in "
                     f"LayerNorm + other: {_short_list(unrecognised)}.")
    if generic:
        notes.append(f"model_type '{model_type}' has no rule table: the total is exact, the split into rows is "
                     "best effort.")
    return notes


def _fmt(n: int) -> str:
    return f"{n:,}"


def _short_list(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit:,} more" if len(names) > limit else "")


def _in_layer(t: _Tensor) -> bool:
    return t.layer is not None and t.category in LAYER_CATEGORIES


def _layer_rows(tensors: list[_Tensor], total: int, routed_active: dict[str | None, int],
                moe: MoEInfo | None, mem) -> list[LayerRow]:
    per: dict[str, dict[str, int]] = {}  # block path -> counts, in model order
    index: dict[str, int] = {}
    for t in tensors:
        if _in_layer(t):
            assert t.layer is not None and t.index is not None  # _in_layer: a block's tensor has both
            per.setdefault(t.layer, dict.fromkeys(LAYER_CATEGORIES, 0))[t.category] += t.numel
            index[t.layer] = t.index
    out = []
    for name in sorted(per, key=_natural):  # blocks by number: a GGUF file lists blk.10 before blk.2
        counts = per[name]
        layer_total = sum(counts.values())
        active = None
        if moe is not None and moe.active is not None:
            active = layer_total - counts[ROUTED] + routed_active.get(name, 0)
        out.append(LayerRow(name, index[name], dict(counts), layer_total, layer_total / total if total else 0.0,
                            active, mem(layer_total)))
    return out


def _natural(path: str) -> tuple[tuple[int, int | str], ...]:
    """``model.layers.10`` after ``model.layers.9``: the path's numbers compared as numbers."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", path) if p)


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
