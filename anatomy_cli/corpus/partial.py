"""Partial sums of one shard: exact, mergeable, float64; and their Parquet table form.

For every figure (a metric at a layer, or at a (layer, head)) a :class:`Partial` keeps

* ``n``: how many values (token positions) were summed, ``sum``: their sum (float64);
* ``n_windows``, ``sum_w``, ``sumsq_w``: over windows, the count, sum and sum of squares of each
  window's own mean (float64), from which the standard error over windows follows.

Each lens measured has its own figures (:data:`LENS_METRICS`): the logit lens under the plain names
(``kl_nats``, ...), a fitted lens under its kind's (``tuned.kl_nats``, ``jacobian.kl_nats``: :func:`lens_metric`).
``bytes`` counts the UTF-8 bytes of the text the measured windows' tokens cover (bits per byte).

Massive activations keep, per layer, the largest |h| seen (``max_abs``, first occurrence wins), its
dimension, and ``argmax``: how often each dimension held a position's largest |h| (int64 ``[L + 1, d]``).
With ``--experts``, ``experts`` holds the MoE blocks' routing counts and weight sums
(:class:`~anatomy_cli.corpus.expert_sums.ExpertSums`). Merging adds sums and counts, and keeps the larger
maximum (the earlier shard on a tie): merged in shard order, the result does not depend on how shards were
spread over workers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING

import numpy as np

from anatomy_cli.corpus.expert_sums import ExpertSums

if TYPE_CHECKING:
    import pyarrow as pa

LENS_METRICS = ("kl_nats", "top1_agree", "ce_bits", "entropy_nats")
LAYER_METRICS = (*LENS_METRICS, "resid_norm", "cos_to_embedding", "attn_out_norm", "mlp_out_norm")
HEAD_METRICS = ("head_entropy_nats", "head_first_token", "head_prev_token")
SUMS = ("n", "sum", "n_windows", "sum_w", "sumsq_w")


def lens_metric(kind: str, metric: str) -> str:
    """The key of a lens' figure: ``metric`` for the logit lens, ``kind.metric`` for a fitted lens."""
    return metric if kind == "logit" else f"{kind}.{metric}"


