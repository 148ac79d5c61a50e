"""Run a corpus: plan the shards, measure each with a :class:`Worker`, merge in shard order, store.

In-process, one :class:`Worker` measures every shard; with Ray (:mod:`anatomy_cli.corpus.ray_run`) each
Ray actor holds its own :class:`Worker`, so both run the same code on the same shards. The driver plans
the shards (tokenizing the source as a stream), hands out the ones not finished yet, writes each
result as it arrives and merges all of them in shard order at the end.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.sources import Source
from anatomy_cli.corpus.store import Store
from anatomy_cli.corpus.summary import CorpusStats, summarize
from anatomy_cli.corpus.windows import Shard, shards, token_stream, windows
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec


@dataclass(frozen=True)
class Settings:
    """What decides the figures: ``ctx`` tokens per window, ``bos`` (each window starts with BOS),
    ``max_tokens`` (None: all), ``lens`` (measure the logit lens) every ``lens_every`` positions, ``heads``,
    ``shard_windows`` windows per shard, ``allow_special``. ``batch_size`` (windows per forward) is not
    part of the run's identity: it changes float rounding only."""

    ctx: int
    bos: bool
    max_tokens: int | None = None
    lens: bool = True
    lens_every: int = 1
    heads: bool = False
    shard_windows: int = 16
    allow_special: bool = False
    batch_size: int = 4

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("batch_size")
        return out


class Worker:
    """Loads the model once (or takes a loaded one); ``worker(shard)`` measures one shard into a :class:`Partial`.

    The callable-class pattern of Ray Data's ``map_batches``: a Ray actor wraps exactly this class.
    ``crash_once = (marker_path, shard_index)`` is fault injection for tests: the first worker process to
    reach that shard creates the marker and exits at once (as a killed worker would).
    """

    def __init__(self, spec: dict[str, Any], settings: dict[str, Any], *, lm: Any = None,
                 crash_once: tuple[str, int] | None = None):
        from anatomy_cli import engine

        self.settings = Settings(**settings)
        self.lm = lm if lm is not None else engine.load(ModelSpec.from_dict(spec))
        self.crash_once = crash_once

    def __call__(self, shard: Shard) -> Partial:
        import torch

        from anatomy_cli.corpus.measure import measure

        if self.crash_once and shard.index == self.crash_once[1]:
            try:
                fd = os.open(self.crash_once[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os._exit(1)
        lm, s = self.lm, self.settings
        part = Partial(lm.n_layers, lm.n_heads, lm.d_model)
        start = 0
        group = list(shard.windows)
        while start < len(group):
            # Consecutive windows of one length (only the corpus' last window is shorter), batch_size at a time.
            end = start + 1
            while end < len(group) and end - start < s.batch_size and len(group[end]) == len(group[start]):
                end += 1
            ids = torch.tensor(group[start:end], dtype=torch.long)
            measure(lm, ids, part, first_window=shard.first_window + start, lens=s.lens, lens_every=s.lens_every,
                    heads=s.heads)
            start = end
        return part

    def run(self, shard: Shard) -> Partial:
        """``self(shard)``, under a name a Ray actor handle exposes."""
        return self(shard)


def plan(source: Source, tokenizer: Any, settings: Settings) -> Iterator[Shard]:
    """The shards of ``source`` (lazily; see :mod:`anatomy_cli.corpus.windows`)."""
    hf = tokenizer.hf
    bos = hf.bos_token_id if settings.bos and hf.bos_token_id is not None else None
    stream = token_stream(source.pieces(), hf, allow_special=settings.allow_special, eos=hf.eos_token_id)
    return shards(windows(stream, ctx=settings.ctx, bos=bos, max_tokens=settings.max_tokens),
                  settings.shard_windows)


@dataclass(frozen=True)
class Progress:
    """What a progress callback sees after each shard: tokens so far (``done`` of them this run), the
    token budget (None: unknown), seconds elapsed this run and the time split (forward, lens, heads)."""

    tokens: int
    done: int
    budget: int | None
    elapsed: float
    seconds: dict[str, float]
    shards: int
    resumed: int


@dataclass(frozen=True)
class Result:
    stats: CorpusStats
    shards: int
    resumed: int
    seconds: dict[str, float]
    elapsed: float


def run(source: Source, spec: ModelSpec, settings: Settings, *, tokenizer: Any, lm: Any = None,
        out: Path | None = None, overwrite: bool = False, identity: dict[str, Any] | None = None,
        ray: dict[str, Any] | None = None, progress: Callable[[Progress], None] | None = None,
        crash_once: tuple[str, int] | None = None) -> Result:
    """Measure every shard of ``source`` and merge them in shard order.

    ``lm``: the loaded model for an in-process run (None with ``ray``). ``out``: the directory for shards,
    manifest and summary; finished shards there are loaded, not recomputed. ``ray``: ``{"address",
    "workers", "gpus_per_worker"}`` to run on Ray instead. Raises UsageError for an empty corpus or an
    ``out`` that holds another run (unless ``overwrite``).
    """
    store = None
    if out is not None:
        store = Store(out)
        store.open(spec.to_dict(), identity or source.identity(), settings.to_dict(), overwrite=overwrite)
    parts: dict[int, Partial] = {}
    resumed = 0
    if store is not None:
        for index in sorted(store.done):
            parts[index] = store.load(index)
            resumed += 1
    t0 = time.perf_counter()
    state = {"tokens": sum(p.tokens for p in parts.values()), "done": 0, "shards": 0, "seconds": {}}

    def finished(shard: Shard, part: Partial) -> None:
        parts[shard.index] = part
        if store is not None:
            store.save(shard.index, part)
        state["tokens"] += part.tokens
        state["done"] += part.tokens
        state["shards"] += 1
        for k, v in part.seconds.items():
            state["seconds"][k] = state["seconds"].get(k, 0.0) + v
        if progress is not None:
            progress(Progress(state["tokens"], state["done"], settings.max_tokens, time.perf_counter() - t0,
                              dict(state["seconds"]), state["shards"], resumed))

    todo = (shard for shard in plan(source, tokenizer, settings) if shard.index not in parts)
    n_seen = [0]

    def counted(it: Iterator[Shard]) -> Iterator[Shard]:
        for shard in it:
            n_seen[0] = max(n_seen[0], shard.index + 1)
            yield shard

    if ray is not None:
        from anatomy_cli.corpus.ray_run import run_on_ray

        run_on_ray(counted(todo), spec, settings, finished, crash_once=crash_once, **ray)
    else:
        worker = Worker(spec.to_dict(), dataclasses.asdict(settings), lm=lm, crash_once=crash_once)
        for shard in counted(todo):
            finished(shard, worker(shard))
    total = max(n_seen[0], max(parts, default=-1) + 1)
    if not parts:
        raise UsageError("the corpus has no text: nothing to measure (it needs at least 2 tokens)")
    missing = [i for i in range(total) if i not in parts]
    if missing:  # an out dir with shards beyond the plan, or a bug: never merge around a hole
        raise UsageError(f"shards {missing[:5]} are missing from the run")
    merged = Partial(parts[0].n_layers, parts[0].n_heads, parts[0].d_model)
    for index in range(total):
        merged.merge(parts[index])
    stats = summarize(merged)
    if store is not None:
        store.finish(stats, total)
    return Result(stats, total, resumed, state["seconds"], time.perf_counter() - t0)
