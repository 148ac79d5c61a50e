"""`fit-lens jacobian`: the fit (in this process, or with ``--ray`` on Ray workers,
:mod:`anatomy_cli.tasks._jacobian_ray`; either resumable from ``--checkpoint``,
:mod:`anatomy_cli.tasks._jacobian_checkpoint`), the lens written in jlens' format, and its summary.

Either way the running sums of ``J`` are float64 (``{block: [d_model, d_model]}``) beside the count of prompts
fitted and skipped; the lens is their mean (:func:`anatomy_cli.engine.jacobian_fit.lens_state`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.tasks import notes
from anatomy_cli.tasks._fit_files import DTYPES
from anatomy_cli.tasks._fit_files import HASHES
from anatomy_cli.tasks._fit_files import atomic_save

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel

# The share of a bare product's rate the fit runs its products at (norms, activations, softmax and autograd's
# bookkeeping between them): 0.45 measured on SmolLM2 on the 2-core CPU test machine (one 32-token prompt,
# dim_batch 64: 4.3e12 FLOP in 233 s against a measured 4.1e10 FLOP/s, load average 6.5; docs/commands/fit-lens.md).
FIT_EFFICIENCY = 0.5
Sums = tuple[dict[int, Any], int, int]  # (float64 sums of J per block, prompts fitted, prompts skipped)


@dataclass(frozen=True)
class JacobianFit:
    """A fitted Jacobian lens as written to ``out``: ``n_prompts`` used, ``skipped`` (too short), per source
    block ``identity_distance`` ``‖J_l − I‖_F / √d`` and ``norms`` ``‖J_l‖_F``, and the settings."""

    out: str
    n_prompts: int
    skipped: int
    source_layers: tuple[int, ...]
    target_layer: int
    d_model: int
    dim_batch: int
    skip_first: int
    max_seq_len: int
    dtype: str
    tokens: int
    flops: float
    identity_distance: tuple[float, ...]
    norms: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "n_prompts": self.n_prompts, "skipped": self.skipped,
                "source_layers": list(self.source_layers), "target_layer": self.target_layer,
                "d_model": self.d_model, "dim_batch": self.dim_batch, "skip_first": self.skip_first,
                "max_seq_len": self.max_seq_len, "dtype": self.dtype, "tokens": self.tokens, "flops": self.flops,
                "blocks": [{"block": b, "identity_distance": i, "frobenius": n}
                           for b, i, n in zip(self.source_layers, self.identity_distance, self.norms)]}


def run(lm: Any, encoded: list[Encoded], opts: Any, plan: Any) -> JacobianFit:
    """Fits, writes ``opts.out`` (atomically) and returns the summary. ``lm``: the LoadedModel; with ``opts.ray``
    the OpenedModel (the workers load the weights). Raises UsageError when no prompt is long enough."""
    import torch

    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.tasks._fit_files import digest

    ids, usable = fitted_prompts(encoded, opts)
    if opts.shard is not None:
        first, every = opts.shard
        notes.info(f"shard {first}/{every}: {len(ids)} of {len(encoded)} prompts (every {every}th from {first})")
    flops = _announce(lm, usable, opts, plan)
    if opts.ray:
        from anatomy_cli.tasks import _jacobian_ray

        sums, done, skipped = _jacobian_ray.fit_on_ray(lm, ids, opts, plan, settings_of(lm, ids, opts, plan))
    else:
        sums, done, skipped = _fit_here(lm, ids, opts, plan)
    if skipped:
        notes.warn(f"{skipped} prompt{'' if skipped == 1 else 's'} skipped: fewer than skip_first + 2 = "
                   f"{opts.skip_first + 2} tokens")
    d_model = lm.info.d_model
    state = jacobian_fit.lens_state(sums, done, d_model, getattr(torch, DTYPES[opts.dtype]))
    state[HASHES] = [digest(i) for i in usable]  # fit-lens merge refuses fits that share a prompt
    atomic_save(state, opts.out)
    eye = torch.eye(d_model)
    mats = [state["J"][b].float() for b in plan.source_layers]  # type: ignore[index]
    return JacobianFit(
        out=str(opts.out), n_prompts=done, skipped=skipped, source_layers=plan.source_layers,
        target_layer=plan.target_layer, d_model=d_model, dim_batch=opts.dim_batch,
        skip_first=opts.skip_first, max_seq_len=opts.max_seq_len, dtype=opts.dtype,
        tokens=sum(map(len, usable)), flops=flops,
        identity_distance=tuple(float((m - eye).norm() / math.sqrt(d_model)) for m in mats),
        norms=tuple(float(m.norm()) for m in mats))


def fitted_prompts(encoded: list[Encoded], opts: Any) -> tuple[list[list[int]], list[list[int]]]:
    """``(ids, usable)``: each prompt's ids as the fit reads them (its first ``max_seq_len`` tokens; with
    ``--shard i/N`` prompts i, i + N, ... only), and those long enough to have a valid position (the ones fitted).
    Raises UsageError when none is: :func:`anatomy_cli.tasks.fit_lens.check` calls it before the weights load."""
    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.errors import UsageError

    ids = [list(e.ids[:opts.max_seq_len]) for e in encoded]
    if opts.shard is not None:
        ids = ids[opts.shard[0]::opts.shard[1]]
    usable = [i for i in ids if jacobian_fit.valid_positions(len(i), opts.skip_first)]
    if not usable:
        raise UsageError(f"no prompt is long enough to fit on: each needs at least {opts.skip_first + 2} tokens "
                         "(--skip-first)")
    return ids, usable


def _fit_here(lm: LoadedModel, ids: list[list[int]], opts: Any, plan: Any) -> Sums:
    """Prompt after prompt in this process; with ``opts.checkpoint`` the sums saved every
    ``opts.checkpoint_every`` prompts (and after the last), and resumed from (the prompts it holds skipped:
    :mod:`anatomy_cli.tasks._jacobian_checkpoint`)."""
    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.tasks import _jacobian_checkpoint as ckpt

    settings = settings_of(lm, ids, opts, plan)
    progress = ckpt.start(opts.checkpoint, settings, plan.source_layers, lm.info.d_model, len(ids))
    with notes.status("fit-lens jacobian") as line:
        for i, prompt_ids in enumerate(ids):
            if i in progress.done:
                continue
            fitted = jacobian_fit.accumulate(lm, progress.sums, prompt_ids, plan.source_layers, plan.target_layer,
                                             dim_batch=opts.dim_batch, skip_first=opts.skip_first,
                                             progress=line.counter(f"prompt {i + 1}/{len(ids)}", "backward passes"))
            progress.add(i, None, int(fitted), int(not fitted))
            if opts.checkpoint is not None and ckpt.due(progress, opts.checkpoint_every, len(ids)):
                ckpt.save(opts.checkpoint, progress, settings, len(ids))
    return progress.sums, progress.n_done, progress.skipped


def settings_of(lm: Any, ids: list[list[int]], opts: Any, plan: Any) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the model's shape, the blocks, the position rules, the prompts'
    tokens (a hash)."""
    from anatomy_cli.tasks._fit_files import digest

    return {"d_model": lm.info.d_model, "n_layers": lm.info.n_layers, "source_layers": list(plan.source_layers),
            "target_layer": plan.target_layer, "skip_first": opts.skip_first, "max_seq_len": opts.max_seq_len,
            "prompts": digest(ids)}


