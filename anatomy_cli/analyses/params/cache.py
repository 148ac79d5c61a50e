"""A per-config cache of meta-device parameter counts, so a repeated ``anatomy params`` imports no torch.

The key is a SHA-256 of the config's content (a preset's shape, or the config.json bytes of a
directory or of the Hugging Face cache), the spec and location as shown, the options, the
versions of anatomy and transformers, and the size and mtime of the counting modules. The value is the pickled
:class:`~anatomy_cli.analyses.params.breakdown.ParamsResult`. Files live in ``$ANATOMY_CACHE_DIR``,
else ``$XDG_CACHE_HOME/anatomy``, else ``~/.cache/anatomy``, under ``params/``. An unreadable
or stale entry is a miss; a cache that cannot be written is skipped silently (the count is
still right, only slower next time). Delete the directory to clear it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import anatomy_cli
from anatomy_cli.models import presets
from anatomy_cli.models.cachedir import cache_dir
from anatomy_cli.models.resolve import Source
from anatomy_cli.models.resolve import config_path

if TYPE_CHECKING:
    from anatomy_cli.analyses.params.breakdown import ParamsResult

__all__ = ["cache_dir", "get", "key", "put"]

_FORMAT = 1


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def key(source: Source, *, dtype: str | None, per_layer: bool) -> str | None:
    """The cache key for counting ``source`` on the meta device; None when it has no config file."""
    if source.kind == "preset":
        content = json.dumps(presets.PRESETS[source.ref], sort_keys=True).encode()
        location = ""
    elif source.kind in ("dir", "hub"):
        try:
            path = config_path(source)
            content = path.read_bytes()
        except (OSError, Exception):
            return None
        location = str(path.parent) if source.kind == "dir" else str(path)
    else:
        return None
    # The counting code itself is part of the key (size and mtime of its modules), so an edited or
    # upgraded anatomy never reads a count made by other code.
    here = Path(__file__).parent
    code = [(f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(here.glob("params*.py"))]
    parts = [_FORMAT, anatomy_cli.__version__, _version("transformers"), code, source.kind, source.spec, location,
             dtype, per_layer, hashlib.sha256(content).hexdigest()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _file(k: str) -> Path:
    return cache_dir() / "params" / f"{k}.pickle"


def get(k: str) -> ParamsResult | None:
    """The cached result for key ``k``, or None."""
    try:
        with open(_file(k), "rb") as f:
            return pickle.load(f)
    except Exception:
        return None


def put(k: str, result: ParamsResult) -> None:
    """Store ``result`` under ``k`` (atomically; errors ignored)."""
    target = _file(k)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, target)
    except OSError:
        pass
