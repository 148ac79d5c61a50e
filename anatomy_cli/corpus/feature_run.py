"""`anatomy features`' pass over a corpus: the corpus' windows and shards (:mod:`anatomy_cli.corpus.runner`'s
plan), each shard's :class:`~anatomy_cli.corpus.feature_sums.FeatureSums` measured by a :class:`FeatureWorker`
(in-process, or one per Ray actor through :func:`~anatomy_cli.corpus.ray_run.run_on_ray`), saved to and resumed
from ``--out DIR`` by the corpus' :class:`~anatomy_cli.corpus.store.Store` (manifest, one Parquet file per shard,
checksums), merged in shard order.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from anatomy_cli import engine
from anatomy_cli.corpus.feature_batch import add_batch
from anatomy_cli.corpus.feature_sums import FeatureSums
from anatomy_cli.corpus.ray_run import run_on_ray
from anatomy_cli.corpus.runner import Result
from anatomy_cli.corpus.runner import _Tracker
from anatomy_cli.corpus.runner import merge_in_order
from anatomy_cli.corpus.runner import model_identity
from anatomy_cli.corpus.runner import plan
from anatomy_cli.corpus.sources import Source
from anatomy_cli.corpus.store import Store
from anatomy_cli.corpus.windows import Shard
from anatomy_cli.corpus.windows import batches
from anatomy_cli.corpus.worker import crash_if_marked
from anatomy_cli.declare.shared import OnRay
from anatomy_cli.models.ct_block import read_dictionary as read
from anatomy_cli.models.spec import ModelSpec

if TYPE_CHECKING:
    from anatomy_cli.corpus.delphi_cache import DelphiWriter
    from anatomy_cli.corpus.runner import Progress
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.sae.read import SAEFile
    from anatomy_cli.text.tokenization import Tokenizer


@dataclass(frozen=True)
class FeatureSettings:
    """What decides the figures: the corpus' windows (``ctx``, ``bos``, ``max_tokens``, ``shard_windows``,
    ``allow_special``), the dictionary (``sae`` its path, ``hook``), the followed ``features`` (ids), ``top_k``,
    ``quantile_size`` (samples kept per histogram bin), ``window`` (context tokens each side), ``seed``,
    ``cooccur`` (count co-firing), ``delphi`` (keep the nonzero activations). ``batch_size`` changes float
    rounding only, as the corpus': it is not in the manifest."""

    ctx: int
    bos: bool
    sae: str
    hook: str | None
    features: tuple[int, ...]
    max_tokens: int | None = None
    shard_windows: int = 16
    allow_special: bool = False
    top_k: int = 20
    quantile_size: int = 5
    window: int = 10
    seed: int = 22
    cooccur: bool = True
    delphi: bool = False
    batch_size: int = 4

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("batch_size")
        out["features"] = list(self.features)
        return out


class FeatureStore(Store):
    """The corpus' run directory, its shards holding :class:`FeatureSums`."""

    part_type = FeatureSums


