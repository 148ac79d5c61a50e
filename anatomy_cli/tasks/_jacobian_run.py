"""`fit-lens jacobian`: the fit (in this process, or with ``--ray`` on Ray workers,
:mod:`anatomy_cli.tasks._jacobian_ray`; either resumable from ``--checkpoint``,
:class:`anatomy_cli.engine.checkpoint.JacobianProgress`), the lens written in jlens' format, and its summary.

Either way the running sums of ``J`` are float64 (``{block: [d_model, d_model]}``) beside the count of prompts
fitted and skipped; the lens is their mean (:func:`anatomy_cli.engine.jacobian_fit.lens_state`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeAlias

from anatomy_cli.declare.commands import when_run
from anatomy_cli.engine import estimate as timing
from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.engine.checkpoint import atomic_save
from anatomy_cli.engine.checkpoint import digest
from anatomy_cli.engine.estimate import now
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models.lens_choice import LensChoice
from anatomy_cli.models.sites import block_spans
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._fit_files import DTYPES
from anatomy_cli.tasks._fit_files import HASHES
from anatomy_cli.tasks._fit_files import FitCosts
from anatomy_cli.tasks._fit_files import jacobian_progress
from anatomy_cli.tasks._fit_lens_options import FitLensOptions
from anatomy_cli.tasks._fit_lens_options import FitLensPlan
from anatomy_cli.units import counted

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.lens_check import LensCheck
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.estimate import Estimate
    from anatomy_cli.engine.opening import OpenedModel

PHASES = ("fitting", "writing and the held-out check")  # after the weights' load and the probes
# (float64 sums of J per block, prompts fitted, prompts skipped)
Sums: TypeAlias = "tuple[dict[int, torch.Tensor], int, int]"


@dataclass(frozen=True)
class JacobianFit(FitCosts):
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

    def to_dict(self) -> dict[str, object]:
        return {"out": self.out, "n_prompts": self.n_prompts, "skipped": self.skipped,
                "source_layers": list(self.source_layers), "target_layer": self.target_layer,
                "d_model": self.d_model, "dim_batch": self.dim_batch, "skip_first": self.skip_first,
                "max_seq_len": self.max_seq_len, "dtype": self.dtype, "tokens": self.tokens, "flops": self.flops,
                "blocks": [{"block": b, "identity_distance": i, "frobenius": n}
                           for b, i, n in zip(self.source_layers, self.identity_distance, self.norms)],
                **self.costs()}


def run(lm: Any, encoded: list[Encoded], opts: FitLensOptions,
        plan: FitLensPlan) -> JacobianFit:
    """Fits, writes ``opts.out`` (atomically) and returns the summary. ``lm``: the LoadedModel; with ``opts.ray``
    the OpenedModel (the workers load the weights). Raises UsageError when no prompt is long enough."""
    import torch

    from anatomy_cli.engine import jacobian_fit

    ids, usable = fitted_prompts(encoded, opts)
    if opts.shard is not None:
        first, every = opts.shard
        notes.info(f"shard {first}/{every}: {len(ids)} of {len(encoded)} prompts (every {every}th from {first})")
    flops, est = _announce(lm, usable, opts, plan)
    timings = est.timings()
    with timings.phase(PHASES[0]):
        if opts.ray:
            _jacobian_ray = when_run("tasks._jacobian_ray")

            sums, done, skipped = _jacobian_ray.fit_on_ray(lm, ids, opts, plan, settings_of(lm, ids, opts, plan))
        else:
            sums, done, skipped = _fit_here(lm, ids, opts, plan)
    if skipped:
        notes.warn(f"{counted(skipped, 'prompt')} skipped: fewer than skip_first + 2 = "
                   f"{opts.skip_first + 2} tokens")
    d_model = lm.info.d_model
    state = jacobian_fit.lens_state(sums, done, d_model, getattr(torch, DTYPES[opts.dtype]))
    state[HASHES] = [digest(i) for i in usable]  # fit-lens merge refuses fits that share a prompt
    assert opts.out is not None  # the options' check: a fit names its --out
    with timings.phase(PHASES[1]):
        atomic_save(state, opts.out)
        check = None if opts.ray else _check(lm, opts)
    eye = torch.eye(d_model)
    mats = [state["J"][b].float() for b in plan.source_layers]  # type: ignore[index]
    return JacobianFit(
        out=str(opts.out), n_prompts=done, skipped=skipped, source_layers=plan.source_layers,
        target_layer=plan.target_layer, d_model=d_model, dim_batch=opts.dim_batch,
        skip_first=opts.skip_first, max_seq_len=opts.max_seq_len, dtype=opts.dtype,
        tokens=sum(map(len, usable)), flops=flops,
        identity_distance=tuple(float((m - eye).norm() / math.sqrt(d_model)) for m in mats),
        norms=tuple(float(m.norm()) for m in mats), estimate=est.to_dict(), timings=timings.to_dict(),
        check=None if check is None else check.to_dict())


def _check(lm: LoadedModel, opts: FitLensOptions) -> LensCheck:
    """The written lens, read back as ``lens --lens jacobian:FILE`` reads it, on the held-out paragraph."""
    from anatomy_cli.engine.fitted_lens import open_lens
    fit_check = when_run("tasks._lens_check").fit_check

    lens = open_lens(LensChoice("jacobian", opts.out), d_model=lm.info.d_model, n_layers=lm.info.n_layers)
    assert lens is not None  # a jacobian choice with a path opens a lens
    return fit_check(lm, lens, f"the Jacobian lens {opts.out}")


def fitted_prompts(encoded: list[Encoded], opts: FitLensOptions) -> tuple[list[list[int]], list[list[int]]]:
    """``(ids, usable)``: each prompt's ids as the fit reads them (its first ``max_seq_len`` tokens; with
    ``--shard i/N`` prompts i, i + N, ... only), and those long enough to have a valid position (the ones fitted).
    Raises UsageError when none is: :func:`anatomy_cli.tasks.fit_lens.check` calls it before the weights load."""
    from anatomy_cli.engine import jacobian_fit

    ids = [list(e.ids[:opts.max_seq_len]) for e in encoded]
    if opts.shard is not None:
        ids = ids[opts.shard[0]::opts.shard[1]]
    usable = [i for i in ids if jacobian_fit.valid_positions(len(i), opts.skip_first)]
    if not usable:
        raise UsageError(f"no prompt is long enough to fit on: each needs at least {opts.skip_first + 2} tokens "
                         "(--skip-first)")
    return ids, usable


def _fit_here(lm: LoadedModel, ids: list[list[int]], opts: FitLensOptions, plan: FitLensPlan) -> Sums:
    """Prompt after prompt in this process; with ``opts.checkpoint`` the sums saved every
    ``opts.checkpoint_every`` prompts (and after the last), and resumed from (the prompts it holds skipped:
    :class:`anatomy_cli.engine.checkpoint.JacobianProgress`)."""
    from anatomy_cli.engine import jacobian_fit

    saved = None if opts.checkpoint is None else Checkpoint(opts.checkpoint, settings_of(lm, ids, opts, plan),
                                                           opts.checkpoint_every)
    progress = jacobian_progress(saved, plan.source_layers, lm.info.d_model, len(ids))
    with notes.status("fit-lens jacobian") as line:
        for i, prompt_ids in enumerate(ids):
            if i in progress.done:
                continue
            fitted = jacobian_fit.accumulate(lm, progress.sums, prompt_ids, plan.source_layers, plan.target_layer,
                                             dim_batch=opts.dim_batch, skip_first=opts.skip_first,
                                             progress=line.counter(f"prompt {i + 1}/{len(ids)}", "backward passes"))
            progress.add(i, None, int(fitted), int(not fitted))
            if saved is not None:
                progress.save_when_due(saved, len(ids))
    return progress.sums, progress.n_done, progress.skipped


def settings_of(lm: LoadedModel | OpenedModel, ids: list[list[int]], opts: FitLensOptions,
                plan: FitLensPlan) -> dict[str, object]:
    """What a checkpoint must match to be resumed: the model's shape, the blocks, the position rules, the prompts'
    tokens (a hash)."""

    return {"d_model": lm.info.d_model, "n_layers": lm.info.n_layers, "source_layers": list(plan.source_layers),
            "target_layer": plan.target_layer, "skip_first": opts.skip_first, "max_seq_len": opts.max_seq_len,
            "prompts": digest(ids)}


def _announce(lm: Any, usable: list[list[int]], opts: FitLensOptions,
              plan: FitLensPlan) -> tuple[float, Estimate]:
    """The cost line before the fit: FLOPs, and the time of every phase (:mod:`anatomy_cli.engine.estimate`):
    the weights' load as measured; the fit from a probe of its own code now (the first prompt's forward and two
    backward passes, :func:`probe_prompt`), scaled by each prompt's tokens; the held-out check from its probe.
    With ``--ray`` the driver has no weights: the fit at the assumed rate of ``cost.RATES``, no check. Returns
    the FLOPs and the Estimate."""
    _lens_check = when_run("tasks._lens_check")

    info = lm.info
    flops = estimate(lm, usable, opts, plan)
    passes = math.ceil(info.d_model / opts.dim_batch)
    begun = timing.now()
    if opts.ray:
        device = "cuda" if opts.gpus_per_worker > 0 else "cpu"
        fitting = timing.Phase(PHASES[0], flops / cost.RATES[device])
        checking = timing.Phase(PHASES[1], 0.0)
        where = f"{device} (one worker; {opts.workers} share it; at an assumed {cost.RATES[device]:.0e} FLOP/s)"
    else:
        forward, per_pass = probe_prompt(lm, usable[0], opts, plan) if usable else (0.0, 0.0)
        fitting = timing.scaled(PHASES[0], forward + passes * per_pass, len(usable[0]) if usable else 1,
                                sum(map(len, usable)))
        rows = (*(b + 1 for b in plan.source_layers), info.n_layers)
        checking = timing.Phase(PHASES[1], _lens_check.probe_seconds(lm, rows))
        where = lm.device.type
    est = timing.Estimate((timing.load_phase(lm), timing.probes_phase(begun), fitting, checking))
    notes.info(f"fit-lens jacobian: {counted(len(usable), 'prompt')}, {sum(map(len, usable)):,} tokens, "
               f"{block_spans(plan.source_layers)} -> {plan.target_layer}, {passes:,} backward passes per prompt: "
               f"about {flops:.2g} FLOP; {est.describe()} on {where}")
    return flops, est


def estimate(lm: Any, usable: list[list[int]], opts: FitLensOptions, plan: FitLensPlan) -> float:
    """The fit's FLOPs (:func:`anatomy_cli.models.cost.jacobian_fit_flops` per prompt), with the blocks' own
    weights where they are loaded (with ``--ray`` the driver has none: ~12 d_model² per block)."""
    from anatomy_cli.engine import jacobian_fit

    weights = jacobian_fit.block_weights(lm) if hasattr(lm, "points") else None
    return sum(cost.jacobian_fit_flops(lm.info, len(i), opts.dim_batch, min(plan.source_layers), plan.target_layer,
                                       weights) for i in usable)


class _Enough(Exception):
    """Ends a probe after the passes it times."""


def probe_prompt(lm: LoadedModel, ids: list[int], opts: FitLensOptions, plan: FitLensPlan,
                 passes: int = 2) -> tuple[float, float]:
    """``(forward seconds, seconds per backward pass)`` of the fit's own per-prompt code
    (:func:`anatomy_cli.engine.jacobian_fit.jacobian_for_prompt`) on ``ids``, timed now: its forward and its
    first ``passes + 1`` backward passes (the first pass's time is read as the later ones', the rest is the
    forward's)."""
    from anatomy_cli.engine import jacobian_fit

    stamps: list[float] = []

    def tick(done: int, total: int) -> None:
        stamps.append(now())
        if len(stamps) > passes:
            raise _Enough

    start = now()
    try:
        jacobian_fit.jacobian_for_prompt(lm, ids, plan.source_layers, plan.target_layer, dim_batch=opts.dim_batch,
                                         skip_first=opts.skip_first, progress=tick)
    except _Enough:
        pass
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    per_pass = sorted(gaps)[len(gaps) // 2] if gaps else stamps[0] - start
    return max(stamps[0] - start - per_pass, 0.0), per_pass
