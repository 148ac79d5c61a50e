"""``--out DIR``: a manifest, one Parquet file of partial sums per finished shard, and the summary.

Layout::

    DIR/manifest.json          model (ModelSpec.to_dict(), its files' identity, the tokenizer's digest),
                               source identity, settings, finished shards (rows, SHA-256 of the file)
    DIR/shards/shard-00000.parquet   one shard's partial sums (:meth:`Partial.to_table`)
    DIR/summary.parquet        per-layer figures: ``row`` (int64, 0..L: 0 the embedding, N + 1 block N's output),
                               then summary.LAYER_COLUMNS with ``layer`` the row's name as a string
                               ("embed", "0", …, "L-1"; :func:`summary_rows`)
    DIR/heads.parquet          per-head figures (summary.HEAD_COLUMNS), with --heads
    DIR/lenses.parquet         per lens and residual row: ``lens`` (string: logit, tuned, jacobian), ``row`` (int64),
                               then summary.LENS_COLUMNS (``layer`` a string; a row the lens does not read: nulls)
    DIR/expert_blocks.parquet, DIR/experts.parquet, DIR/expert_pairs.parquet
                               with --experts: per MoE block, per (block, expert), per co-chosen pair
                               (expert_sums.BLOCK_COLUMNS, EXPERT_COLUMNS, PAIR_COLUMNS)

Every file is written to a temporary name in DIR and renamed into place, so a killed run leaves either
a whole file or none. The manifest lists a shard only after its file is in place. A shard read back is
checked against the manifest (its SHA-256 and row count): a damaged or missing one is computed again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.corpus import expert_sums
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.summary import HEAD_COLUMNS
from anatomy_cli.corpus.summary import LAYER_COLUMNS
from anatomy_cli.corpus.summary import LENS_COLUMNS
from anatomy_cli.corpus.summary import CorpusStats
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.identity import file_sha256
from anatomy_cli.models.identity import files_changed
from anatomy_cli.models.sites import residual_row
from anatomy_cli.models.written import as_user_file

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from anatomy_cli.corpus.feature_sums import FeatureSums

VERSION = 2
# Fields of the model spec that change the figures (placement options do not); "resolved" is the model
# path with links resolved (the spec's own spelling may differ between two runs of one model).
MODEL_KEYS = ("resolved", "dtype", "init", "trust_remote_code")
INT_COLUMNS = ("row", "layer", "head", "max_abs_dim", "lens_positions", "ce_positions", *expert_sums.INT_COLUMNS)
EXPERT_FILES = (("expert_blocks", expert_sums.BLOCK_COLUMNS), ("experts", expert_sums.EXPERT_COLUMNS),
                ("expert_pairs", expert_sums.PAIR_COLUMNS))


SUMMARY_COLUMNS = ("row", *LAYER_COLUMNS)
"""summary.parquet's columns: the residual row's index, then the JSON rows' columns."""
LENS_TABLE_COLUMNS = ("lens", "row", *LENS_COLUMNS)
"""lenses.parquet's columns: the lens' kind, the residual row's index, then the JSON ``lenses`` rows' columns."""


def schema(columns: tuple[str, ...]) -> pa.Schema:
    """The Arrow schema of a summary table: int64 for counts and indices, float64 for every figure
    (null where not measured, never a null-typed column); in summary.parquet ``row`` int64 and ``layer`` (the
    row's name, ``embed`` or a block number) a string."""
    import pyarrow as pa

    def kind(c: str) -> pa.DataType:
        return pa.string() if c == "lens" or c == "layer" and "row" in columns else pa.int64() if c in INT_COLUMNS \
            else pa.float64()

    return pa.schema([(c, kind(c)) for c in columns])


def summary_rows(layers: Any) -> list[dict[str, object]]:
    """The JSON rows (``layer``: ``"embed"`` or block N) as summary.parquet's rows: ``row`` 0..L and the
    label as a string."""

    return [{"row": residual_row(r["layer"]), **r, "layer": str(r["layer"])} for r in layers]


