"""``--out DIR``: a manifest, one Parquet file of partial sums per finished shard, and the summary.

Layout::

    DIR/manifest.json          model (ModelSpec.to_dict()), source identity, settings, finished shards
    DIR/shards/shard-00000.parquet   one shard's partial sums (:meth:`Partial.to_table`)
    DIR/summary.parquet        per-layer figures (summary.LAYER_COLUMNS)
    DIR/heads.parquet          per-head figures (summary.HEAD_COLUMNS), with --heads

Every file is written to a temporary name in DIR and renamed into place, so a killed run leaves either
a whole file or none. The manifest lists a shard only after its file is in place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.summary import HEAD_COLUMNS, LAYER_COLUMNS, CorpusStats
from anatomy_cli.errors import AnatomyError, UsageError

VERSION = 1
# Fields of the model spec that change the figures (placement options do not).
MODEL_KEYS = ("model", "dtype", "init", "trust_remote_code")


def _atomic(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class Store:
    """An output directory. :meth:`open` checks an existing manifest against this run."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.manifest: dict[str, Any] = {}

    @property
    def done(self) -> dict[int, dict[str, Any]]:
        return {s["index"]: s for s in self.manifest.get("shards", [])}

    def open(self, model: dict[str, Any], source: dict[str, Any], settings: dict[str, Any], *,
             overwrite: bool) -> None:
        """Create DIR or resume it. Raises UsageError when DIR holds a run of another model, source or settings
        (unless ``overwrite``: its shards are then removed) or is a file; AnatomyError when it cannot be written."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"--out '{self.root}' is a file, not a directory")
        path = self.root / "manifest.json"
        fresh = {"version": VERSION, "model": model, "source": source, "settings": settings, "shards": []}
        if path.exists() and not overwrite:
            try:
                old = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise UsageError(f"{path} cannot be read ({exc}); use --overwrite to start again") from None
            why = _difference(old, fresh)
            if why:
                raise UsageError(f"--out '{self.root}' holds another run ({why}); use --overwrite to replace it, "
                                 "or another directory")
            fresh["shards"] = [s for s in old.get("shards", []) if (self.root / s["file"]).exists()]
            fresh["source"]["mtime"] = source["mtime"]
        elif self.root.exists() and not path.exists() and any(self.root.iterdir()) and not overwrite:
            raise UsageError(f"--out '{self.root}' is not empty and holds no anatomy corpus run; "
                             "use --overwrite or another directory")
        try:
            (self.root / "shards").mkdir(parents=True, exist_ok=True)
            if overwrite:
                for f in (self.root / "shards").glob("shard-*.parquet"):
                    f.unlink()
        except OSError as exc:
            raise AnatomyError(f"cannot write --out '{self.root}': {exc.strerror or exc}") from None
        self.manifest = fresh
        self._write_manifest()

    def load(self, index: int) -> Partial:
        import pyarrow.parquet as pq

        return Partial.from_table(pq.read_table(self.root / self.done[index]["file"]))

    def save(self, index: int, part: Partial) -> None:
        """Write shard ``index``'s file, then list it in the manifest."""
        import pyarrow.parquet as pq

        name = f"shards/shard-{index:05d}.parquet"
        _atomic(self.root / name, lambda tmp: pq.write_table(part.to_table(), tmp))
        shards = [s for s in self.manifest["shards"] if s["index"] != index]
        shards.append({"index": index, "file": name, "windows": part.windows, "tokens": part.tokens})
        self.manifest["shards"] = sorted(shards, key=lambda s: s["index"])
        self._write_manifest()

    def finish(self, stats: CorpusStats, total_shards: int) -> None:
        """Write summary.parquet (and heads.parquet) and mark the run complete in the manifest."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        layers = pa.table({c: [r[c] for r in stats.layers] for c in LAYER_COLUMNS})
        _atomic(self.root / "summary.parquet", lambda tmp: pq.write_table(layers, tmp))
        if stats.heads:
            heads = pa.table({c: [r[c] for r in stats.heads] for c in HEAD_COLUMNS})
            _atomic(self.root / "heads.parquet", lambda tmp: pq.write_table(heads, tmp))
        self.manifest["complete"] = {"shards": total_shards, "windows": stats.windows, "tokens": stats.tokens}
        self._write_manifest()

    def _write_manifest(self) -> None:
        text = json.dumps(self.manifest, indent=1, sort_keys=True) + "\n"
        _atomic(self.root / "manifest.json", lambda tmp: Path(tmp).write_text(text))


def _difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What differs between two manifests' model, source or settings, in words; None if they agree."""
    if old.get("version") != VERSION:
        return f"manifest version {old.get('version')}"
    for key in MODEL_KEYS:
        if old.get("model", {}).get(key) != new["model"].get(key):
            return f"model {key} {old.get('model', {}).get(key)!r}, now {new['model'].get(key)!r}"
    for key in ("path", "kind", "column", "files", "size", "digest"):
        if old.get("source", {}).get(key) != new["source"].get(key):
            return f"the source changed: {key} {old.get('source', {}).get(key)!r}, now {new['source'].get(key)!r}"
    for key in sorted(set(old.get("settings", {})) | set(new["settings"])):
        if old.get("settings", {}).get(key) != new["settings"].get(key):
            return f"--{key.replace('_', '-')} {old.get('settings', {}).get(key)!r}, now {new['settings'].get(key)!r}"
    return None
