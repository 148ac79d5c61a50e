"""Where a corpus comes from: documents read one at a time, and the source's identity.

A SOURCE is a text file (one document), a directory of ``.txt``/``.md`` files (one document each,
sorted by path), ``-`` (stdin, one document; spooled to a temporary file first so that it can be
hashed and read in constant memory), a ``.jsonl``/``.csv``/``.parquet`` file (one document per
row, the ``column`` field), or a directory written by ``datasets``' ``save_to_disk`` (read with
``datasets``, when installed). Documents are yielded lazily: memory does not grow with the corpus.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import BinaryIO

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

TEXT_SUFFIXES = (".txt", ".md")
TABLE_SUFFIXES = (".jsonl", ".csv", ".parquet")


@dataclass(frozen=True)
class Source:
    """A resolved SOURCE: ``kind`` is text|dir|jsonl|csv|parquet|datasets; ``files`` the files read, in order."""

    path: Path
    kind: str
    files: tuple[Path, ...]
    column: str = "text"
    label: str = ""

    def identity(self) -> dict[str, Any]:
        """``{"path", "resolved", "kind", "column", "files", "size", "mtime", "digest"}``: ``path`` as given,
        ``resolved`` the absolute path with links resolved (``-`` for stdin: a run is the same run whatever
        spelling of the path names it), size in bytes (all files), the latest mtime, and the SHA-256 of every
        file's relative name and bytes, in order."""
        digest = hashlib.sha256()
        size, mtime = 0, 0.0
        for f in self.files:
            st = f.stat()
            size += st.st_size
            mtime = max(mtime, st.st_mtime)
            digest.update(str(f.relative_to(self.path) if self.path.is_dir() else f.name).encode() + b"\0")
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        return {"path": self.label or str(self.path), "resolved": self.label or str(self.path.resolve()),
                "kind": self.kind, "column": self.column,
                "files": len(self.files), "size": size, "mtime": mtime, "digest": digest.hexdigest()}

    def pieces(self) -> Iterator[tuple[str, bool]]:
        """``(text, ends_document)`` in order: each document, a text file in pieces of about 1 MB cut after a
        newline (constant memory for a large file). Raises UsageError for invalid UTF-8 or a missing column."""
        if self.kind in ("text", "dir"):
            for f in self.files:
                yield from _text_pieces(f)
        else:
            for doc in self.documents():
                yield doc, True

    def check_text(self) -> None:
        """Refuse, before any model loads, a source that is not UTF-8 (the line :meth:`pieces` names) or holds
        no text (UsageError): a text source is read through once (as :meth:`identity` reads it), a table up to
        its first document."""
        found = False
        for text, _ in self.pieces():
            found = found or bool(text.strip())
            if found and self.kind not in ("text", "dir"):
                return
        if not found:
            raise UsageError(f"the corpus {self.label or self.path} has no text: nothing to read (it needs at "
                             "least 2 tokens)")

    def documents(self) -> Iterator[str]:
        """The documents of a table source (one per row), empty ones skipped."""
        if self.kind == "jsonl":
            yield from _jsonl(self.files[0], self.column)
        elif self.kind == "csv":
            yield from _csv(self.files[0], self.column)
        elif self.kind == "parquet":
            yield from _parquet(self.files, self.column)
        else:
            yield from _datasets(self.path, self.column)


def open_source(source: str, *, column: str = "text", stdin: BinaryIO | None = None,
                spool_dir: str | None = None) -> Source:
    """Resolve SOURCE (see the module docstring). ``-`` copies stdin to a file in ``spool_dir`` (default: the
    system's temporary directory; the caller removes it). Raises UsageError for a missing path, an empty
    directory or an unknown suffix, AnatomyError when ``datasets`` is needed and not installed."""
    if source == "-":
        fd, name = tempfile.mkstemp(prefix="anatomy-corpus-stdin-", suffix=".txt", dir=spool_dir)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(stdin or sys.stdin.buffer, out, 1 << 20)
        return Source(Path(name), "text", (Path(name),), column, label="-")
    path = Path(source)
    if not path.exists():
        raise UsageError(f"corpus source '{source}' does not exist")
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists() \
                or (path / "dataset_dict.json").exists():
            files = tuple(sorted(p for p in path.rglob("*") if p.is_file()))
            return Source(path, "datasets", files, column)
        files = tuple(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES))
        if not files:
            raise UsageError(f"corpus directory '{source}' has no .txt or .md files")
        return Source(path, "dir", files, column)
    suffix = path.suffix.lower()
    if suffix in TABLE_SUFFIXES:
        return Source(path, suffix[1:], (path,), column)
    return Source(path, "text", (path,), column)


PIECE_BYTES = 1 << 20


def _text_pieces(path: Path) -> Iterator[tuple[str, bool]]:
    chunk: list[bytes] = []
    size, line_no, pending = 0, 0, None
    with path.open("rb") as fh:
        for line in fh:
            line_no += 1
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path} is not valid UTF-8 (line {line_no}, byte {exc.start + 1})") from None
            chunk.append(line)
            size += len(line)
            if size >= PIECE_BYTES:
                if pending is not None:
                    yield pending, False
                pending, chunk, size = b"".join(chunk).decode("utf-8"), [], 0
    rest = b"".join(chunk).decode("utf-8")
    if pending is not None:
        if rest.strip():
            yield pending, False
            yield rest, True
        else:
            yield pending + rest, True
    elif rest.strip():
        yield rest, True


def _field(row: dict[str, object], column: str, where: str) -> str | None:
    if column not in row:
        have = ", ".join(map(str, list(row)[:8]))
        raise UsageError(f"{where} has no column '{column}' (it has: {have}); choose one with --column")
    value = row[column]
    return value if isinstance(value, str) and value.strip() else None


def _jsonl(path: Path, column: str) -> Iterator[str]:
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(f"{path} line {number} is not JSON: {str(exc).splitlines()[0]}") from None
            if not isinstance(row, dict):
                raise UsageError(f"{path} line {number} is not a JSON object")
            text = _field(row, column, f"{path} line {number}")
            if text is not None:
                yield text


def _csv(path: Path, column: str) -> Iterator[str]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                text = _field(row, column, f"{path}")
                if text is not None:
                    yield text
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not valid UTF-8 (byte {exc.start + 1})") from None


def _parquet(files: tuple[Path, ...], column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    for path in files:
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a non-Parquet file
            raise UsageError(f"{path} is not a Parquet file: {str(exc).splitlines()[0]}") from None
        names = pf.schema_arrow.names
        if column not in names:
            raise UsageError(f"{path} has no column '{column}' (it has: {', '.join(names[:8])}); "
                             "choose one with --column")
        for batch in pf.iter_batches(columns=[column], batch_size=256):
            for value in batch.column(0).to_pylist():
                if isinstance(value, str) and value.strip():
                    yield value


def _datasets(path: Path, column: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise AnatomyError(f"'{path}' was written by datasets' save_to_disk; reading it needs the datasets package "
                           "(pip install datasets)") from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[next(iter(ds))]
    if column not in ds.column_names:
        raise UsageError(f"{path} has no column '{column}' (it has: {', '.join(ds.column_names[:8])}); "
                         "choose one with --column")
    for row in ds:
        value = row[column]
        if isinstance(value, str) and value.strip():
            yield value


def describe(identity: dict[str, object]) -> str:
    """``docs (dir, 12 files, 180.2 kB)`` for headings."""
    return f"{identity['path']} ({identity['kind']}, {identity['files']} file{'s' * (identity['files'] != 1)})"