def _announce(lm: Any, usable: list[list[int]], opts: Any, plan: Any) -> float:
    """The cost line before the fit (FLOPs, time at a rate measured now on the fit's device); returns the FLOPs."""
    from anatomy_cli.models import cost
    from anatomy_cli.units import human_seconds

    info = lm.info
    flops = estimate(lm, usable, opts, plan)
    if opts.ray:
        device = "cuda" if opts.gpus_per_worker > 0 else "cpu"
        rate, how = cost.RATES[device], f"assumed for {device}"
        where = f"{device} (one worker; {opts.workers} share it)"
    else:
        rate, how, where = fit_rate(lm, usable, opts.dim_batch), "half a matrix product's rate, measured now", \
            lm.device.type
    notes.info(f"fit-lens jacobian: {len(usable)} prompt{'' if len(usable) == 1 else 's'}, "
               f"{sum(map(len, usable)):,} tokens, block{'s' if len(plan.source_layers) > 1 else ''} "
               f"{_blocks(plan.source_layers)} -> {plan.target_layer}, "
               f"{math.ceil(info.d_model / opts.dim_batch)} backward passes per prompt: about {flops:.2g} FLOP "
               f"at {rate / 1e9:.0f} GFLOP/s ({how}), roughly {human_seconds(flops / rate)} on {where} "
               "(a rough estimate)")
    return flops


def estimate(lm: Any, usable: list[list[int]], opts: Any, plan: Any) -> float:
    """The fit's FLOPs (:func:`anatomy_cli.models.cost.jacobian_fit_flops` per prompt), with the blocks' own
    weights where they are loaded (with ``--ray`` the driver has none: ~12 d_model² per block)."""
    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.models import cost

    weights = jacobian_fit.block_weights(lm) if hasattr(lm, "points") else None
    return sum(cost.jacobian_fit_flops(lm.info, len(i), opts.dim_batch, min(plan.source_layers), plan.target_layer,
                                       weights) for i in usable)


def fit_rate(lm: Any, usable: list[list[int]], dim_batch: int) -> float:
    """FLOP/s of a float32 product of the fit's shape on its device, measured now
    (:func:`anatomy_cli.engine.jacobian_fit.measured_rate`): the rows of one backward pass (``dim_batch`` copies
    of the longest prompt's tokens, at most 8192) times ``[d_model, 4 d_model]`` (an MLP's matrix), times
    :data:`FIT_EFFICIENCY`."""
    from anatomy_cli.engine.jacobian_fit import measured_rate

    tokens = max(map(len, usable), default=1)
    return FIT_EFFICIENCY * measured_rate(lm, rows=min(dim_batch * tokens, 8192))


def _blocks(blocks: tuple[int, ...]) -> str:
    if len(blocks) == 1:
        return str(blocks[0])
    return f"{blocks[0]}..{blocks[-1]}" if blocks == tuple(range(blocks[0], blocks[-1] + 1)) else ",".join(
        map(str, blocks))
