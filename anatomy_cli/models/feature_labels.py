"""Where a dictionary's feature labels come from, decided once for `sae`, `circuit` and `generate --steer-feature`.

In order, the first that exists wins:

1. ``--labels PATH`` given explicitly (a Neuronpedia explanations export, labels.py);
2. ``--features-dir DIR``'s ``explanations.json`` (DIR: a ``features --out`` folder; ``explain`` writes its
   explanations there in the same export format);
3. ``explanations.json`` beside the dictionary (in its folder; for a transcoder set, beside the set or beside each
   block's dictionary).

Without any, no label is invented. ``--features-dir DIR`` also gives, where a feature has no label, the tokens its
decoder direction promotes most (DIR's ``logit_effects.parquet``), shown as top tokens, never as a label; and DIR's
dashboard page (``DIR/features.html``, what ``features --plot DIR/features.html`` writes), whose panel of feature
``f`` is the anchor ``#f-f``. DIR's dictionary is the one its ``manifest.json`` settings name: its hook point says
which block (a circuit's) or refuses a DIR of another dictionary (`sae`, `generate`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sae.labels import read_labels
from anatomy_cli.models.sae.labels import read_layer_labels
from anatomy_cli.models.sites import block_of
from anatomy_cli.text.display import visible

BESIDE = "explanations.json"
DASHBOARD = "features.html"
TOP_TOKENS = 3  # promoted tokens shown where a feature has no label


@dataclass(frozen=True)
class FeatureLabels:
    """One dictionary's labels. ``text``: feature -> label; ``source``: where they came from (``--labels PATH``,
    ``PATH (--features-dir)``, ``PATH (beside the dictionary)``; None: no labels); ``top_tokens``: feature -> its
    most promoted tokens (space-separated, from ``--features-dir``), for features without a label; ``dashboard``:
    the dashboard page's file URI, or None."""

    text: dict[int, str] = field(default_factory=dict)
    source: str | None = None
    top_tokens: dict[int, str] = field(default_factory=dict)
    dashboard: str | None = None

    def shown(self, feature: int) -> str:
        """The label, else ``top tokens: …`` (marked as such), else ""."""
        if feature in self.text:
            return self.text[feature]
        tops = self.top_tokens.get(feature)
        return f"top tokens: {tops}" if tops else ""

    def link(self, feature: int) -> str | None:
        """The feature's panel in the dashboard page, or None."""
        return f"{self.dashboard}#f-{feature}" if self.dashboard else None


