"""Run a corpus: plan the shards, measure each with a :class:`Worker`, merge in shard order, store.

In-process, one :class:`Worker` measures every shard; with Ray (:mod:`anatomy_cli.corpus.ray_run`) each
Ray actor holds its own :class:`Worker`, so both run the same code on the same shards. The driver plans
the shards (tokenizing the source as a stream), hands out the ones not finished yet, writes each
result as it arrives and merges all of them in shard order at the end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol
from typing import TypeVar

from anatomy_cli.corpus.activations import ActivationStore
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.ray_run import run_on_ray
from anatomy_cli.corpus.sources import Source
from anatomy_cli.corpus.store import Store
from anatomy_cli.corpus.summary import summarize
from anatomy_cli.corpus.windows import Shard
from anatomy_cli.corpus.windows import shards
from anatomy_cli.corpus.windows import token_stream
from anatomy_cli.corpus.windows import windows
from anatomy_cli.corpus.worker import Settings
from anatomy_cli.corpus.worker import Worker
from anatomy_cli.declare.shared import OnRay
from anatomy_cli.errors import UsageError
from anatomy_cli.models.identity import file_records
from anatomy_cli.models.identity import tokenizer_digest
from anatomy_cli.models.spec import ModelSpec

if TYPE_CHECKING:
    from typing_extensions import Self

    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.text.tokenization import Tokenizer

__all__ = ["Progress", "Result", "Settings", "Worker", "plan", "run"]


def plan(source: Source, tokenizer: Tokenizer, settings: Settings) -> Iterator[Shard]:
    """The shards of ``source`` (lazily; see :mod:`anatomy_cli.corpus.windows`)."""
    hf = tokenizer.hf
    bos = hf.bos_token_id if settings.bos and hf.bos_token_id is not None else None
    stream = token_stream(source.pieces(), hf, allow_special=settings.allow_special, eos=hf.eos_token_id)
    return shards(windows(stream, ctx=settings.ctx, bos=bos, max_tokens=settings.max_tokens),
                  settings.shard_windows)


@dataclass(frozen=True)
class Progress:
    """What a progress callback sees: once when the first shard is planned, then after each batch of
    windows in-process (each shard on Ray): tokens so far (``done`` of them this run), the token budget
    (None: unknown), seconds elapsed this run, the time split of finished shards (forward, lens, heads),
    shards finished this run, shards resumed, windows measured this run and windows planned so far."""

    tokens: int
    done: int
    budget: int | None
    elapsed: float
    seconds: dict[str, float]
    shards: int
    resumed: int
    windows: int = 0
    planned: int = 0


@dataclass(frozen=True)
class Result:
    stats: Any  # CorpusStats (corpus); the merged FeatureSums (features, corpus/feature_run.py)
    shards: int
    resumed: int
    seconds: dict[str, float]
    elapsed: float
    recomputed: tuple[str, ...] = ()  # "shard 3: damaged (...)" for each listed shard that was computed again


def run(source: Source, spec: ModelSpec, settings: Settings, *, tokenizer: Tokenizer, lm: LoadedModel | None = None,
        out: Path | None = None, overwrite: bool = False, identity: dict[str, object] | None = None,
        ray: OnRay | None = None, progress: Callable[[Progress], None] | None = None,
        crash_once: tuple[str, int] | None = None) -> Result:
    """Measure every shard of ``source`` and merge them in shard order.

    ``lm``: the loaded model for an in-process run (None with ``ray``). ``out``: the directory for shards,
    manifest and summary; finished shards there are loaded, not recomputed. ``ray``: ``{"address",
    "workers", "gpus_per_worker"}`` to run on Ray instead. Raises UsageError for an empty corpus or an
    ``out`` that holds another run (unless ``overwrite``).
    """
    store, acts = _stores(source, spec, settings, tokenizer, out, overwrite, identity, ray)
    parts, recomputed = _resume(store, acts)
    track = _Tracker(parts, settings, store, progress, on_ray=ray is not None)
    planned = acts.plan(source, tokenizer, settings) if acts is not None else plan(source, tokenizer, settings)
    todo = track.counted(shard for shard in planned if shard.index not in parts)
    if ray is not None:
        run_on_ray(todo, spec, settings, track.finished, crash_once=crash_once, **ray)
    else:
        worker = Worker(spec.to_dict(), dataclasses.asdict(settings), lm=lm, crash_once=crash_once)
        for shard in todo:
            part = worker(shard, track.on_window)
            if acts is not None:
                acts.save(shard, worker.saved)
            track.finished(shard, part)
    total = max(track.seen, max(parts, default=-1) + 1)
    stats = summarize(_merge(parts, total), settings.lens)
    if store is not None:
        store.finish(stats, total)
    return Result(stats, total, track.resumed, track.seconds, time.perf_counter() - track.t0, tuple(recomputed))


def _stores(source: Source, spec: ModelSpec, settings: Settings, tokenizer: Tokenizer, out: Path | None,
            overwrite: bool, identity: dict[str, object] | None, ray: OnRay | None) -> tuple[Any, Any]:
    """The run directory's Store (None without ``out``) and the ActivationStore (None without
    ``--save-activations``)."""
    store = acts = None
    if out is not None:
        store = Store(out)
        store.open(model_identity(spec, tokenizer, settings.fitted), identity or source.identity(), settings.to_dict(),
                   overwrite=overwrite)
    if settings.save_activations:
        if out is None or ray is not None:
            raise UsageError("--save-activations needs --out DIR and runs in-process (not with --ray)")
        acts = ActivationStore(out, settings, overwrite=overwrite)
    return store, acts


def _resume(store: Store | None, acts: Any) -> tuple[dict[int, Partial], list[str]]:
    """The finished shards a run directory holds, and ``shard N: why`` for each that must be computed again."""
    parts: dict[int, Partial] = {}
    recomputed: list[str] = []
    if store is None:
        return parts, recomputed
    for index in sorted(store.done):
        part = store.load(index)
        why = part if isinstance(part, str) else acts.check(index) if acts is not None else None
        if isinstance(part, str) or why:
            recomputed.append(f"shard {index}: {why}")
            continue
        parts[index] = part
    return parts, recomputed


def _merge(parts: dict[int, Partial], total: int) -> Partial:
    """Every shard's sums, in shard order (:func:`merge_in_order`)."""
    return merge_in_order(parts, total, lambda p: Partial(p.n_layers, p.n_heads, p.d_model, p.fitted))


