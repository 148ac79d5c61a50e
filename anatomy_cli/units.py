"""Units shown to people: byte sizes. Standard library only; any layer may import it."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    value = float(n)
    for unit in units:
        if abs(value) < 1024 or unit == units[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