@dataclass
class Partial:
    """Sums for ``n_layers + 1`` layer rows and ``n_layers * n_heads`` head rows (see the module docstring).

    ``sums[metric][key]`` is a 1-D array: int64 for ``n``/``n_windows``, float64 otherwise. ``windows`` and
    ``tokens`` count what was measured; ``seconds`` (forward, lens, heads) is timing only, never merged into
    figures. ``fitted``: the kinds of the fitted lenses measured (``tuned``, ``jacobian``), each with its own
    :data:`LENS_METRICS`; ``bytes``: the UTF-8 bytes of the measured tokens' text.
    """

    n_layers: int
    n_heads: int
    d_model: int
    fitted: tuple[str, ...] = ()
    sums: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    max_abs: np.ndarray = field(init=False)  # set by __post_init__ (from_table: read)
    max_dim: np.ndarray = field(init=False)
    argmax: np.ndarray = field(init=False)
    windows: int = 0
    tokens: int = 0
    bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    experts: ExpertSums | None = None

    def __post_init__(self) -> None:
        self.fitted = tuple(self.fitted)
        fitted = [lens_metric(kind, m) for kind in self.fitted for m in LENS_METRICS]
        rows = {m: self.n_layers + 1 for m in (*LAYER_METRICS, *fitted)} | {
            m: self.n_layers * self.n_heads for m in HEAD_METRICS}
        for metric, size in rows.items():
            if metric not in self.sums:
                self.sums[metric] = {k: np.zeros(size, np.int64 if k.startswith("n") else np.float64) for k in SUMS}
        self.max_abs = np.full(self.n_layers + 1, -np.inf)
        self.max_dim = np.full(self.n_layers + 1, -1, np.int64)
        self.argmax = np.zeros((self.n_layers + 1, self.d_model), np.int64)

    def add_window(self, metric: str, sums: np.ndarray, counts: np.ndarray) -> None:
        """One window's ``sums`` (float64 ``[rows]``) of ``counts`` (int ``[rows]``) values; rows with 0 are skipped."""
        s = self.sums[metric]
        has = counts > 0
        mean = np.where(has, sums / np.maximum(counts, 1), 0.0)
        s["n"] += counts.astype(np.int64)
        s["sum"] += np.where(has, sums, 0.0)
        s["n_windows"] += has
        s["sum_w"] += mean
        s["sumsq_w"] += mean * mean

    def add_max(self, values: np.ndarray, dims: np.ndarray) -> None:
        """A window's largest |h| per layer (``[L + 1]``) and its dimension; strictly larger replaces."""
        better = values > self.max_abs
        self.max_abs = np.where(better, values, self.max_abs)
        self.max_dim = np.where(better, dims, self.max_dim)

    def merge(self, other: Partial) -> Partial:
        """``self`` followed by ``other`` (in this order), in place; returns self."""
        for metric, sums in other.sums.items():
            for key, value in sums.items():
                self.sums[metric][key] = self.sums[metric][key] + value
        self.add_max(other.max_abs, other.max_dim)
        self.argmax = self.argmax + other.argmax
        if other.experts is not None:
            self.experts = other.experts.copy() if self.experts is None else self.experts.merge(other.experts)
        self.windows += other.windows
        self.tokens += other.tokens
        self.bytes += other.bytes
        for key, seconds in other.seconds.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        return self

    # ---- Parquet form: one row per (metric, index) with the five sums; see docs/corpus.md
    def to_table(self) -> pa.Table:
        import pyarrow as pa

        metric: list[str] = []
        index: list[int] = []
        cols: dict[str, list[np.ndarray]] = {k: [] for k in SUMS}
        for name, sums in self.sums.items():
            metric += [name] * len(sums["n"])
            index += list(range(len(sums["n"])))
            for k in SUMS:
                cols[k].append(sums[k])
        metric += ["max_abs"] * (self.n_layers + 1)
        index += list(range(self.n_layers + 1))
        layer, dim = np.nonzero(self.argmax)
        metric += ["argmax_count"] * len(layer)
        index += list(layer * self.d_model + dim)
        n_parts, sum_parts = [*cols["n"], self.max_dim, self.argmax[layer, dim]], [*cols["sum"], self.max_abs,
                                                                                   np.zeros(len(layer))]
        if self.experts is not None:
            names, at, counts, totals = self.experts.rows()
            metric += names
            index += list(at)
            n_parts.append(counts)
            sum_parts.append(totals)
        extra = len(metric) - sum(len(c) for c in cols["n"])
        n = np.concatenate(n_parts)
        total = np.concatenate(sum_parts)
        rest = {k: np.concatenate([*cols[k], np.zeros(extra, cols[k][0].dtype)]) for k in SUMS[2:]}
        meta = {"n_layers": self.n_layers, "n_heads": self.n_heads, "d_model": self.d_model, "windows": self.windows,
                "tokens": self.tokens, "bytes": self.bytes, "fitted": list(self.fitted), "seconds": self.seconds}
        if self.experts is not None:
            meta["experts"] = self.experts.meta()
        table = pa.table({"metric": metric, "index": np.asarray(index, np.int64), "n": n, "sum": total, **rest})
        return table.replace_schema_metadata({"anatomy.partial": json.dumps(meta)})

    @classmethod
    def from_table(cls, table: pa.Table) -> Partial:
        meta = json.loads(table.schema.metadata[b"anatomy.partial"])
        if "bytes" not in meta:  # a shard written before entropy and bytes were measured: Store.load recomputes it
            raise ValueError("written before the entropy and bits per byte were measured")
        part = cls(meta["n_layers"], meta["n_heads"], meta["d_model"], tuple(meta["fitted"]), windows=meta["windows"],
                   tokens=meta["tokens"], bytes=meta["bytes"], seconds=meta["seconds"])
        cols = {k: table.column(k).to_numpy() for k in ("index", *SUMS)}
        names = np.asarray(table.column("metric").to_pylist())
        for name in part.sums:
            rows = names == name
            order = np.argsort(cols["index"][rows])
            for k in SUMS:
                part.sums[name][k] = cols[k][rows][order].astype(part.sums[name][k].dtype)
        rows = names == "max_abs"
        order = np.argsort(cols["index"][rows])
        part.max_abs = cols["sum"][rows][order].astype(np.float64)
        part.max_dim = cols["n"][rows][order].astype(np.int64)
        rows = names == "argmax_count"
        flat = np.zeros(part.argmax.size, np.int64)
        flat[cols["index"][rows]] = cols["n"][rows]
        part.argmax = flat.reshape(part.argmax.shape)
        if "experts" in meta:
            part.experts = ExpertSums.from_rows(meta["experts"], names, cols["index"], cols["n"], cols["sum"])
        return part
