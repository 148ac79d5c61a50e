"""`fit-lens jacobian --ray`: the prompts in shards on Ray actors, as `corpus --ray` runs its windows
(:func:`anatomy_cli.corpus.ray_run.run_on_ray`: ``--workers`` actors, one model each, loaded from the spec; a
worker that dies mid-shard is started again and the shard run again, so each shard is counted once; Ray writes
nothing to stdout).

A shard is up to ``ceil(prompts / (4 · workers))`` consecutive prompts; its worker returns the float64 sums of
``J`` over its prompts and its counts, and the driver adds the shards' sums in shard order: the fit equals the
in-process one up to the order of float64 additions. With ``--checkpoint`` a shard is one prompt, and the sums
are saved as the prompts finish (:func:`_checkpointed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import TypedDict

from anatomy_cli import engine
from anatomy_cli.corpus.ray_run import run_on_ray
from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._fit_files import jacobian_progress

if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Iterator

    import torch

    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.opening import OpenedModel
    from anatomy_cli.tasks._fit_lens_options import FitLensOptions
    from anatomy_cli.tasks._fit_lens_options import FitLensPlan


@dataclass(frozen=True)
class PromptShard:
    """Shard ``index``: its prompts' token ids."""

    index: int
    prompts: tuple[tuple[int, ...], ...]


class JacobianSettings(TypedDict):
    """What a worker fits with: the blocks, the target, the batch of J's rows, the positions skipped."""

    source_layers: list[int]
    target_layer: int
    dim_batch: int
    skip_first: int


class JacobianPart(TypedDict):
    """A shard's fit: the float64 sums of ``J`` per block, its prompts fitted and skipped."""

    sums: dict[int, torch.Tensor]
    n_prompts: int
    skipped: int


class JacobianWorker:
    """A Ray actor's state: the model, loaded once from ``spec`` (or ``lm``); ``run(shard)`` fits the shard's
    prompts into ``{"sums": {block: float64 J sum}, "n_prompts", "skipped"}``. ``settings``: ``source_layers``,
    ``target_layer``, ``dim_batch``, ``skip_first``. ``crash_once``: the corpus worker's fault injection."""

    def __init__(self, spec: dict[str, Any], settings: JacobianSettings, *, lm: LoadedModel | None = None,
                 crash_once: tuple[str, int] | None = None):
        self.settings = settings.copy()
        self.lm = lm if lm is not None else engine.load(ModelSpec.from_dict(spec))
        self.crash_once = crash_once

    def run(self, shard: PromptShard) -> JacobianPart:
        import torch

        from anatomy_cli.corpus.worker import crash_if_marked
        from anatomy_cli.engine import jacobian_fit

        crash_if_marked(self.crash_once, shard.index)
        s, d = self.settings, self.lm.info.d_model
        sums = {b: torch.zeros(d, d, dtype=torch.float64) for b in s["source_layers"]}
        fitted = [jacobian_fit.accumulate(self.lm, sums, ids, s["source_layers"], s["target_layer"],
                                          dim_batch=s["dim_batch"], skip_first=s["skip_first"])
                  for ids in shard.prompts]
        return {"sums": sums, "n_prompts": sum(fitted), "skipped": len(fitted) - sum(fitted)}


def fit_on_ray(opened: OpenedModel, ids: list[list[int]], opts: FitLensOptions, plan: FitLensPlan,
               checkpoint: dict[str, Any] | None = None,
               crash_once: tuple[str, int] | None = None) -> tuple[dict[int, torch.Tensor], int, int]:
    """``(float64 sums of J per block, prompts fitted, prompts skipped)`` over ``ids``, fitted on Ray
    (``opts.ray_address``, ``opts.workers``, ``opts.gpus_per_worker``); the workers load ``opened.spec``. With
    ``opts.checkpoint``: one prompt per shard, the sums saved as prompts finish and resumed from (``checkpoint``:
    the settings the file must match), :func:`_checkpointed`."""
    import torch

    if opts.checkpoint is not None:
        return _checkpointed(opened, ids, opts, plan, checkpoint or {}, crash_once)
    size = max(1, math.ceil(len(ids) / (4 * opts.workers)))
    shards = [PromptShard(k, tuple(tuple(p) for p in ids[i:i + size]))
              for k, i in enumerate(range(0, len(ids), size))]
    parts: dict[int, JacobianPart] = {}
    with notes.status(f"fit-lens jacobian on Ray: {len(shards)} shards of up to {size} prompts") as line:
        def finished(shard: PromptShard, part: JacobianPart) -> None:
            parts[shard.index] = part
            line.update(f"fit-lens jacobian on Ray · shard {len(parts)}/{len(shards)} done")

        _run(opened, iter(shards), opts, plan, finished, crash_once)
    d = opened.info.d_model
    sums = {b: torch.zeros(d, d, dtype=torch.float64) for b in plan.source_layers}
    for k in sorted(parts):
        for b in plan.source_layers:
            sums[b] += parts[k]["sums"][b]
    return sums, sum(p["n_prompts"] for p in parts.values()), sum(p["skipped"] for p in parts.values())


def _checkpointed(opened: OpenedModel, ids: list[list[int]], opts: FitLensOptions, plan: FitLensPlan,
                  settings: dict[str, Any],
                  crash_once: tuple[str, int] | None) -> tuple[dict[int, torch.Tensor], int, int]:
    """The Ray fit with ``--checkpoint``: shard i is prompt i alone (the prompts the checkpoint holds are not
    sent), and each finished prompt is added to the running sums, which are saved (atomically) every
    ``checkpoint_every`` prompts and after the last. The sums are added as the prompts finish, not in prompt
    order: the lens equals an uninterrupted fit's up to the order of float64 additions."""
    assert opts.checkpoint is not None  # called with --checkpoint only
    saved = Checkpoint(opts.checkpoint, settings, opts.checkpoint_every)
    progress = jacobian_progress(saved, plan.source_layers, opened.info.d_model, len(ids))
    todo = [PromptShard(i, (tuple(p),)) for i, p in enumerate(ids) if i not in progress.done]
    with notes.status(f"fit-lens jacobian on Ray: {len(todo)} prompts, one per shard") as line:
        def finished(shard: PromptShard, part: JacobianPart) -> None:
            progress.add(shard.index, part["sums"], part["n_prompts"], part["skipped"])
            progress.save_when_due(saved, len(ids))
            line.update(f"fit-lens jacobian on Ray · prompt {len(progress.done)}/{len(ids)} done")

        _run(opened, iter(todo), opts, plan, finished, crash_once)
    return progress.sums, progress.n_done, progress.skipped


def _run(opened: OpenedModel, shards: Iterator[PromptShard], opts: FitLensOptions, plan: FitLensPlan,
         finished: Callable[[PromptShard, JacobianPart], None],
         crash_once: tuple[str, int] | None) -> None:
    settings: JacobianSettings = {"source_layers": list(plan.source_layers), "target_layer": plan.target_layer,
                "dim_batch": opts.dim_batch, "skip_first": opts.skip_first}
    run_on_ray(shards, opened.spec, settings, finished, address=opts.ray_address, workers=opts.workers,
               gpus_per_worker=opts.gpus_per_worker, crash_once=crash_once, worker=JacobianWorker)