class FeatureWorker:
    """The model (loaded once from ``spec``, or ``lm``) and the dictionary (read from ``settings``' path, or
    ``sae_file``, the caller's); ``worker(shard)`` measures one shard.
    The shape :func:`~anatomy_cli.corpus.ray_run.run_on_ray` wants of an actor's class."""

    def __init__(self, spec: dict[str, Any], settings: dict[str, Any], *, lm: LoadedModel | None = None,
                 sae_file: SAEFile | None = None, crash_once: tuple[str, int] | None = None):
        from anatomy_cli.engine.sae import Dictionary

        self.settings = FeatureSettings(**{**settings, "features": tuple(settings["features"])})
        self.lm = lm if lm is not None else engine.load(ModelSpec.from_dict(spec))
        if sae_file is None:  # a Ray worker: read where it runs (in-process the caller's, read once, is given)
            sae_file = read(Path(self.settings.sae), hook=self.settings.hook)
        self.dictionary = Dictionary(sae_file, self.lm.device)
        self.crash_once = crash_once

    def __call__(self, shard: Shard, on_window: Callable[[int, int], None] | None = None) -> FeatureSums:
        import torch

        from anatomy_cli.engine.sae import window_features

        crash_if_marked(self.crash_once, shard.index)
        s = self.settings
        part = FeatureSums(np.asarray(s.features, np.int64), s.top_k, s.quantile_size, s.window,
                           self.dictionary.file.d_sae, s.cooccur)
        group = list(shard.windows)
        for start, end in batches(shard, s.batch_size):
            ids = torch.tensor(group[start:end], dtype=torch.long)
            t0 = time.perf_counter()
            acts = window_features(self.lm, ids, self.dictionary)
            t1 = time.perf_counter()
            add_batch(part, acts, ids.to(acts.device), shard.first_window + start, seed=s.seed, delphi=s.delphi)
            part.seconds["forward"] = part.seconds.get("forward", 0.0) + t1 - t0
            part.seconds["features"] = part.seconds.get("features", 0.0) + time.perf_counter() - t1
            if on_window is not None:
                on_window(end - start, int(ids.numel()))
        return part

    def run(self, shard: Shard) -> FeatureSums:
        return self(shard)


def run(source: Source, spec: ModelSpec, settings: FeatureSettings, *, tokenizer: Tokenizer,
        lm: LoadedModel | None = None, sae_file: SAEFile | None = None,
        out: Path | None = None, overwrite: bool = False, identity: Mapping[str, object] | None = None,
        ray: OnRay | None = None, progress: Callable[[Progress], None] | None = None,
        delphi: DelphiWriter | None = None, crash_once: tuple[str, int] | None = None) -> Result:
    """Measure every shard of ``source`` and merge them in shard order (as :func:`anatomy_cli.corpus.runner.run`);
    the runner's Result, ``stats`` the merged :class:`FeatureSums`.
    ``delphi``: a :class:`~anatomy_cli.corpus.delphi_cache.DelphiWriter` each shard's nonzero activations go to;
    ``sae_file``: the dictionary the caller read (in-process; None: read from ``settings.sae``)."""
    store = None
    if out is not None:
        store = FeatureStore(out)
        store.open(model_identity(spec, tokenizer), identity or source.identity(), settings.to_dict(),
                   overwrite=overwrite)
    parts: dict[int, FeatureSums] = {}
    recomputed: list[str] = []
    for index in sorted(store.done if store is not None else {}):
        assert store is not None
        part = store.load(index)
        why = part if isinstance(part, str) else delphi.check(index) if delphi is not None else None
        if why:
            recomputed.append(f"shard {index}: {why}")
            continue
        parts[index] = part  # type: ignore[assignment]
    track = _Tracker(parts, settings, store, progress, on_ray=ray is not None)  # type: ignore[arg-type]

    def finished(shard: Shard, part: FeatureSums) -> None:
        if delphi is not None:
            delphi.save(shard, part.nonzero)
        part.nonzero = []
        track.finished(shard, part)  # type: ignore[arg-type]

    todo = track.counted(shard for shard in plan(source, tokenizer, settings) if shard.index not in parts)  # type: ignore[arg-type]
    if ray is not None:
        run_on_ray(todo, spec, settings, finished, crash_once=crash_once, worker=FeatureWorker, **ray)
    else:
        worker = FeatureWorker(spec.to_dict(), dataclasses.asdict(settings), lm=lm, sae_file=sae_file,
                               crash_once=crash_once)
        for shard in todo:
            finished(shard, worker(shard, track.on_window))
    total = max(track.seen, max(parts, default=-1) + 1)
    merged = merge_in_order(parts, total, FeatureSums.empty)
    if store is not None:
        store.mark_complete(total, merged.windows, merged.tokens)
    return Result(merged, total, track.resumed, track.seconds, time.perf_counter() - track.t0,
                         tuple(recomputed))
