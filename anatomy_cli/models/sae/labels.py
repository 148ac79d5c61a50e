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
import re
import zlib
from pathlib import Path

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError

NEURONPEDIA = "https://www.neuronpedia.org"


def read_labels(path: str | Path, neuronpedia_id: str | None = None) -> dict[int, str]:
    """``{feature index: description}`` from a Neuronpedia explanations export (see the module docstring).
    Raises UsageError for a path with no export file, CheckpointError for an unreadable one."""
    p = Path(path)
    files = _files(p, ("*.jsonl.gz", "*.jsonl"))
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


def _files(p: Path, patterns: tuple[str, ...]) -> list[Path]:
    """``p`` itself, or the files under the folder ``p`` matching ``patterns``; UsageError when there are none."""
    if p.is_dir():
        files = sorted(f for pattern in patterns for f in p.rglob(pattern))
    elif p.is_file():
        files = [p]
    else:
        raise UsageError(f"--labels {p}: no such file or folder")
    if not files:
        raise UsageError(f"--labels {p}: no {', '.join(x.lstrip('*') for x in patterns)} explanations in it")
    return files


def _records(file: Path) -> list[dict[str, object]]:
    """The file's records: JSON lines (``.jsonl``, ``.jsonl.gz``), or one JSON array (``.json``, a saved export)."""
    try:
        raw = gzip.decompress(file.read_bytes()) if file.name.endswith(".gz") else file.read_bytes()
        text = raw.decode("utf-8")
        if file.suffix == ".json":
            out = json.loads(text)
            if not isinstance(out, list):
                raise CheckpointError(f"--labels {file} is not a Neuronpedia explanations export (a JSON list of "
                                      f"records with layer, index and description; this is a {type(out).__name__})")
        else:
            out = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"--labels {file} cannot be read ({type(e).__name__}: {e})") from None
    return [r for r in out if isinstance(r, dict)]


def read_layer_labels(path: str | Path, n_layers: int) -> dict[tuple[int, int], str]:
    """``{(block, feature index): description}`` for a graph over ``n_layers`` blocks, from one export file
    (``.json`` list, ``.jsonl``, ``.jsonl.gz``) or a folder of them (recursively). A record's block is the number
    its ``layer`` starts with (``"12-clt-hp"``: 12); a record without one takes the number in its file's name
    (``layer_12.json``). The first description of each (block, index) is kept; blocks past ``n_layers`` are left
    out. Raises UsageError for a path with no export file or no record naming a feature, CheckpointError for an
    unreadable one."""
    p = Path(path)
    files = _files(p, ("*.jsonl.gz", "*.jsonl", "*.json"))
    out: dict[tuple[int, int], str] = {}
    named = 0
    for file in files:
        number = re.search(r"(\d+)", file.name)
        for rec in _records(file):
            layer = re.match(r"(\d+)", str(rec.get("layer", "")))
            block = int(layer.group(1)) if layer else int(number.group(1)) if number else None
            try:
                index = int(str(rec["index"]))
            except (KeyError, ValueError):
                continue
            named += 1
            desc = rec.get("description")
            if block is not None and block < n_layers and isinstance(desc, str):
                out.setdefault((block, index), desc.strip())
    if not named:
        raise UsageError(f"--labels {p}: no record names a feature (Neuronpedia's export: one record per "
                         f"feature with layer, index and description)")
    return out


def feature_url(neuronpedia_id: str | None, feature: int) -> str | None:
    """The feature's Neuronpedia page (``https://www.neuronpedia.org/gpt2-small/6-res-jb/123``), or None."""
    return f"{NEURONPEDIA}/{neuronpedia_id}/{feature}" if neuronpedia_id else None
