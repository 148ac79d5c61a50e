"""`fit-sae --clt`: one cross-layer transcoder over every block (engine/clt_fit.py), trained on the activations the
per-layer fit collects in its one pass (each block's MLP input and output), written in circuit-tracer's
``cross_layer_transcoder`` layout into ``--out`` with per-feature JumpReLU thresholds, and read on the held-out
window: per block the FVU as trained (TopK) and as written (the thresholds), and the written L0; and the
next-token CE/KL with every block's MLP output spliced with the CLT's reconstruction, as the per-layer fit reports
one block's. ``--activation jumprelu``: the thresholds are trained (engine/jumprelu.py) and written as they are.

``--checkpoint FILE``: the training's state every ``--checkpoint-every`` steps; a run with the same settings and
tokens goes on from it (a resumed fit equals an uninterrupted one)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.engine import estimate as timing
from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.engine.checkpoint import digest
from anatomy_cli.models.resolve import recorded
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import hook_name
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._fit_sae_block import BlockFit
from anatomy_cli.tasks._fit_sae_block import block_warnings
from anatomy_cli.tasks._fit_sae_options import FitSaeOptions
from anatomy_cli.tasks._fit_sae_options import FitSaePlan

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from anatomy_cli.engine import LoadedModel


THRESHOLDS = ("per feature, the JumpReLU threshold that fires on as many training rows as the TopK did (halfway "
              "between its n-th and (n+1)-th largest pre-activation there, n its TopK count; at least 0)")

LEARNT = "per feature, the JumpReLU threshold as trained (the straight-through estimator, --bandwidth, --l0-coeff)"


def probe(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan, batch: int) -> tuple[float, int, int, float]:
    """The CLT's training part of fit-sae's estimate (``tasks.fit_sae.estimate``): the seconds of one training
    step (a probe of a few steps of a coder of this size), one coder trained, the held-out check's forwards of the
    held-out window (two: clean and spliced), and the bytes of the coder's parameters with their gradients and
    Adam's two moments (16 bytes each)."""
    from anatomy_cli.engine import clt_fit

    d, n = lm.info.d_model, len(plan.blocks)
    step = clt_fit.probe_step_seconds(n, d, plan.d_sae, opts.k, batch=batch, jumprelu=opts.jumprelu)
    return step, 1, 2, 16.0 * clt_fit.parameter_count(n, d, plan.d_sae)


THRESHOLD_PROBE_ROWS = 1024  # the rows the thresholds' probe orders (the fit's: all its training rows)


def writing(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan) -> tuple[timing.Phase, timing.Phase]:
    """The CLT's writing beside its held-out forwards (issue 62: a 30-block CLT's phase took 152 s where the
    forward alone was counted, 1.6 s): the thresholds (a probe of one block over up to
    :data:`THRESHOLD_PROBE_ROWS` rows, scaled by the blocks and the training rows) and the files with the
    held-out reconstructions (a probe of a 2-block coder written and read, scaled by the parameters)."""
    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine import sae_fit

    d, n = lm.info.d_model, len(plan.blocks)
    rows = sae_fit.rows(plan.windows[:-1])
    probed = min(rows, THRESHOLD_PROBE_ROWS)
    chosen = 0.0 if opts.jumprelu is not None else clt_fit.probe_thresholds_seconds(d, plan.d_sae, opts.k, probed)
    with tempfile.TemporaryDirectory(prefix="anatomy-clt-probe.") as tmp:
        files = clt_fit.probe_writing_seconds(d, plan.d_sae, opts.k, max(sae_fit.rows(plan.windows[-1:]), 1),
                                              Path(tmp) / "clt")
    return (timing.scaled("thresholds", chosen, probed, n * rows),
            timing.scaled("files", files, clt_fit.parameter_count(clt_fit.PROBE_BLOCKS, d, plan.d_sae),
                          clt_fit.parameter_count(n, d, plan.d_sae)))


