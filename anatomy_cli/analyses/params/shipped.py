"""The built-in presets' breakdowns, shipped with the package: ``anatomy params llama-7b`` imports no torch.

The presets (:data:`anatomy_cli.models.presets.PRESETS`) are fixed shapes, so their meta-device counts are
data: ``presets.json`` beside this module holds, per preset, the breakdown without a dtype and with
``--per-layer`` (each a :class:`ParamsResult` as :func:`dataclasses.asdict` writes it). A dtype only adds
memory columns, computed here by the same rule as the meta count (:func:`with_dtype`).

``presets.json`` is written by ``python -m anatomy_cli.analyses.params.generate_presets`` (which counts on
the meta device) and checked against that count by ``tests/test_params_presets.py``. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from anatomy_cli.analyses.params.breakdown import LayerRow
from anatomy_cli.analyses.params.breakdown import MoEInfo
from anatomy_cli.analyses.params.breakdown import ParamsResult
from anatomy_cli.analyses.params.breakdown import Row
from anatomy_cli.analyses.params.rules import DTYPE_BITS
from anatomy_cli.analyses.params.rules import memory_bytes
from anatomy_cli.models.presets import PRESETS

DATA = Path(__file__).with_name("presets.json")


def dtype_note(dtype: str, moe: bool) -> str:
    """The footnote a ``--dtype`` adds (shared with the meta count, :mod:`.meta`)."""

    note = (f"Memory: parameters x {DTYPE_BITS[dtype] / 8:g} bytes ({dtype}); the weights that must be resident"
            f"{', every expert included' if moe else ''}; no activations, KV cache or optimizer state")
    if dtype in ("int8", "int4"):
        note += ", and no quantization scales"
    return note + "."


def with_dtype(result: ParamsResult, dtype: str | None) -> ParamsResult:
    """``result`` (counted without a dtype) with the memory columns and footnote ``dtype`` adds."""
    if dtype is None:
        return result

    def mem(n: int) -> int:
        return memory_bytes(n, dtype)

    return dataclasses.replace(
        result, dtype=dtype, memory_bytes=mem(result.total),
        rows=tuple(dataclasses.replace(r, memory_bytes=mem(r.parameters)) for r in result.rows),
        layers=None if result.layers is None else tuple(
            dataclasses.replace(lr, memory_bytes=mem(lr.total)) for lr in result.layers),
        outside_layers=None if result.outside_layers is None else tuple(
            dataclasses.replace(r, memory_bytes=mem(r.parameters)) for r in result.outside_layers),
        notes=(*result.notes, dtype_note(dtype, result.moe is not None)))


def to_data(result: ParamsResult) -> dict[str, Any]:
    """``result`` as JSON-able data (:func:`dataclasses.asdict`); :func:`from_data` reads it back."""
    if result.placement is not None or result.dtype is not None:
        raise ValueError("only a breakdown without placement and dtype is shipped")
    return dataclasses.asdict(result)


def from_data(d: dict[str, Any]) -> ParamsResult:
    """The :class:`ParamsResult` :func:`to_data` wrote (lists back to tuples)."""
    def row(r: dict[str, Any]) -> Row:
        return Row(**{**r, "dtypes": tuple(r["dtypes"])})

    return ParamsResult(**{
        **d, "rows": tuple(row(r) for r in d["rows"]),
        "non_embedding_excludes": tuple(d["non_embedding_excludes"]),
        "tied": tuple(tuple(pair) for pair in d["tied"]), "unrecognised": tuple(d["unrecognised"]),
        "moe": None if d["moe"] is None else MoEInfo(**d["moe"]),
        "layers": None if d["layers"] is None else tuple(LayerRow(**{**lr, "dtypes": tuple(lr.get("dtypes", ()))})
                                                         for lr in d["layers"]),
        "outside_layers": None if d["outside_layers"] is None else tuple(row(r) for r in d["outside_layers"]),
        "notes": tuple(d["notes"])})


@lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    try:
        return json.loads(DATA.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def breakdown(name: str, *, dtype: str | None, per_layer: bool) -> ParamsResult | None:
    """The shipped breakdown of preset ``name``, or None when it is not shipped (or its shape changed
    since ``presets.json`` was written: then the caller counts on the meta device)."""

    entry = _load().get("presets", {}).get(name)
    if entry is None or name not in PRESETS or entry.get("shape") != json.loads(json.dumps(PRESETS[name])):
        return None
    return with_dtype(from_data(entry["per_layer" if per_layer else "default"]), dtype)
