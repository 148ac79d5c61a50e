"""`diff` on weights: two checkpoints compared tensor by tensor, grouped as `params` groups them.

Each tensor pair is read (:mod:`anatomy_cli.models.tensors`), compared and dropped before the next is
read: peak memory is one tensor of each model, never a model. The sums are float64, accumulated over
row chunks, so a group's figures are those of its tensors laid end to end as one vector:

* ``rel_change`` = ‖W_B − W_A‖ / ‖W_A‖ (Frobenius norms; 0 for identical weights; inf when W_A is 0);
* ``cosine`` = ⟨W_A, W_B⟩ / (‖W_A‖ ‖W_B‖) (None when either is all zeros);
* ``max_abs_delta`` = max |W_B − W_A| over every element.

Rows are the ``params`` categories (:func:`anatomy_cli.analyses.params.classify` by the model family's
name rules) per block, then the tensors outside the blocks (embeddings, final norm, LM head) with
``layer`` None. A tied head is the embedding and is compared once; a tied model against an untied
one compares the untied head with the tied model's embedding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import torch

from anatomy_cli.analyses.diff.headers import read_header
from anatomy_cli.analyses.params.rules import CATEGORIES
from anatomy_cli.analyses.params.rules import HEAD
from anatomy_cli.analyses.params.rules import LAYER_CATEGORIES
from anatomy_cli.analyses.params.rules import classify
from anatomy_cli.analyses.params.rules import family_for
from anatomy_cli.errors import UsageError
from anatomy_cli.models.tensors import open_tensors

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.diff.headers import Header
    from anatomy_cli.analyses.params.rules import Family
    from anatomy_cli.models.tensors import TensorReader

_LAYER_RE = re.compile(r"^(?:.*?\.)?(?:h|layers|layer|blocks|block)\.(\d+)\.")
_CHUNK = 1 << 22  # elements per float64 chunk (32 MiB)


@dataclass(frozen=True)
class Sums:
    """Float64 sums over aligned elements: Σa², Σb², Σab, Σ(b−a)², max |b−a|, and the element count."""

    aa: float = 0.0
    bb: float = 0.0
    ab: float = 0.0
    dd: float = 0.0
    max_abs: float = 0.0
    n: int = 0

    def __add__(self, other: Sums) -> Sums:
        return Sums(self.aa + other.aa, self.bb + other.bb, self.ab + other.ab, self.dd + other.dd,
                    max(self.max_abs, other.max_abs), self.n + other.n)

    @property
    def rel_change(self) -> float:
        if self.aa == 0:
            return 0.0 if self.dd == 0 else math.inf
        return math.sqrt(self.dd) / math.sqrt(self.aa)

    @property
    def cosine(self) -> float | None:
        if self.aa == 0 or self.bb == 0:
            return None
        return max(-1.0, min(1.0, self.ab / math.sqrt(self.aa * self.bb)))


def compare(a: torch.Tensor, b: torch.Tensor) -> Sums:
    """The :class:`Sums` of two torch tensors of one shape, in float64, chunk by chunk."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    total = Sums()
    for start in range(0, fa.numel(), _CHUNK):
        x = fa[start:start + _CHUNK].to(torch.float64)
        y = fb[start:start + _CHUNK].to(torch.float64)
        d = y - x
        total = total + Sums(float(x @ x), float(y @ y), float(x @ y), float(d @ d),
                             float(d.abs().max()) if d.numel() else 0.0, int(d.numel()))
    return total


@dataclass(frozen=True)
class TensorDiff:
    """One tensor pair: transformers' ``name`` (A's), ``layer`` (None outside the blocks), ``component``
    (a ``params`` category), ``shape``, stored types in A and B, and the figures."""

    name: str
    layer: int | None
    component: str
    shape: tuple[int, ...]
    a_type: str
    b_type: str
    n_params: int
    rel_change: float
    cosine: float | None
    max_abs_delta: float

    def to_dict(self) -> dict[str, object]:
        return {**vars(self), "shape": list(self.shape)}


@dataclass(frozen=True)
class WeightRow:
    """One group of tensors (a component of one block, or one outside the blocks): the figures of the
    group as one vector, the tensor count, parameters, and B's (and A's) stored types, most parameters first."""

    layer: int | None
    component: str
    n_tensors: int
    n_params: int
    rel_change: float
    cosine: float | None
    max_abs_delta: float
    b_types: tuple[str, ...]
    a_types: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {**vars(self), "b_types": list(self.b_types), "a_types": list(self.a_types)}


@dataclass(frozen=True)
class WeightsDiff:
    """The weight comparison of A and B: ``rows`` (blocks in order, then the outside components),
    ``tensors`` (every pair), ``total`` (every weight as one vector), ``tied_head`` (the head was the
    embedding in both and was compared once)."""

    a: str
    b: str
    n_layers: int
    rows: tuple[WeightRow, ...]
    tensors: tuple[TensorDiff, ...]
    total: WeightRow
    tied_head: bool

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "n_layers": self.n_layers, "tied_head": self.tied_head,
                "total": self.total.to_dict(), "rows": [r.to_dict() for r in self.rows],
                "tensors": [t.to_dict() for t in self.tensors]}


