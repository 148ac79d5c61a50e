"""Whole corpora: sharded runs with mergeable float64 statistics, Parquet shards, resume, Ray workers.

May import analyses, engine, models, text and errors; never cli or output. Modules: ``sources`` (SOURCE to
documents, its identity), ``windows`` (documents to token windows to shards), ``measure`` (one batch of
windows through the model), ``partial`` (a shard's sums and their Parquet form), ``summary`` (means and
standard errors), ``store`` (``--out DIR``), ``worker`` (:class:`~anatomy_cli.corpus.worker.Worker`: one shard),
``runner`` (plan, in-process runs, merging in shard order), ``ray_run`` (the same workers as Ray actors).
See docs/corpus.md.
"""

from __future__ import annotations

from typing import Any


class _Stop(Exception):
    pass


def read_tokenizer(spec: Any) -> tuple[Any, Any]:
    """``(tokenizer, config)`` of a ModelSpec without loading any weight (the Ray driver needs no model)."""
    from anatomy_cli import engine

    found: list[Any] = []

    def stop(tokenizer: Any, config: Any) -> None:
        found[:] = [tokenizer, config]
        raise _Stop

    try:
        engine.load(spec, before_weights=stop)
    except _Stop:
        pass
    return found[0], found[1]
