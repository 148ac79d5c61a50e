"""What models are on this machine: the Hugging Face cache, Ollama, LM Studio, and GGUF files or
``save_pretrained`` directories under given folders. No torch, no transformers: every figure comes from a
file's header (:mod:`anatomy_cli.models.headers`).

Each :class:`ModelEntry` carries the ``--model`` spec that loads it (``ollama:gemma3:270m``, a Hub id, a
path), its format, size on disk, architecture and parameter count. The count is the tensors stored in the
file (a tied embedding once, as ``anatomy params`` counts it); a file that cannot be read is listed with
a note rather than failing the listing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import local
from anatomy_cli.models import packaged
from anatomy_cli.models.headers import is_gguf
from anatomy_cli.models.headers import read_gguf
from anatomy_cli.models.headers import read_safetensors
from anatomy_cli.models.headers import safetensors_files


@dataclass(frozen=True)
class ModelEntry:
    """One model: ``name`` is the ``--model`` spec; ``source`` ``hf-cache`` | ``ollama`` | ``lmstudio`` |
    ``package`` | ``dir``;
    ``format`` ``gguf`` | ``safetensors`` | ``config only``; ``size_bytes`` on disk; ``parameters`` stored
    (None: unknown); ``quantization``: a GGUF file's main tensor type; ``note``: why a figure is missing."""

    source: str
    name: str
    format: str
    architecture: str | None
    parameters: int | None
    quantization: str | None
    size_bytes: int
    path: str
    note: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Inventory:
    """Every model found, in the order: HF cache, Ollama, LM Studio, Python packages, the given folders."""

    models: tuple[ModelEntry, ...]
    searched: tuple[str, ...]  # what was looked at, e.g. "ollama: /home/me/.ollama/models"

    def to_dict(self) -> dict[str, Any]:
        return {"models": [m.to_dict() for m in self.models], "searched": list(self.searched)}


def gguf_entry(source: str, name: str, path: Path) -> ModelEntry:
    """An entry for a GGUF file, from its header."""
    try:
        header = read_gguf(path)
    except AnatomyError as exc:
        return ModelEntry(source, name, "gguf", None, None, None, _size(path), str(path), str(exc))
    return ModelEntry(source, name, "gguf", header.architecture or None, sum(t.n_params for t in header.tensors),
                      header.quantization or None, header.file_size, str(path))


def checkpoint_entry(source: str, name: str, folder: Path, size: int | None = None) -> ModelEntry:
    """An entry for a ``save_pretrained`` folder: config.json's architecture, the safetensors headers' count."""
    arch, params, fmt, note = None, None, "config only", None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        arch = (config.get("architectures") or [None])[0] or config.get("model_type")
    except (OSError, ValueError, AttributeError):
        note = "config.json unreadable"
    try:
        files = safetensors_files(folder)
        if files:
            fmt, params = "safetensors", sum(t.n_params for f in files for t in read_safetensors(f))
        elif any((folder / n).is_file() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
            fmt = "pytorch"
    except AnatomyError as exc:
        note = str(exc)
    total = size if size is not None else sum(_size(p) for p in folder.iterdir() if p.is_file())
    return ModelEntry(source, name, fmt, arch, params, None, total, str(folder), note)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def hf_cache() -> tuple[list[ModelEntry], str]:
    """Models in the Hugging Face cache (``huggingface_hub.scan_cache_dir``): one entry per repository
    (its newest snapshot's config and safetensors, or its GGUF files)."""
    from huggingface_hub import constants
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    where = f"hf-cache: {constants.HF_HUB_CACHE}"
    try:
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return [], where
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        snapshot = max(repo.revisions, key=lambda r: r.last_modified).snapshot_path
        ggufs = sorted(p for p in snapshot.rglob("*.gguf") if is_gguf(p))
        if (snapshot / "config.json").is_file():
            out.append(checkpoint_entry("hf-cache", repo.repo_id, snapshot, repo.size_on_disk))
        out += [gguf_entry("hf-cache", str(p.resolve()), p.resolve()) for p in ggufs]
    return out, where


def ollama() -> tuple[list[ModelEntry], str]:
    """Ollama's models (its manifests), named ``ollama:NAME:TAG``."""
    out = []
    for name, manifest in local.list_ollama():
        blob = local.ollama_model_file(manifest)
        if blob is None:
            out.append(ModelEntry("ollama", f"ollama:{name}", "gguf", None, None, None, 0, str(manifest),
                                  "manifest unreadable or its model blob is missing"))
        else:
            out.append(gguf_entry("ollama", f"ollama:{name}", blob))
    return out, f"ollama: {local.ollama_root()}"


def lmstudio() -> tuple[list[ModelEntry], str]:
    """LM Studio's model files, named ``lmstudio:PUBLISHER/REPO`` (with the file when the folder has several)."""
    found = local.list_lmstudio()
    per_folder: dict[Path, int] = {}
    for _, path in found:
        per_folder[path.parent] = per_folder.get(path.parent, 0) + 1
    out = []
    for name, path in found:
        spec = name if per_folder[path.parent] > 1 else name.rsplit("/", 1)[0]
        out.append(gguf_entry("lmstudio", f"lmstudio:{spec}", path))
    return out, f"lmstudio: {local.lmstudio_root()}"


def packages() -> tuple[list[ModelEntry], str]:
    """GGUF files installed Python packages carry (:mod:`anatomy_cli.models.packaged`), by their short name."""
    out = []
    for p in packaged.packaged():
        if p.path is None:
            entry = packaged.ASSEMBLED[p.name]
            out.append(ModelEntry("package", p.name, "gguf", None, None, None, 0, "", f"{p.package} is installed; "
                                  f"assemble its file: python -c 'import {entry.module} as m; m.assemble()'"))
        else:
            out.append(gguf_entry("package", p.name, p.path))
    assembled = ", ".join(a.distribution for a in packaged.ASSEMBLED.values())
    return out, f"packages: llm plugins with a .gguf file, {assembled}"


def folder(directory: str) -> list[ModelEntry]:
    """GGUF files and ``save_pretrained`` directories under ``directory`` (recursively), named by path.

    Raises UsageError when ``directory`` is not a directory.
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise UsageError(f"{directory} is not a directory: give folders to search for models")
    out = []
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() == ".gguf" and path.is_file() and is_gguf(path):
            out.append(gguf_entry("dir", str(path), path))
        elif path.is_dir() and (path / "config.json").is_file():
            out.append(checkpoint_entry("dir", str(path), path))
    if (root / "config.json").is_file():
        out.insert(0, checkpoint_entry("dir", str(root), root))
    return out


def inventory(directories: Sequence[str] = (), *, hf: bool = True) -> Inventory:
    """Everything :mod:`this module <anatomy_cli.analyses.inventory>` finds: the HF cache (unless ``hf`` is
    False), Ollama, LM Studio, Python packages' files, then each of ``directories``. Raises UsageError for a
    directory that is not one."""
    for d in directories:  # bad input fails before anything is scanned
        if not Path(d).expanduser().is_dir():
            raise UsageError(f"{d} is not a directory: give folders to search for models")
    models: list[ModelEntry] = []
    searched: list[str] = []
    for scan in ((hf_cache,) if hf else ()) + (ollama, lmstudio, packages):
        found, where = scan()
        models += found
        searched.append(where)
    for d in directories:
        models += folder(d)
        searched.append(f"dir: {d}")
    return Inventory(tuple(models), tuple(searched))