def pair_names(a: TensorReader, b: TensorReader) -> list[tuple[str, str]]:
    """``(name in A, name in B)`` for every tensor, A's order. A tied side's head is its embedding.

    Raises UsageError naming the first difference: a tensor one side lacks, or two shapes that differ.
    """
    def alias(reader: TensorReader, name: str) -> str | None:
        if name in reader.tensors:
            return name
        if reader.tied and name == reader.head_name and reader.embed_name in reader.tensors:
            return reader.embed_name
        return None

    pairs = []
    for name in a.tensors:
        other = alias(b, name)
        if other is None:
            raise UsageError(f"{b.spec} has no tensor {name} (of shape {_shape(a.tensors[name].shape)} in {a.spec}): "
                             f"the two models differ in architecture")
        pairs.append((name, other))
    for name in b.tensors:
        if name not in a.tensors and not (b.head_name == name and a.tied and alias(a, name)):
            raise UsageError(f"{a.spec} has no tensor {name} (of shape {_shape(b.tensors[name].shape)} in {b.spec}): "
                             f"the two models differ in architecture")
        if name not in a.tensors:
            assert a.embed_name is not None  # alias(a, name) found it
            pairs.append((a.embed_name, name))
    for na, nb in pairs:
        sa, sb = a.tensors[na].shape, b.tensors[nb].shape
        if sa is not None and sb is not None and sa != sb:
            raise UsageError(f"{na}: shape {_shape(sa)} in {a.spec}, {_shape(sb)} in {b.spec}: "
                             f"the two models differ in shape")
    return pairs


def _shape(shape: tuple[int, ...] | None) -> str:
    return "?" if shape is None else "[" + ", ".join(map(str, shape)) + "]"


def _place(name: str, family: Family) -> tuple[int | None, str]:
    m = _LAYER_RE.match(name)
    component = classify(name, family) or "other"
    return (int(m.group(1)) if m else None), component


def diff_weights(a: TensorReader, b: TensorReader, *,
                 progress: Callable[[int, int], None] | None = None) -> WeightsDiff:
    """Compare the tensors of two :class:`~anatomy_cli.models.tensors.TensorReader` s, one pair at a time.

    ``progress(done, total)`` is called after each pair. Raises UsageError when the tensor names or
    shapes differ (:func:`pair_names`) and CheckpointError when a tensor cannot be read.
    """
    family = family_for(a.model_type)
    pairs = pair_names(a, b)
    tensors = []
    groups: dict[tuple[int | None, str], list[tuple[TensorDiff, Sums]]] = {}
    for i, (na, nb) in enumerate(pairs):
        ta = a.read(na)
        tb = b.read(nb)
        if ta.shape != tb.shape:
            raise UsageError(f"{na}: shape {_shape(tuple(ta.shape))} in {a.spec}, {_shape(tuple(tb.shape))} in "
                             f"{b.spec}: the two models differ in shape")
        sums = compare(ta, tb)
        del ta, tb
        layer, component = _place(nb if nb == b.head_name else na, family)
        if nb == b.head_name and nb != na:
            component = HEAD  # an untied head compared with the tied side's embedding
        td = TensorDiff(na, layer, component, tuple(a.tensors[na].shape or b.tensors[nb].shape or ()),
                        a.tensors[na].dtype, b.tensors[nb].dtype, sums.n, sums.rel_change, sums.cosine, sums.max_abs)
        tensors.append(td)
        groups.setdefault((layer, component), []).append((td, sums))
        if progress is not None:
            progress(i + 1, len(pairs))
    order = {c: i for i, c in enumerate(LAYER_CATEGORIES)}
    keys = sorted((k for k in groups if k[0] is not None), key=lambda k: (k[0], order.get(k[1], 99), k[1]))
    outside = {c: i for i, c in enumerate(CATEGORIES)}  # embeddings first, the head last, as `params` lists them
    keys += sorted((k for k in groups if k[0] is None), key=lambda k: (outside.get(k[1], 99), k[1]))
    rows = tuple(_row(k[0], k[1], groups[k]) for k in keys)
    everything = [item for k in keys for item in groups[k]]
    return WeightsDiff(a.spec, b.spec, a.n_layers, rows, tuple(tensors), _row(None, "total", everything),
                       tied_head=a.tied and b.tied)


def _types(items: list[tuple[TensorDiff, Sums]], side: str) -> tuple[str, ...]:
    counts: dict[str, int] = {}
    for td, _ in items:
        for t in getattr(td, side).split("+"):
            counts[t] = counts.get(t, 0) + td.n_params
    return tuple(sorted(counts, key=lambda t: -counts[t]))


def _row(layer: int | None, component: str, items: list[tuple[TensorDiff, Sums]]) -> WeightRow:
    total = Sums()
    for _, s in items:
        total = total + s
    return WeightRow(layer, component, len(items), total.n, total.rel_change, total.cosine, total.max_abs,
                     _types(items, "b_type"), _types(items, "a_type"))


def open_weights(spec: str, *, trust_remote_code: bool = False, header: Header | None = None) -> TensorReader:
    """A :class:`~anatomy_cli.models.tensors.TensorReader` for a ``--model`` spec (a directory, a .gguf file,
    a cached Hub id); ``header`` (:func:`.headers.read_header`) when already read. Raises what resolving and
    reading the config raise, and CheckpointError for a source without weight files."""
    header = header or read_header(spec, trust_remote_code=trust_remote_code)
    return open_tensors(header.source, header.config)
