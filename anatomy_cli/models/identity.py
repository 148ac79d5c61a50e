"""The identity of a model's files and of a tokenizer: what a cache or a resumable run is keyed by.

One rule for every layer above (``serve``'s cache, ``corpus --out``'s manifest): a model is the files it
is read from, each named by (absolute path, size, mtime_ns, inode) (:func:`file_identity`). A manifest
that outlives the process adds the SHA-256 of each file where that is cheap (:func:`file_records`,
files up to :data:`DIGEST_BYTES`), so a file touched but not changed still matches
(:func:`files_changed`). A tokenizer is the digest of its own serialised form (:func:`tokenizer_digest`),
whatever file it came from (a GGUF's vocabulary, a preset's bundled BPE files).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import TypedDict

from anatomy_cli.errors import AnatomyError
from anatomy_cli.models import local
from anatomy_cli.models import presets
from anatomy_cli.models.resolve import check_path

if TYPE_CHECKING:
    from collections.abc import Sequence


FileId = tuple[str, int, int, int]  # (absolute path, size, mtime_ns, inode)
DIGEST_BYTES = 64 << 20  # files up to this size are hashed in file_records


def file_identity(model: str) -> tuple[FileId, ...]:
    """The identity of the files ``model`` is read from; ``()`` for a preset or an id not cached locally.

    A file (GGUF): that file. A directory: every regular file in it (symlinks followed, hidden files and
    subdirectories skipped). A Hugging Face id: the files of its cached snapshot.
    """
    path = named_file(model) or Path(model).expanduser()
    if not path.exists():
        found = _hub_snapshot(model)
        if found is None:
            return ()
        path = found
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if not p.name.startswith("."))
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:  # vanished while listed, or a dangling link: its absence is the identity
            continue
        if f.is_file():
            out.append((str(f.resolve()), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class FileRecord(TypedDict):
    """One file of :func:`file_records`."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    sha256: str | None


def file_records(model: str) -> list[FileRecord]:
    """:func:`file_identity` as JSON records ``{"path", "size", "mtime_ns", "inode", "sha256"}``;
    ``sha256`` is None for a file over :data:`DIGEST_BYTES` (its size, mtime and inode identify it)."""
    out: list[FileRecord] = []
    for path, size, mtime_ns, inode in file_identity(model):
        digest = file_sha256(path) if size <= DIGEST_BYTES else None
        out.append({"path": path, "size": size, "mtime_ns": mtime_ns, "inode": inode, "sha256": digest})
    return out


def files_changed(old: Sequence[FileRecord], new: Sequence[FileRecord]) -> list[str]:
    """Names of the files that differ between two :func:`file_records` lists: added, removed, another size,
    another digest, or (where either has no digest) another mtime or inode."""
    before = {r["path"]: r for r in old}
    after = {r["path"]: r for r in new}
    changed = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a is None or b is None or a["size"] != b["size"]:
            changed.append(Path(path).name)
        elif a.get("sha256") and b.get("sha256"):
            if a["sha256"] != b["sha256"]:
                changed.append(Path(path).name)
        elif (a["mtime_ns"], a["inode"]) != (b["mtime_ns"], b["inode"]):
            changed.append(Path(path).name)
    return changed


def tokenizer_digest(hf: Any) -> str:
    """SHA-256 of a transformers tokenizer's content: a fast tokenizer's ``tokenizer.json`` form, else its
    vocabulary; with the special tokens and whether BOS/EOS are added."""
    h = hashlib.sha256()
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(hf.get_vocab().items())).encode())
    extra = {"special": {k: str(v) for k, v in sorted(getattr(hf, "special_tokens_map", {}).items())},
             "bos": getattr(hf, "add_bos_token", None), "eos": getattr(hf, "add_eos_token", None)}
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()


def named_file(model: str) -> Path | None:
    """The GGUF file an ``ollama:``/``lmstudio:`` name points to now; None for other specs or a name that
    no longer resolves (the command itself then says why)."""
    if not local.is_named(model):
        return None
    try:
        found = check_path(model)
    except AnatomyError:
        return None
    return Path(found.ref) if found is not None else None


def _hub_snapshot(model: str) -> Path | None:
    if model.count("/") > 1 or not model.strip():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        for repo in (presets.HUB_IDS.get(model, model), model):
            found = try_to_load_from_cache(repo, "config.json")
            if isinstance(found, str):
                return Path(found).parent
    except Exception:  # an id the Hub library rejects: nothing cached under it
        return None
    return None