def stacked(acts: dict[str, torch.Tensor], plan: FitSaePlan) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L, rows, d]`` of every block's MLP input and of its output, each block's tensor copied into its place and
    freed as it goes (a ``torch.stack`` of them held both copies of one side at once)."""
    import torch

    def joined(side: int) -> torch.Tensor:
        first = acts[plan.blocks[0].points[side]]
        out = torch.empty(len(plan.blocks), *first.shape, dtype=first.dtype)
        for j, block in enumerate(plan.blocks):
            out[j] = acts.pop(block.points[side])
        return out

    return joined(0), joined(1)


def fit_clt(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan, acts: dict[str, torch.Tensor], *,
            timings: Any, phases: tuple[str, str], start: float) -> dict[str, Any]:
    """Train (resuming from ``--checkpoint``) under ``phases[0]``, choose the thresholds, write, and read the
    held-out window under ``phases[1]``: the fields of fit_sae's ``SaeFit`` that differ from the per-layer fits'
    (``trainer``, ``lr``, ``blocks``, ``clt``)."""
    import torch

    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine import sae_fit

    xs, targets = stacked(acts, plan)
    n_train = sae_fit.rows(plan.windows[:-1])
    lr = opts.lr or sae_fit.default_lr(plan.d_sae, scaled=True, cross_layer=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(opts.seed)
        coder = clt_fit.CrossLayerCoder(len(plan.blocks), xs.shape[-1], plan.d_sae, opts.k, jumprelu=opts.jumprelu)
    state, keep = checkpointing(opts, plan, clt_fit.settings_of(
        coder, rows=n_train, epochs=opts.epochs, batch=opts.batch_size, lr=lr, seed=opts.seed, data=""))
    with timings.phase(phases[0]), notes.status("fit-sae: training the cross-layer transcoder") as line:
        trained = clt_fit.train(xs[:, :n_train], targets[:, :n_train], coder, epochs=opts.epochs,
                                batch=opts.batch_size, lr=lr, seed=opts.seed, state=state,
                                every=opts.checkpoint_every, keep=keep,
                                progress=line.counter("training the cross-layer transcoder", "steps"))
    with timings.phase(phases[1]):
        theta = clt_fit.thresholds(coder, xs[:, :n_train])
        clt_fit.save(coder, theta, opts.out, scan=f"anatomy-clt-{opts.out.name}",
                     model_name=recorded(lm.name), context_size=len(plan.windows[0]),
                     skipped_positions=sae_fit.SKIPPED)
        held = clt_fit.held_out(coder, xs[:, n_train:], targets[:, n_train:], theta)
        spliced = splice_figures(lm, plan, coder, theta)
    curve = trained["fvu"]
    return {"trainer": "anatomy (cross-layer)" if opts.jumprelu is None else "anatomy (cross-layer, JumpReLU)",
            "lr": lr,
            "blocks": block_fits(opts, plan, trained, held, xs.shape[-1], seconds=time.perf_counter() - start,
                                 spliced=spliced),
            "clt": {"thresholds": THRESHOLDS if opts.jumprelu is None else LEARNT, "loss_first": curve[0],
                    "loss_last": sum(curve[-10:]) / len(curve[-10:]),
                    "resumed_at_step": 0 if state is None else len(state["curve"]),
                    "parameters": clt_fit.parameter_count(len(plan.blocks), xs.shape[-1], plan.d_sae)}}


def splice_figures(lm: LoadedModel, plan: FitSaePlan, coder: Any, theta: torch.Tensor) -> dict[str, float | None]:
    """The held-out window's next-token CE, clean and with every block's MLP output spliced with the written
    CLT's reconstruction (:func:`anatomy_cli.engine.clt_fit.spliced_logits`), and the spliced KL, in nats: the
    per-layer fit's figures (analyses/sae.py), here for all blocks at once; positions 1.. as the per-layer fit's
    (``sae_fit.SKIPPED``)."""
    from anatomy_cli.analyses.sae import next_token_ce
    from anatomy_cli.analyses.sae import next_token_kl
    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine.sae_fit import SKIPPED

    ids = list(plan.windows[-1])
    clean, spliced = clt_fit.spliced_logits(lm, ids, coder, theta, [b.points for b in plan.blocks], skip=SKIPPED)
    ids = ids[SKIPPED:]
    return {"ce_clean_nats": next_token_ce(clean, ids), "ce_spliced_nats": next_token_ce(spliced, ids),
            "kl_spliced_nats": next_token_kl(clean, spliced)}


def checkpointing(opts: FitSaeOptions, plan: FitSaePlan, settings: dict[str, Any]
                  ) -> tuple[dict[str, Any] | None, Callable[[dict[str, Any]], None] | None]:
    """(the checkpoint to go on from or None, the function that writes one or None) for ``--checkpoint``
    (engine/checkpoint.py); the settings carry a digest of the windows' token ids, so a checkpoint of other tokens
    is refused."""

    if opts.checkpoint is None:
        return None, None
    ckpt = Checkpoint(opts.checkpoint, {**settings, "data": digest(plan.windows)}, command="fit-sae --clt")
    state = ckpt.load()
    if state is not None:
        notes.info(f"fit-sae: resuming from {ckpt.path} at step {len(state['curve'])}")
    return state, ckpt.save


def block_fits(opts: FitSaeOptions, plan: FitSaePlan, trained: dict[str, Any], held: list[dict[str, float]],
               d: int, *, seconds: float, spliced: dict[str, float | None]) -> tuple[BlockFit, ...]:
    """One row per block: the summed loss's curve over the blocks (its mean per block, the same in every row), the
    block's dead fraction, its held-out FVE as written (thresholds) and as trained (TopK), and the written L0;
    the spliced CE/KL (``spliced``: every block spliced at once, the same in every row); its warnings, by the per-layer
    fit's rule (``_fit_sae_block.block_warnings``: its held-out FVE, its features that never fired; the spliced KL is
    every block's, so no block's own), which the run says (``fit_sae.fit_notes``)."""
    from anatomy_cli.engine import sae_fit

    fired, curve, n = trained["fired"], trained["fvu"], len(plan.blocks)
    positions = sae_fit.rows(plan.windows[-1:])  # the held-out rows every block's FVE is over
    out = []
    for i, block in enumerate(plan.blocks):
        dead = 1.0 - float(fired[i].float().mean())
        health = {"l0_mean": held[i]["l0_mean"], "fve": 1.0 - held[i]["fvu"], "fve_topk": 1.0 - held[i]["fvu_topk"],
                  "error_ratio": None, "norm_ratio": None, **spliced}
        warnings = block_warnings(dead, "features", fve=health["fve"], positions=positions)
        out.append(BlockFit(layer=block.layer, folder=str(opts.out), site=hook_name(block.layer, Site.mlp_in),
                            site_out=hook_name(block.layer, Site.mlp_out), d_in=d, d_sae=plan.d_sae,
                            steps=trained["steps"], fvu_first=curve[0] / n,
                            fvu_last=sum(curve[-10:]) / len(curve[-10:]) / n,
                            dead_fraction=dead, seconds=seconds, health=health, warnings=tuple(warnings)))
    return tuple(out)