class Mergeable(Protocol):
    """A shard's sums, which a later shard's of the same shape are merged into."""

    def merge(self, other: Self) -> object: ...


P = TypeVar("P", bound=Mergeable)


def merge_in_order(parts: Mapping[int, P], total: int, empty: Callable[[P], P]) -> P:
    """Shards ``0..total-1`` of ``parts`` merged in shard order into ``empty(parts[0])`` (a part of that shape with
    nothing in it). Raises UsageError for no text or a hole in the shards."""
    if not parts:
        raise UsageError("the corpus has no text: nothing to measure (it needs at least 2 tokens)")
    missing = [i for i in range(total) if i not in parts]
    if missing:  # an out dir with shards beyond the plan, or a bug: never merge around a hole
        raise UsageError(f"shards {missing[:5]} are missing from the run")
    merged = empty(parts[0])
    for index in range(total):
        merged.merge(parts[index])
    return merged


class _Tracker:
    """A run's bookkeeping: tokens, windows and shards done, the time split, and the progress callback."""

    def __init__(self, parts: dict[int, Partial], settings: Settings, store: Store | None,
                 progress: Callable[[Progress], None] | None, *, on_ray: bool):
        self.parts, self.settings, self.store, self.progress, self.on_ray = parts, settings, store, progress, on_ray
        self.resumed = len(parts)
        self.t0 = time.perf_counter()
        self.tokens = sum(p.tokens for p in parts.values())
        self.done = self.shards = self.windows = self.planned = self.live = self.live_windows = self.seen = 0
        self.seconds: dict[str, float] = {}

    def report(self) -> None:
        if self.progress is not None:
            self.progress(Progress(self.tokens + self.live, self.done + self.live, self.settings.max_tokens,
                                   time.perf_counter() - self.t0, dict(self.seconds), self.shards, self.resumed,
                                   self.windows + self.live_windows, self.planned))

    def on_window(self, n_windows: int, n_tokens: int) -> None:
        self.live += n_tokens
        self.live_windows += n_windows
        self.report()

    def finished(self, shard: Shard, part: Partial) -> None:
        self.parts[shard.index] = part
        if self.store is not None:
            self.store.save(shard.index, part)
        self.tokens += part.tokens
        self.done += part.tokens
        self.windows += part.windows
        self.live = self.live_windows = 0
        self.shards += 1
        for k, v in part.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        if self.on_ray:
            self.report()

    def counted(self, it: Iterator[Shard]) -> Iterator[Shard]:
        for shard in it:
            self.seen = max(self.seen, shard.index + 1)
            first = self.planned == 0
            self.planned = max(self.planned, shard.first_window + len(shard.windows))
            if first:
                self.report()  # within seconds: the windows planned so far, before the first is measured
            yield shard


def model_identity(spec: ModelSpec, tokenizer: Tokenizer, lenses: tuple[str, ...] = ()) -> dict[str, object]:
    """What a run's manifest keys the model by: the spec, the identity of the files it is read from
    (:func:`anatomy_cli.models.identity.file_records`) and the tokenizer's digest; with fitted lenses
    (``lenses``: their ``kind:PATH``), their files' identity as ``lens_files``."""

    path = Path(spec.model).expanduser()
    resolved = str(path.resolve()) if path.exists() else spec.model
    out = {**spec.to_dict(), "resolved": resolved, "files": file_records(spec.model),
           "tokenizer": tokenizer_digest(tokenizer.hf)}
    if lenses:  # a fitted lens' files decide its figures as the model's do
        out["lens_files"] = [r for text in lenses for r in file_records(text.partition(":")[2])]
    return out
