"""Where anatomy keeps what it caches: ``$ANATOMY_CACHE_DIR``, else ``$XDG_CACHE_HOME/anatomy``, else
``~/.cache/anatomy``. Each user has a subdirectory (``params/``, ``gguf-tokenizers/``); deleting any of them
only costs time."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where anatomy caches results (see the module docstring)."""
    root = os.environ.get("ANATOMY_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "anatomy"
