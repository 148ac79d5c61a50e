"""Feature labels offline: Neuronpedia's exported explanations, and the Neuronpedia page of a feature.

Neuronpedia's exports (``neuronpedia-datasets``: ``v1/<model>/<sae>/explanations/batch-N.jsonl.gz``) hold one
JSON object per line: ``modelId``, ``layer`` (the SAE's id within the model, ``6-res-jb``), ``index`` (the
feature, as a string), ``description``, ``explanationModelName``, ... :func:`read_labels` reads a folder of
them (recursively; ``.jsonl.gz`` and ``.jsonl``) or one file, and keeps the first description of each index;
with a ``neuronpedia_id`` (``gpt2-small/6-res-jb``), records naming another model or SAE are left out.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError

NEURONPEDIA = "https://www.neuronpedia.org"


def read_labels(path: str | Path, neuronpedia_id: str | None = None) -> dict[int, str]:
    """``{feature index: description}`` from a Neuronpedia explanations export (see the module docstring).
    Raises UsageError for a path with no export file, CheckpointError for an unreadable one."""
    p = Path(path)
    if p.is_dir():
        files = sorted([*p.rglob("*.jsonl.gz"), *p.rglob("*.jsonl")])
    elif p.is_file():
        files = [p]
    else:
        raise UsageError(f"--labels {p}: no such file or folder")
    if not files:
        raise UsageError(f"--labels {p}: no .jsonl.gz or .jsonl explanations in it")
    model, _, sae = (neuronpedia_id or "").partition("/")
    labels: dict[int, str] = {}
    for file in files:
        for rec in _records(file):
            if model and rec.get("modelId") not in (None, model) or sae and rec.get("layer") not in (None, sae):
                continue
            try:
                index = int(str(rec["index"]))
            except (KeyError, ValueError):
                continue
            desc = rec.get("description")
            if isinstance(desc, str) and index not in labels:
                labels[index] = desc.strip()
    return labels


def _records(file: Path) -> list[dict[str, object]]:
    try:
        raw = gzip.decompress(file.read_bytes()) if file.name.endswith(".gz") else file.read_bytes()
        lines = raw.decode("utf-8").splitlines()
        out = [json.loads(line) for line in lines if line.strip()]
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"--labels {file} cannot be read ({type(e).__name__}: {e})") from None
    return [r for r in out if isinstance(r, dict)]


def feature_url(neuronpedia_id: str | None, feature: int) -> str | None:
    """The feature's Neuronpedia page (``https://www.neuronpedia.org/gpt2-small/6-res-jb/123``), or None."""
    return f"{NEURONPEDIA}/{neuronpedia_id}/{feature}" if neuronpedia_id else None
