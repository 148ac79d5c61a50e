"""The column kinds the renderers treat alike (:class:`anatomy_cli.output.render.Column` describes each kind)."""

from __future__ import annotations

NUMERIC = ("int", "id", "float", "number", "prob", "pct", "bytes")  # printed whole, right-aligned, never wrapped
BAR_KINDS = ("bar", "signed_bar")  # table-only columns (a picture of a number): never in tsv/csv/json
