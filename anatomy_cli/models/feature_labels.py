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
``f`` is the anchor ``#f-f``. DIR's dictionary is the one its ``manifest.json`` settings name
(:func:`features_run`): its hook point says which block (a circuit's), and a DIR made from another dictionary
than the one read is refused (:meth:`FeaturesRun.made_from`, for `sae`, `generate` and `circuit` alike).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

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
        features_run(d).made_from({dictionary}, str(dictionary.resolve()), site=site)
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
        run = features_run(d)
        block = run.block()
        block_files = [Path(dictionaries[block])] if block < len(dictionaries) else []
        run.made_from({root, *block_files, *map(folder_of, block_files)}, f"these transcoders' block {block} ({root})")
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


def _merge(into: dict[tuple[int, int], str], more: dict[tuple[int, int], str], sources: list[str], name: str
           ) -> None:
    """Add ``more``'s labels that ``into`` lacks (the first source wins); name the source when it gave any."""
    added = {k: v for k, v in more.items() if k not in into}
    if added:
        into.update(added)
        sources.append(name)


@dataclass(frozen=True)
class FeaturesRun:
    """What a ``features --out`` folder was made from, as its manifest.json's settings name it (read once by
    :func:`features_run`): ``folder``: DIR; ``sae``: the dictionary's path as the run read it (resolved);
    ``read_at`` and ``site``: the folder that dictionary re-reads to now, as ``features`` read it
    (models/ct_block.py ``read_dictionary``: an SAE or transcoder, or one block of a circuit-tracer transcoder set
    or cross-layer transcoder, picked by the run's ``--hook``), and its hook point; both None when the dictionary
    is no longer where the run read it."""

    folder: Path
    sae: Path
    read_at: Path | None
    site: str | None

    def made_from(self, ours: Iterable[Path], what: str, site: str | None = None) -> None:
        """UsageError unless the run read this dictionary (its feature ids would name another dictionary's
        features): one of ``ours`` (the paths that name it: its folder; a transcoder set's folder, a block's file
        or folder) is the run's ``sae`` or the folder it re-reads to; and its hook point is ``site`` (None: not
        asked; ``circuit`` reads the block from the run). ``what``: ours in the message. A run whose dictionary is
        no longer where it read it is judged by the path it recorded alone (its hook point unknown)."""
        d = self.folder
        if site is not None and self.site is not None and self.site != site:
            raise UsageError(f"--features-dir {d} describes a dictionary at {self.site}, not this one's {site}")
        if not {Path(p).resolve() for p in ours} & {self.sae, self.read_at}:
            gone = "" if self.read_at is not None else " (no longer there)"
            raise UsageError(f"--features-dir {d}: made from {self.sae}{gone}, not from {what}: its feature ids "
                             f"name another dictionary's features; run features on {what}")

    def block(self) -> int:
        """The block of the run's dictionary; UsageError when it cannot be read or sits in no block."""
        if self.site is None:
            raise UsageError(f"--features-dir {self.folder}: its dictionary {self.sae} cannot be read, so its block "
                             f"is unknown")
        try:
            return block_of(self.site)
        except ValueError:
            raise UsageError(f"--features-dir {self.folder}: its dictionary reads {self.site}, in no block") from None


def features_run(d: Path) -> FeaturesRun:
    """DIR's run (its manifest.json, read once; the dictionary re-read without its arrays); UsageError for a DIR
    that is no ``features --out`` folder."""
    from anatomy_cli.models.ct_block import read_dictionary

    manifest = d / "manifest.json"
    if not d.is_dir():
        what = "not a folder" if d.exists() else "no such folder"
        raise UsageError(f"--features-dir {d}: {what} (a folder that anatomy features --out wrote)")
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
    try:
        found = read_dictionary(settings["sae"], hook=settings.get("hook"), values=False)
    except UsageError:
        return FeaturesRun(d, Path(settings["sae"]).resolve(), None, None)
    return FeaturesRun(d, Path(settings["sae"]).resolve(), Path(found.path).resolve(), found.site)


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