@dataclass(frozen=True)
class BlockLabels:
    """A circuit's labels: ``text`` and ``top_tokens`` per ``(block, feature)``; ``sources``: where they came from;
    ``dashboards``: block -> the dashboard page's file URI."""

    text: dict[tuple[int, int], str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    top_tokens: dict[tuple[int, int], str] = field(default_factory=dict)
    dashboards: dict[int, str] = field(default_factory=dict)


def folder_of(path: Path) -> Path:
    """The dictionary's folder (a file's parent)."""
    return path if path.is_dir() else path.parent


def dictionary_labels(dictionary: Path, site: str, labels: str | Path | None, features_dir: Sequence[Path | str],
                      neuronpedia_id: str | None = None) -> FeatureLabels:
    """One dictionary's labels (the module docstring's order). ``site``: its hook point, which each
    ``features_dir`` must share (UsageError otherwise, and for a DIR that is no ``features --out`` folder)."""
    dirs = [Path(d) for d in features_dir]
    for d in dirs:
        theirs = run_site(d)
        if theirs is not None and theirs != site:
            raise UsageError(f"--features-dir {d} describes a dictionary at {theirs}, not this one's {site}")
    top: dict[int, str] = {}
    for d in dirs:
        top.update(top_tokens(d))
    dashboard = next((uri(d / DASHBOARD) for d in dirs if (d / DASHBOARD).is_file()), None)
    if labels is not None:
        return FeatureLabels(read_labels(Path(labels), neuronpedia_id), f"--labels {labels}", top, dashboard)
    found = [(d / BESIDE, "--features-dir") for d in dirs] + [(folder_of(dictionary) / BESIDE,
                                                               "beside the dictionary")]
    for path, how in found:
        if path.is_file():
            return FeatureLabels(read_labels(path), f"{path} ({how})", top, dashboard)
    return FeatureLabels(top_tokens=top, dashboard=dashboard)


def block_labels(root: Path, dictionaries: Sequence[Path], n_layers: int, labels: str | Path | None,
                 features_dir: Sequence[Path | str]) -> BlockLabels:
    """A transcoder set's labels (``root``: its folder; ``dictionaries``: block l's file or folder, or empty for a
    set in one folder). ``--labels`` alone when given; else each ``features_dir``'s explanations.json for its
    block, ``root/explanations.json`` (blocks from the records' ``layer``) and each block's own folder's."""
    text: dict[tuple[int, int], str] = {}
    top: dict[tuple[int, int], str] = {}
    sources: list[str] = []
    dashboards: dict[int, str] = {}
    for d in (Path(x) for x in features_dir):
        block = run_block(d)
        _same_dictionary(d, block, root, dictionaries)
        top.update({(block, f): t for f, t in top_tokens(d).items()})
        if (d / DASHBOARD).is_file():
            dashboards[block] = uri(d / DASHBOARD)
        if labels is None and (d / BESIDE).is_file():
            _merge(text, {(block, f): t for f, t in read_labels(d / BESIDE).items()}, sources,
                   f"{d / BESIDE} (--features-dir)")
    if labels is not None:
        return BlockLabels(read_layer_labels(labels, n_layers), (f"--labels {labels}",), top, dashboards)
    if (root / BESIDE).is_file():
        _merge(text, read_layer_labels(root / BESIDE, n_layers), sources, f"{root / BESIDE} (beside the transcoders)")
    for block, path in enumerate(dictionaries):
        own = folder_of(path) / BESIDE
        if folder_of(path) != root and own.is_file():
            _merge(text, {(block, f): t for f, t in read_labels(own).items()}, sources,
                   f"{own} (beside block {block}'s dictionary)")
    return BlockLabels(text, tuple(sources), top, dashboards)


def _same_dictionary(d: Path, block: int, root: Path, dictionaries: Sequence[Path]) -> None:
    """UsageError where DIR's run read another dictionary than the transcoders' block ``block`` (its feature ids
    would name other features): the run's ``sae`` must be the set's folder, or block ``block``'s file or folder."""
    made = Path(_settings(d)["sae"]).resolve()
    ours = {root.resolve()}
    if block < len(dictionaries):
        ours |= {Path(dictionaries[block]).resolve(), folder_of(Path(dictionaries[block])).resolve()}
    if made not in ours:
        raise UsageError(f"--features-dir {d}: made from {made}, not from these transcoders' block {block} "
                         f"({root}): its feature ids name another dictionary's features; run features on the "
                         f"block's own dictionary")


def _merge(into: dict[tuple[int, int], str], more: dict[tuple[int, int], str], sources: list[str], name: str
           ) -> None:
    """Add ``more``'s labels that ``into`` lacks (the first source wins); name the source when it gave any."""
    added = {k: v for k, v in more.items() if k not in into}
    if added:
        into.update(added)
        sources.append(name)


def _settings(d: Path) -> dict[str, Any]:
    """DIR's run settings (its manifest.json); UsageError for a DIR that is no ``features --out`` folder."""
    manifest = d / "manifest.json"
    if not manifest.is_file():
        raise UsageError(f"--features-dir {d}: no manifest.json (a folder that anatomy features --out wrote)")
    try:
        settings = json.loads(manifest.read_text(encoding="utf-8")).get("settings", {})
    except (OSError, ValueError, AttributeError) as e:  # there, but corrupt: as a corrupt model file (exit 1)
        raise CheckpointError(f"--features-dir {d}: its manifest.json cannot be read ({type(e).__name__}: "
                              f"{e})") from None
    if not isinstance(settings, dict) or "sae" not in settings:
        raise UsageError(f"--features-dir {d}: its manifest.json names no dictionary (a folder that anatomy "
                         f"features --out wrote)")
    return settings


def run_site(d: Path) -> str | None:
    """The hook point of DIR's dictionary, or None when the dictionary is no longer where DIR's run read it. Read
    as ``features`` read it (models/ct_block.py ``read_dictionary``): an SAE or transcoder, or one block of a
    circuit-tracer transcoder set or cross-layer transcoder, picked by the run's ``--hook``."""
    from anatomy_cli.models.ct_block import read_dictionary

    settings = _settings(d)
    try:
        return read_dictionary(settings["sae"], hook=settings.get("hook"), values=False).site
    except UsageError:
        return None


def run_block(d: Path) -> int:
    """The block of DIR's dictionary; UsageError when it cannot be read or sits in no block."""
    site = run_site(d)
    if site is None:
        raise UsageError(f"--features-dir {d}: its dictionary {_settings(d)['sae']} cannot be read, so its block "
                         f"is unknown")
    try:
        return block_of(site)
    except ValueError:
        raise UsageError(f"--features-dir {d}: its dictionary reads {site}, in no block") from None


def top_tokens(d: Path) -> dict[int, str]:
    """feature -> its :data:`TOP_TOKENS` most promoted tokens (DIR's logit_effects.parquet), space-separated."""
    path = d / "logit_effects.parquet"
    if not path.is_file():
        return {}
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["feature", "side", "rank", "token"]).to_pylist()
    out: dict[int, list[str]] = {}
    for r in sorted(rows, key=lambda r: (r["feature"], r["rank"])):
        if r["side"] == "top" and r["rank"] < TOP_TOKENS:
            out.setdefault(int(r["feature"]), []).append(visible(str(r["token"])))
    return {f: " ".join(t) for f, t in out.items()}


def uri(path: Path) -> str:
    return path.resolve().as_uri()
