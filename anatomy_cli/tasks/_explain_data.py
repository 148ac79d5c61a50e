"""`explain`'s examples, read from a `features` run: the contexts (contexts.parquet), the statistics
(features.parquet) and where each feature fires (delphi's latent cache, ``features --delphi``).

Per feature: ``train``: its top-activating contexts (ranks 0..--examples−1); ``test``: its contexts sampled from
its activation intervals (``kind`` ``quantile``; without any, the top contexts after the train ones), --test of them
drawn with --seed; ``not_active``: --non-activating contexts drawn with --seed from the other features' contexts
(one per window and start) in whose span the cache records no activation of this feature.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError

Example = tuple[list[str], list[float]]


@dataclass(frozen=True)
class FeatureExamples:
    """One feature's examples: ``train`` (shown to the explainer), ``test`` (held-out activating) and
    ``not_active`` (contexts where the cache records no activation of it)."""

    feature: int
    max_activation: float
    train: tuple[Example, ...]
    test: tuple[Example, ...]
    not_active: tuple[Example, ...]


def making(root: Path) -> str:
    """The command that writes what explain reads into ``root``: the tables (``--out``) and delphi's cache."""
    return f"anatomy features DICT --corpus PATH --out {root} --delphi {Path(root) / 'latents'}"


def not_features(root: Path) -> str:
    """Why ``root``, a folder without a features run's files, is not what explain reads, and the command that makes
    one. ``features --out`` takes a new or empty folder (it refuses one holding other files), so only such a
    ``root`` is offered as ``--out``; a dictionary's folder is offered as the features command's DICT instead."""
    from anatomy_cli.models.sae.read import first_hook
    from anatomy_cli.models.sae.read import holds_dictionary

    if holds_dictionary(root):
        hook = first_hook(root)
        dictionary = f"{root} --hook {hook}" if hook is not None else str(root)
        return (f"a dictionary, not a features output: explain reads what anatomy features {dictionary} --corpus PATH "
                f"--out FEATS --delphi FEATS/latents writes into a new folder FEATS (then anatomy explain FEATS)")
    if any(Path(root).iterdir()):
        return ("not a features output (anatomy features DICT --corpus PATH --out FEATS --delphi FEATS/latents "
                "writes one into a new folder FEATS; then anatomy explain FEATS)")
    return f"not a features output (run {making(root)} first)"


def unfinished(root: Path) -> bool:
    """True when ``root/manifest.json`` is a features run's (its settings name the followed features): one that
    was interrupted before its tables were written."""
    try:
        return "features" in json.loads((Path(root) / "manifest.json").read_text())["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def find_cache(root: Path, given: Path | None) -> Path:
    """The folder of delphi's cache for one hook (``<DIR>/<hook>/`` with config.json and the splits): under
    ``given`` or, by default, under FEATURES_DIR. UsageError when there is none."""
    base = given if given is not None else root
    found = sorted(p.parent for p in Path(base).glob("**/config.json")
                   if any(p.parent.glob("*_*.safetensors")))
    if not found:
        where = f"--delphi {given}" if given is not None else str(root)
        raise UsageError(f"{where} holds no delphi latent cache (explain reads there where a feature does not fire): "
                         f"run the features command again with --delphi added, {making(root)} --overwrite (the same "
                         f"dictionary and corpus), or name a cache with --delphi DIR")
    if len(found) > 1:
        raise UsageError(f"{base} holds {len(found)} latent caches ({', '.join(str(p) for p in found[:3])}): name "
                         f"one with --delphi")
    return found[0]


def read_cache(folder: Path) -> tuple[str, dict[int, set[tuple[int, int]]]]:
    """``(hook, {feature: {(window, position), ...}})``: where each feature's activation was recorded, as
    delphi's ``TensorBuffer.load`` reads the splits (the first feature from the file name)."""
    import numpy as np
    from safetensors.numpy import load_file

    active: dict[int, set[tuple[int, int]]] = {}
    for path in sorted(folder.glob("*_*.safetensors")):
        try:
            start = int(path.stem.split("_")[0])
            split = load_file(str(path))
            locations = split["locations"].astype(np.int64)
        except (ValueError, OSError, KeyError) as e:
            raise CheckpointError(f"{path} is not a delphi cache split ({type(e).__name__}: {e})") from None
        for window, position, f in locations.tolist():
            active.setdefault(f + start, set()).add((window, position))
    return folder.name, active


def read_tables(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """features.parquet's and contexts.parquet's rows (CheckpointError for unreadable ones)."""
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(root / "features.parquet").to_pylist()
        contexts = pq.read_table(root / "contexts.parquet").to_pylist()
    except Exception as e:  # pyarrow's own errors
        if isinstance(e, (KeyboardInterrupt, MemoryError)):
            raise
        raise CheckpointError(f"{root}: its tables cannot be read ({type(e).__name__}: {e})") from None
    return rows, contexts


def _draw(items: list[Any], n: int, seed: int, feature: int) -> list[Any]:
    """``n`` of ``items`` without replacement, in their order (numpy's generator of ``(seed, feature)``)."""
    import numpy as np

    if len(items) <= n:
        return list(items)
    pick = np.random.default_rng([seed, feature]).choice(len(items), size=n, replace=False)
    return [items[i] for i in sorted(pick.tolist())]


def examples(rows: list[dict[str, Any]], contexts: list[dict[str, Any]], active: dict[int, set[tuple[int, int]]],
             opts: Any) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """The features to explain, each a :class:`~anatomy_cli.tasks.explain.FeatureExamples`, and those skipped
    (dead, or no top context)."""
    by_feature: dict[int, list[dict[str, Any]]] = {}
    spans: dict[tuple[int, int], dict[str, Any]] = {}
    for c in contexts:
        by_feature.setdefault(int(c["feature"]), []).append(c)
        spans.setdefault((int(c["window"]), int(c["position"]) - int(c["at"])), c)
    out: list[FeatureExamples] = []
    skipped: list[int] = []
    for row in sorted(rows, key=lambda r: int(r["feature"])):
        f = int(row["feature"])
        mine = by_feature.get(f, [])
        top = sorted((c for c in mine if c["kind"] == "top"), key=lambda c: int(c["rank"]))
        if row.get("status") == "dead" or not top:
            skipped.append(f)
            continue
        if opts.max_features is not None and len(out) >= opts.max_features:
            break
        quantile = [c for c in mine if c["kind"] == "quantile"] or top[opts.examples:]
        fires = active.get(f, set())
        quiet = [c for key, c in sorted(spans.items()) if int(c["feature"]) != f
                 and not any((key[0], key[1] + i) in fires for i in range(len(c["tokens"])))]
        pair = lambda c: (list(c["tokens"]), [float(a) for a in c["activations"]])
        not_active = [(list(c["tokens"]), [0.0] * len(c["tokens"]))
                      for c in _draw(quiet, opts.non_activating, opts.seed, f)]
        out.append(FeatureExamples(f, float(row["max_activation"]), tuple(pair(c) for c in top[:opts.examples]),
                                   tuple(pair(c) for c in _draw(quantile, opts.test, opts.seed, f)),
                                   tuple(not_active)))
    return tuple(out), tuple(skipped)