def _atomic(path: Path, write: Callable[..., object]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        as_user_file(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class Store:
    """An output directory. :meth:`open` checks an existing manifest against this run. ``part_type``: what a shard's
    file holds (``from_table``; `anatomy features` stores its own)."""

    part_type: type[Partial] | type[FeatureSums] = Partial

    def __init__(self, root: Path):
        self.root = Path(root)
        self.manifest: dict[str, Any] = {}

    @property
    def done(self) -> dict[int, dict[str, Any]]:
        return {s["index"]: s for s in self.manifest.get("shards", [])}

    def open(self, model: Mapping[str, object], source: Mapping[str, object], settings: Mapping[str, object], *,
             overwrite: bool) -> None:
        """Create DIR or resume it. Raises UsageError when DIR holds a run of another model, source or settings
        (unless ``overwrite``: its shards are then removed) or is a file; CheckpointError when its manifest cannot
        be read; AnatomyError when it cannot be written."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"--out '{self.root}' is a file, not a directory")
        path = self.root / "manifest.json"
        fresh: dict[str, Any]
        fresh = {"version": VERSION, "model": model, "source": source, "settings": settings, "shards": []}
        if path.exists() and not overwrite:
            try:
                old = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"{path} cannot be read ({exc}); use --overwrite to start again") from None
            why = _difference(old, fresh)
            if why:
                raise UsageError(f"--out '{self.root}' holds another run ({why}); use --overwrite to replace it, "
                                 "or another directory")
            fresh["shards"] = old.get("shards", [])
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

    def load(self, index: int) -> Any:
        """Shard ``index`` as listed in the manifest, or why it cannot be used (missing, damaged: its SHA-256
        or row count is not the manifest's, or it does not parse); such a shard is dropped from the manifest."""
        import pyarrow.parquet as pq

        entry = self.done[index]
        path = self.root / entry["file"]
        why = None
        if not path.is_file():
            why = "missing"
        elif entry.get("sha256") is None or file_sha256(path) != entry["sha256"]:
            why = "damaged (its checksum is not the manifest's)"
        else:
            try:
                table = pq.read_table(path)
                if table.num_rows != entry.get("rows"):
                    why = f"damaged ({table.num_rows} rows, the manifest says {entry.get('rows')})"
                else:
                    return self.part_type.from_table(table)
            except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a damaged file
                why = f"damaged ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        self.manifest["shards"] = [s for s in self.manifest["shards"] if s["index"] != index]
        self._write_manifest()
        return why

    def save(self, index: int, part: Partial | FeatureSums) -> None:
        """Write shard ``index``'s file, then list it in the manifest with its row count and SHA-256."""
        import pyarrow.parquet as pq

        name = f"shards/shard-{index:05d}.parquet"
        table = part.to_table()
        _atomic(self.root / name, lambda tmp: pq.write_table(table, tmp))
        shards = [s for s in self.manifest["shards"] if s["index"] != index]
        shards.append({"index": index, "file": name, "windows": part.windows, "tokens": part.tokens,
                       "rows": table.num_rows, "sha256": file_sha256(self.root / name)})
        self.manifest["shards"] = sorted(shards, key=lambda s: s["index"])
        self._write_manifest()

    def finish(self, stats: CorpusStats, total_shards: int) -> None:
        """Write summary.parquet (and heads.parquet, the experts' files) and mark the run complete in the manifest."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        layers = pa.Table.from_pylist(summary_rows(stats.layers), schema=schema(SUMMARY_COLUMNS))
        _atomic(self.root / "summary.parquet", lambda tmp: pq.write_table(layers, tmp))
        if stats.heads:
            heads = pa.Table.from_pylist(list(stats.heads), schema=schema(HEAD_COLUMNS))
            _atomic(self.root / "heads.parquet", lambda tmp: pq.write_table(heads, tmp))
        if stats.lenses:
            rows = [{"lens": lens["lens"], **r} for lens in stats.lenses for r in summary_rows(lens["layers"])]
            table = pa.Table.from_pylist(rows, schema=schema(LENS_TABLE_COLUMNS))
            _atomic(self.root / "lenses.parquet", lambda tmp: pq.write_table(table, tmp))
        if stats.expert_blocks:
            for name, columns in EXPERT_FILES:
                table = pa.Table.from_pylist(list(getattr(stats, name)), schema=schema(columns))
                _atomic(self.root / f"{name}.parquet", lambda tmp, t=table: pq.write_table(t, tmp))
        self.mark_complete(total_shards, stats.windows, stats.tokens)

    def mark_complete(self, shards: int, windows: int, tokens: int) -> None:
        """The manifest marks the run complete."""
        self.manifest["complete"] = {"shards": shards, "windows": windows, "tokens": tokens}
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
    changed = files_changed(old.get("model", {}).get("files", []), new["model"].get("files", []))
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return f"the model's files changed: {', '.join(changed[:3])}{more}"
    changed = files_changed(old.get("model", {}).get("lens_files", []), new["model"].get("lens_files", []))
    if changed:
        return f"the lens files changed: {', '.join(changed[:3])}"
    if old.get("model", {}).get("tokenizer") != new["model"].get("tokenizer"):
        return "the model's tokenizer changed"
    for key in ("resolved", "kind", "column", "files", "size", "digest"):
        if old.get("source", {}).get(key) != new["source"].get(key):
            return f"the source changed: {key} {old.get('source', {}).get(key)!r}, now {new['source'].get(key)!r}"
    for key in sorted(set(old.get("settings", {})) | set(new["settings"])):
        if old.get("settings", {}).get(key) != new["settings"].get(key):
            return f"--{key.replace('_', '-')} {old.get('settings', {}).get(key)!r}, now {new['settings'].get(key)!r}"
    return None
