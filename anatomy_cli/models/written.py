"""Files anatomy writes for the user get the mode ``open()`` gives a new file under the umask (0644 under 022):
safetensors' writer and ``tempfile.mkstemp`` create theirs 0600, readable by their owner only."""

from __future__ import annotations

import os
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask sets it: put it back at once (at import, before any thread)
    os.umask(mask)
    return mask


MODE = 0o666 & ~_umask()


def as_user_file(path: str | Path) -> None:
    """Give ``path`` (a file just written) :data:`MODE`."""
    os.chmod(path, MODE)
