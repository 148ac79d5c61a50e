"""The model a command uses when ``--model`` is not given: set once by the user. Standard library only.

In this order: the environment variable ``ANATOMY_MODEL``; the file ``default_model.txt`` in the user config
directory (``$ANATOMY_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/anatomy``, else ``~/.config/anatomy``), written by
``anatomy models --default NAME`` (as ``llm models default`` keeps its own); else :data:`FALLBACK`.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ANATOMY_MODEL"
FALLBACK = "gpt2"
FILE = "default_model.txt"


def config_dir() -> Path:
    """The user config directory (see the module docstring)."""
    if os.environ.get("ANATOMY_CONFIG_DIR"):
        return Path(os.environ["ANATOMY_CONFIG_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base).expanduser() / "anatomy"


def stored() -> str | None:
    """The default ``anatomy models --default`` stored, or None."""
    try:
        text = (config_dir() / FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def default_model() -> str:
    """The model to use when ``--model`` is not given."""
    return os.environ.get(ENV, "").strip() or stored() or FALLBACK


def where() -> str:
    """Where :func:`default_model`'s answer came from: ``ANATOMY_MODEL``, the file's path, or ``built-in``."""
    if os.environ.get(ENV, "").strip():
        return ENV
    return str(config_dir() / FILE) if stored() else "built-in"


def store(name: str | None) -> Path:
    """Write ``name`` as the stored default (None: remove it, back to the built-in one). Returns the file."""
    path = config_dir() / FILE
    if name is None:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name + "\n", encoding="utf-8")
    return path
