"""Shards on Ray: one actor per worker, each holding a :class:`~anatomy_cli.corpus.runner.Worker` (or another
worker class of its shape: ``Cls(spec_dict, settings_dict, crash_once=...)``, ``.run(shard)``, shards with an
``index``; ``fit-lens jacobian --ray`` passes its own).

The driver keeps at most two shards in flight per actor and hands the next shard to whichever actor
finished. Actors are created with ``max_restarts=-1`` and ``max_task_retries=-1``: when an actor's process
dies mid-shard, Ray starts it again (its ``__init__`` loads the model again) and runs the same shard on
it. The driver receives exactly one result per shard, so nothing is lost or counted twice; results go to
the caller as they arrive and are merged in shard order there.

Ray never writes to stdout (the command's results go there): workers' output is not sent to the driver
(``log_to_driver=False``), and while Ray runs the driver's stdout, both ``sys.stdout`` and file
descriptor 1, points at stderr, where Ray's own messages (``(raylet) A worker died…``) then go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol
from typing import TypeVar

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    from anatomy_cli.models.spec import ModelSpec



class Numbered(Protocol):
    """A shard as the callers plan them: its number in the run, for messages."""

    @property
    def index(self) -> int: ...


S = TypeVar("S", bound=Numbered)
R = TypeVar("R")  # what a worker returns for a shard


def ray_module() -> ModuleType:
    """``ray``, or AnatomyError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError:
        raise AnatomyError("--ray needs Ray: in a clone of anatomy, pip install -e '.[ray]'") from None
    return ray


def run_on_ray(shards: Iterator[S], spec: ModelSpec, settings: Any, finished: Callable[[S, R], None], *,
               address: str | None = None, workers: int = 2, gpus_per_worker: float = 0.0,
               crash_once: tuple[str, int] | None = None, worker: type | None = None) -> None:
    """Measure ``shards`` on ``workers`` Ray actors; ``finished(shard, partial)`` once per shard.
    ``settings``: a dataclass or a dict, handed to each actor as a dict; ``worker``: the actors' class (None:
    the corpus' :class:`~anatomy_cli.corpus.worker.Worker`).

    ``address``: a Ray cluster (``ray://host:10001`` or ``auto``); None: ``RAY_ADDRESS`` if set, else a
    local Ray started for this run (and stopped after it). Joins a Ray already initialised in this process.
    """
    ray = ray_module()
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    with stdout_to_stderr():
        _run(ray, shards, spec, settings, finished, address=address, workers=workers,
             gpus_per_worker=gpus_per_worker, crash_once=crash_once, worker=worker)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Inside: ``sys.stdout`` is ``sys.stderr`` and file descriptor 1 a copy of 2 (for threads and native
    code that write to the descriptor); both restored after, with stdout flushed first."""
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptors 1/2 (an embedding host): sys.stdout alone
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _run(ray: ModuleType, shards: Iterator[S], spec: ModelSpec, settings: Any, finished: Callable[[S, R], None], *,
         address: str | None, workers: int, gpus_per_worker: float, crash_once: tuple[str, int] | None,
         worker: type | None) -> None:
    if worker is None:
        from anatomy_cli.corpus.worker import Worker as worker

    init = settings if isinstance(settings, dict) else dataclasses.asdict(settings)
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address is None:
            kwargs["num_cpus"] = max(workers, os.cpu_count() or 1)
        try:
            # "local": a new Ray of this process's own, never a cluster a `ray start` left on this machine.
            ray.init(address=address or "local", **kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise AnatomyError(f"cannot reach Ray at {address}: {str(exc).splitlines()[0]}") from None
        started = True
    try:
        # SPREAD: the workers go to as many nodes as the cluster has, not all to the first with room.
        actor = ray.remote(num_cpus=1, num_gpus=gpus_per_worker, max_restarts=-1, max_task_retries=-1,
                           scheduling_strategy="SPREAD")(worker)
        pool = [actor.remote(spec.to_dict(), init, crash_once=crash_once)
                for _ in range(workers)]
        busy: dict[object, tuple[S, int]] = {}         # object ref -> (shard, actor)
        load = {i: 0 for i in range(len(pool))}
        pending = iter(shards)
        exhausted = False
        while True:
            while not exhausted and len(busy) < 2 * len(pool):
                shard = next(pending, None)
                if shard is None:
                    exhausted = True
                    break
                i = min(load, key=load.__getitem__)
                load[i] += 1
                busy[pool[i].run.remote(shard)] = (shard, i)
            if not busy:
                break
            ready, _ = ray.wait(list(busy), num_returns=1)
            shard, i = busy.pop(ready[0])
            load[i] -= 1
            try:
                part = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                raise AnatomyError(f"shard {shard.index} failed on Ray: {str(exc).splitlines()[0]}") from None
            finished(shard, part)
    finally:
        if started:
            ray.shutdown()
