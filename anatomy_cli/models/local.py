"""Models other tools keep on this machine, by name: Ollama's manifests and LM Studio's model folder.

No torch, no transformers. Both hold GGUF files:

* ``ollama:NAME[:TAG]``: ``$OLLAMA_MODELS`` (else ``~/.ollama/models``) ``/manifests/registry.ollama.ai/
  library/NAME/TAG`` (default tag ``latest``; ``USER/NAME`` replaces ``library/NAME``, and a name whose first
  part has a dot, ``hf.co/USER/REPO``, names its registry host). The manifest is JSON; its layer with media
  type ``application/vnd.ollama.image.model`` is the GGUF file, stored as ``blobs/sha256-<hex>``.
* ``lmstudio:PUBLISHER/REPO[/FILE.gguf]``: ``$LMSTUDIO_MODELS`` (else ``~/.lmstudio/models``)
  ``/PUBLISHER/REPO/*.gguf``; a folder with several model files needs the file named. Vision projectors
  (``mmproj-*.gguf``) are not models.

Errors are one line: ModelNotFound (no such directory or model), CheckpointError (a manifest that is not
JSON or names no model layer, a missing blob), UsageError (an LM Studio folder with several files).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import UsageError

PREFIXES = ("ollama:", "lmstudio:")
OLLAMA_HOST = "registry.ollama.ai"
OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"


def ollama_root() -> Path:
    """Where Ollama keeps its models: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def lmstudio_root() -> Path:
    """Where LM Studio keeps its models: ``$LMSTUDIO_MODELS``, else ``~/.lmstudio/models``."""
    return Path(os.environ.get("LMSTUDIO_MODELS") or Path.home() / ".lmstudio" / "models").expanduser()


def is_named(spec: str) -> bool:
    """True for ``ollama:...`` and ``lmstudio:...`` specs."""
    return str(spec).startswith(PREFIXES)


def resolve(spec: str) -> Path:
    """The GGUF file an ``ollama:`` or ``lmstudio:`` spec names (see the module docstring)."""
    kind, _, name = spec.partition(":")
    if not name.strip():
        raise ModelNotFound(f"{spec}: give a model name, e.g. ollama:gemma3:270m or lmstudio:PUBLISHER/REPO")
    return ollama_blob(name) if kind == "ollama" else lmstudio_file(name)


def _ollama_manifest(name: str) -> tuple[Path, str]:
    """``(manifest path, NAME:TAG)`` for an Ollama name."""
    base, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    parts = [p for p in base.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts) or not tag or "/" in tag:
        raise ModelNotFound(f"ollama:{name} is not an Ollama model name (NAME[:TAG], e.g. gemma3:270m)")
    host = parts.pop(0) if len(parts) > 1 and "." in parts[0] else OLLAMA_HOST
    if len(parts) == 1:
        parts.insert(0, "library")
    return ollama_root() / "manifests" / host / Path(*parts) / tag, f"{base}:{tag}"


def ollama_blob(name: str) -> Path:
    """The GGUF blob of Ollama model ``name`` (``NAME[:TAG]``)."""
    root = ollama_root()
    if not (root / "manifests").is_dir():
        raise ModelNotFound(f"ollama:{name}: no Ollama models directory at {root} (set OLLAMA_MODELS to it)")
    manifest, full = _ollama_manifest(name)
    if not manifest.is_file():
        have = [n for n, _ in list_ollama()]
        hint = f"; it has {', '.join(have[:8])}" + (" ..." if len(have) > 8 else "") if have else "; it has none"
        raise ModelNotFound(f"ollama:{name}: no such model in {root} (looked for {full}){hint}")
    return _model_layer(manifest, f"ollama:{name}")


def _model_layer(manifest: Path, what: str) -> Path:
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digests = [layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_MEDIA]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{what}: its manifest {manifest} is unreadable (not Ollama's JSON with layers)") \
            from None
    if not digests:
        raise CheckpointError(f"{what}: its manifest {manifest} has no model layer ({OLLAMA_MODEL_MEDIA})")
    digest = str(digests[0])
    if not re.fullmatch(r"sha256:[0-9a-fA-F]+", digest):
        raise CheckpointError(f"{what}: its manifest {manifest} names the model layer {digest!r}, not a sha256 digest")
    blob = ollama_root() / "blobs" / digest.replace(":", "-", 1)
    if not blob.is_file():
        raise CheckpointError(f"{what}: its model blob {blob} is missing (ollama pull it again)")
    return blob


def list_ollama() -> list[tuple[str, Path]]:
    """Every Ollama model on this machine as ``(NAME:TAG, manifest path)``, sorted by name; the default
    registry's ``library/`` is left out of names, as ``ollama list`` does."""
    base = ollama_root() / "manifests"
    if not base.is_dir():
        return []
    found = []
    for manifest in base.glob("*/*/*/*"):
        if manifest.is_file():
            host, namespace, model, tag = manifest.relative_to(base).parts
            name = f"{model}:{tag}" if (host, namespace) == (OLLAMA_HOST, "library") else \
                (f"{namespace}/{model}:{tag}" if host == OLLAMA_HOST else f"{host}/{namespace}/{model}:{tag}")
            found.append((name, manifest))
    return sorted(found)


def ollama_model_file(manifest: Path) -> Path | None:
    """The GGUF blob a manifest names, or None when it is unreadable or missing."""
    try:
        return _model_layer(manifest, str(manifest))
    except CheckpointError:
        return None


def _model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.gguf") if p.is_file() and not p.name.lower().startswith("mmproj"))


def lmstudio_file(name: str) -> Path:
    """The GGUF file of LM Studio model ``PUBLISHER/REPO`` (or ``PUBLISHER/REPO/FILE.gguf``)."""
    root = lmstudio_root()
    parts = [p for p in name.split("/") if p]
    if len(parts) not in (2, 3) or any(p in (".", "..") for p in parts):
        raise ModelNotFound(f"lmstudio:{name} is not an LM Studio model name (PUBLISHER/REPO[/FILE.gguf])")
    if not root.is_dir():
        raise ModelNotFound(f"lmstudio:{name}: no LM Studio models directory at {root} (set LMSTUDIO_MODELS to it)")
    folder = root / parts[0] / parts[1]
    if not folder.is_dir():
        raise ModelNotFound(f"lmstudio:{name}: no such model folder {folder}")
    if len(parts) == 3:
        path = folder / parts[2]
        if not path.is_file():
            raise ModelNotFound(f"lmstudio:{name}: no such file {path}")
        return path
    files = _model_files(folder)
    if not files:
        raise ModelNotFound(f"lmstudio:{name}: {folder} holds no .gguf file")
    if len(files) > 1:
        raise UsageError(f"lmstudio:{name} holds {len(files)} GGUF files ({', '.join(f.name for f in files)}): "
                         f"name one, e.g. lmstudio:{parts[0]}/{parts[1]}/{files[0].name}")
    return files[0]


def list_lmstudio() -> list[tuple[str, Path]]:
    """Every LM Studio model file as ``(PUBLISHER/REPO/FILE.gguf, path)``, sorted."""
    root = lmstudio_root()
    if not root.is_dir():
        return []
    return sorted((f"{p.parent.parent.name}/{p.parent.name}/{p.name}", p)
                  for folder in root.glob("*/*") if folder.is_dir() for p in _model_files(folder))
