"""One shard's feature statistics (`anatomy features`): exact, mergeable, independent of how the shards were spread.

For each followed feature a :class:`FeatureSums` keeps

* ``fires`` (tokens where it is > 0), ``sums`` (float64 sum of its activations), ``maxes``;
* ``hist``: how many of its firing activations fall in each of :data:`N_BINS` fixed log-spaced bins
  (:data:`EDGES`: ``2^(k/2)`` for k = -40..40, so bin 0 is ``(0, 2^-20)``, bin j ``[2^((j-41)/2), 2^((j-40)/2))``,
  the last ``[2^20, inf)``): fixed before any data, so shards add;
* ``top``: its ``top_k`` largest activations (ties: the earlier window, then the earlier position), each with its
  context (``window`` tokens each side, every token's activation of this feature kept);
* ``samples``: per histogram bin, the ``quantile_size`` firing tokens of smallest random key (:func:`keys`: a hash
  of the seed, the window's global index, the position and the feature), with their contexts: a bottom-k sample,
  uniform without replacement within the bin, and the union of bins' samples holds the bottom-k sample of any
  union of bins (corpus/feature_summary.py draws the quantile groups from it);
* ``cooc`` (when asked): ``[F, d_sae]`` tokens where feature f and feature g both fire.

Merging adds counts and sums and keeps the larger maximum; candidates are pooled and chosen again by the same total
order, so the merged shards (in shard order) give the same numbers however they were computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

EDGES = 2.0 ** (np.arange(-40, 41) / 2)
N_BINS = len(EDGES) + 1
_CAND = ("fidx", "act", "window", "pos", "key", "bin")


def bin_of(acts: np.ndarray) -> np.ndarray:
    """The histogram bin of each (positive) activation."""
    return np.searchsorted(EDGES, acts, side="right").astype(np.int64)


def keys(seed: int, window: np.ndarray, pos: np.ndarray, feature: np.ndarray) -> np.ndarray:
    """A token's random key for feature ``feature`` (int64 ≥ 0): splitmix64 of the seed, the window's global index,
    the position and the feature id, so a sample never depends on batches, shards or workers."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) ^ window.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
             ^ pos.astype(np.uint64) * np.uint64(0x94D049BB133111EB) ^ feature.astype(np.uint64)
             * np.uint64(0xD6E8FEB86659FD93))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(1)).astype(np.int64)


@dataclass
class Candidates:
    """Tokens kept with their contexts: ``fidx`` (index into the followed features), ``act``, ``window`` (global
    index), ``pos``, ``key``, ``bin``; ``ctx_tok [n, 2w+1]`` (-1 past the window's ends), ``ctx_act [n, 2w+1]``."""

    width: int
    fidx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    act: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    window: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    bin: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ctx_tok: np.ndarray | None = None
    ctx_act: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.ctx_tok is None:
            self.ctx_tok = np.zeros((len(self.fidx), self.width), np.int64)
        if self.ctx_act is None:
            self.ctx_act = np.zeros((len(self.fidx), self.width), np.float32)

    def __len__(self) -> int:
        return len(self.fidx)

    def take(self, idx: np.ndarray) -> Candidates:
        assert self.ctx_tok is not None and self.ctx_act is not None
        return Candidates(self.width, **{k: getattr(self, k)[idx] for k in _CAND}, ctx_tok=self.ctx_tok[idx],
                          ctx_act=self.ctx_act[idx])

    def columns(self, other: Candidates) -> Candidates:
        """``self`` and ``other`` pooled (``other``'s index ``i`` at ``len(self) + i``) without the contexts (empty
        ``[0, width]``): what :func:`choose` reads."""
        none = np.zeros((0, self.width), np.int64)
        return Candidates(self.width, **{k: np.concatenate([getattr(self, k), getattr(other, k)]) for k in _CAND},
                          ctx_tok=none, ctx_act=none.astype(np.float32))

    def pick(self, other: Candidates, idx: np.ndarray) -> Candidates:
        """Candidates ``idx`` of ``self`` and ``other`` pooled (as :meth:`columns` pools them), contexts included:
        only the chosen contexts are copied."""
        assert self.ctx_tok is not None and self.ctx_act is not None
        assert other.ctx_tok is not None and other.ctx_act is not None
        n, mine = len(self), idx < len(self)
        ctx_tok = np.empty((len(idx), self.width), np.int64)
        ctx_act = np.empty((len(idx), self.width), np.float32)
        ctx_tok[mine], ctx_act[mine] = self.ctx_tok[idx[mine]], self.ctx_act[idx[mine]]
        ctx_tok[~mine], ctx_act[~mine] = other.ctx_tok[idx[~mine] - n], other.ctx_act[idx[~mine] - n]
        return Candidates(self.width, **{k: np.concatenate([getattr(self, k), getattr(other, k)])[idx] for k in _CAND},
                          ctx_tok=ctx_tok, ctx_act=ctx_act)


def choose(c: Candidates, kind: str, k: int) -> np.ndarray:
    """The indices of ``c`` kept, in order: ``top``, per feature the ``k`` largest activations (then the earlier
    window, the earlier position); ``sample``, per (feature, bin) the ``k`` smallest keys."""
    if kind == "top":
        order = np.lexsort((c.pos, c.window, -c.act.astype(np.float64), c.fidx))
        group = c.fidx[order]
    else:
        order = np.lexsort((c.pos, c.window, c.key, c.bin, c.fidx))
        group = c.fidx[order] * N_BINS + c.bin[order]
    if not len(order):
        return order
    starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return order[rank < k]


