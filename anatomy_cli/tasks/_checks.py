"""The options checks that need no model, worded once (``--top takes a whole number of at least 1``)."""

from __future__ import annotations

from anatomy_cli.errors import UsageError


def at_least(option: str, value: int | None, least: int = 1) -> None:
    """UsageError unless ``value`` (None: not given, fine) is a whole number ``>= least``."""
    if value is not None and value < least:
        raise UsageError(f"{option} takes a whole number of at least {least}")
