"""Units shown to people: byte sizes, durations, counts. Standard library only; any layer may import it."""

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


def human_seconds(seconds: float) -> str:
    """An expected duration: 4.2 -> '4.2 s', 75 -> '75 s', 176 -> '3 min', 7200 -> '2.0 h'."""
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def minutes(seconds: float) -> str:
    """``2:41``: seconds as minutes and seconds (an ETA)."""
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def counted(n: int, noun: str) -> str:
    """``1 window``, ``2 windows``, ``1,024 windows``: a count with its noun, plural by an added s."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