@dataclass
class FeatureSums:
    """A shard's (or a merged run's) sums for the followed ``features`` (ids); see the module docstring."""

    features: np.ndarray
    top_k: int
    quantile_size: int
    width: int
    d_sae: int
    cooccur: bool = False
    tokens: int = 0
    windows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    fires: np.ndarray = field(init=False)
    sums: np.ndarray = field(init=False)
    maxes: np.ndarray = field(init=False)
    hist: np.ndarray = field(init=False)
    cooc: np.ndarray | None = field(init=False)
    top: Candidates = field(init=False)
    samples: Candidates = field(init=False)
    nonzero: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # --delphi: (locations, acts)

    def __post_init__(self) -> None:
        n = len(self.features)
        self.fires, self.sums = np.zeros(n, np.int64), np.zeros(n, np.float64)
        self.maxes, self.hist = np.zeros(n, np.float64), np.zeros((n, N_BINS), np.int64)
        self.cooc = np.zeros((n, self.d_sae), np.int64) if self.cooccur else None
        self.top, self.samples = Candidates(2 * self.width + 1), Candidates(2 * self.width + 1)

    def empty(self) -> FeatureSums:
        return FeatureSums(self.features, self.top_k, self.quantile_size, self.width, self.d_sae, self.cooccur)

    def merge(self, other: FeatureSums) -> None:
        """Add ``other``'s counts and sums; pool its candidates and choose again."""
        self.tokens += other.tokens
        self.windows += other.windows
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        self.fires += other.fires
        self.sums += other.sums
        self.maxes = np.maximum(self.maxes, other.maxes)
        self.hist += other.hist
        if self.cooc is not None and other.cooc is not None:
            self.cooc += other.cooc
        self.top = self.top.pick(other.top, choose(self.top.columns(other.top), "top", self.top_k))
        self.samples = self.samples.pick(other.samples, choose(self.samples.columns(other.samples), "sample",
                                                               self.quantile_size))

    # -- Parquet: one row per followed feature; candidates and histogram as list columns

    def to_table(self) -> pa.Table:
        import pyarrow as pa

        n = len(self.features)
        cols: dict[str, object] = {"feature": pa.array(self.features, pa.int64()), "fires": pa.array(self.fires),
                                "sum": pa.array(self.sums), "max": pa.array(self.maxes),
                                "hist": _lists(np.repeat(np.arange(n), N_BINS), n, self.hist.reshape(-1))}
        if self.cooc is not None:
            f, g = np.nonzero(self.cooc)
            cols["cooc_ids"] = _lists(f, n, g)
            cols["cooc_counts"] = _lists(f, n, self.cooc[f, g])
        for prefix, c in (("top_", self.top), ("sample_", self.samples)):
            order = np.argsort(c.fidx, kind="stable")
            c = c.take(order)
            assert c.ctx_tok is not None and c.ctx_act is not None
            for k in _CAND[1:]:
                cols[prefix + k] = _lists(c.fidx, n, getattr(c, k))
            cols[prefix + "ctx_tok"] = _lists(c.fidx, n, c.ctx_tok)
            cols[prefix + "ctx_act"] = _lists(c.fidx, n, c.ctx_act)
        meta = {"tokens": self.tokens, "windows": self.windows, "seconds": self.seconds, "top_k": self.top_k,
                "quantile_size": self.quantile_size, "width": self.width, "d_sae": self.d_sae,
                "cooccur": self.cooccur}
        return pa.table(cols).replace_schema_metadata({"anatomy.features": json.dumps(meta, sort_keys=True)})

    @classmethod
    def from_table(cls, table: pa.Table) -> FeatureSums:
        meta = json.loads(table.schema.metadata[b"anatomy.features"])
        out = cls(np.asarray(table.column("feature").to_numpy(), np.int64), meta["top_k"], meta["quantile_size"],
                  meta["width"], meta["d_sae"], meta["cooccur"], meta["tokens"], meta["windows"], meta["seconds"])
        out.fires, out.sums = table.column("fires").to_numpy().copy(), table.column("sum").to_numpy().copy()
        out.maxes = table.column("max").to_numpy().copy()
        out.hist = _flat(table, "hist")[1].reshape(len(out.features), N_BINS).copy()
        if out.cooc is not None:
            f, g = _flat(table, "cooc_ids")
            out.cooc[f, g] = _flat(table, "cooc_counts")[1]
        for prefix, name in (("top_", "top"), ("sample_", "samples")):
            fidx, _ = _flat(table, prefix + "act")
            parts = {k: _flat(table, prefix + k)[1] for k in (*_CAND[1:], "ctx_tok", "ctx_act")}
            setattr(out, name, Candidates(2 * out.width + 1, fidx, **parts))
        return out


def _lists(fidx: np.ndarray, n: int, values: np.ndarray) -> pa.ListArray:
    """A list column of ``n`` rows: row f holds ``values[fidx == f]`` (``fidx`` sorted; 2-D values: lists of
    fixed-size lists)."""
    import pyarrow as pa

    offsets = np.searchsorted(fidx, np.arange(n + 1)).astype(np.int32)
    if values.ndim == 2:
        inner = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        return pa.ListArray.from_arrays(pa.array(offsets), inner)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(row index, values)`` of a list column (2-D values for lists of fixed-size lists)."""
    import pyarrow as pa

    col = table.column(name).combine_chunks()
    offsets = col.offsets.to_numpy()
    rows = np.repeat(np.arange(len(col)), np.diff(offsets))
    values = col.flatten()
    if pa.types.is_fixed_size_list(values.type):
        return rows, values.flatten().to_numpy(zero_copy_only=False).reshape(len(values), values.type.list_size)
    return rows, values.to_numpy(zero_copy_only=False)
