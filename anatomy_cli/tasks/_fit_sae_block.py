"""`fit-sae`, one block: train its SAE (or transcoder) on the collected activations from ``--seed``, write it in
sparsify's format, read it back as ``anatomy sae`` reads it and splice it into the held-out window."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models.sae import fit_report
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.sae import Health
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.estimate import Timings
    from anatomy_cli.engine.sae import CleanRun

DEAD_HIGH = 0.5  # a dead fraction over this is warned


@dataclass(frozen=True)
class BlockPlan:
    layer: int
    points: tuple[str, str]  # the input and the target hook points (an SAE's: one point twice)
    folder: Path


@dataclass(frozen=True)
class BlockFit:
    """One block's SAE: where it was written, its training curve's first and last FVU (the mean of the last 10
    steps), the dead fraction (latents that never fired in the last epoch), its health on the held-out window,
    the seconds its training, writing and read-back took, and its warnings."""

    layer: int
    folder: str
    site: str
    site_out: str
    d_in: int
    d_sae: int
    steps: int
    fvu_first: float
    fvu_last: float
    dead_fraction: float
    seconds: float
    health: dict[str, Any]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "warnings": list(self.warnings)}


def block_warnings(dead: float, what: str, *, health: Health | None = None, fve: float | None = None,
                   positions: int = 0) -> list[str]:
    """A fitted block's warnings on the held-out window: the one rule of fit-sae's rows, per layer and ``--clt``.
    Its health's (analyses/sae.py ``warnings``: a per-layer block's own splice, so its scale, L0 and KL, and its FVE),
    or, without a ``health`` (a cross-layer transcoder's block, whose spliced CE and KL are every block's at once), its
    ``fve`` over ``positions`` alone (``fve_warnings``, the same FVE rule); then ``dead``, the fraction of its ``what``
    (latents, features) that never fired in the last epoch, over :data:`DEAD_HIGH`."""
    from anatomy_cli.analyses import sae as analysis

    text = "held-out window"
    out = (analysis.fve_warnings(fve, positions, text) if health is None else
           analysis.warnings(health, n_tokens=len(health.l0), context_size=None, sae_bos=None, prompt_bos=None,
                             centred=False, centred_now=0.0, text=text))
    if dead > DEAD_HIGH:
        out.append(f"{dead:.0%} of the {what} never fired in the last epoch (over {DEAD_HIGH:.0%}): train on more "
                   "tokens, or give a smaller --d-sae")
    return out


def clean_run(lm: LoadedModel, blocks: Sequence[BlockPlan], held_out: Sequence[int]) -> CleanRun:
    """The held-out window's unmodified forward, reading every block's sites, once for all their splices (the
    per-block splice ran it again for each block: issue 62)."""
    from anatomy_cli.engine import sae as engine_sae

    return engine_sae.clean_run(lm, held_out, [p for b in blocks for p in b.points])


def fit_block(lm: LoadedModel, block: BlockPlan, x: torch.Tensor, target: torch.Tensor,
              windows: Sequence[Sequence[int]], *, label: str, transcoder: bool, d_sae: int, k: int, epochs: int,
              batch_size: int, lr: float, seed: int, timings: Timings, phases: tuple[str, str],
              jumprelu: dict[str, float] | None = None, model_name: str = "",
              clean: CleanRun | None = None) -> tuple[BlockFit, str]:
    """``block``'s fit from its input ``x`` and ``target`` (``[rows, d]``, the rows of every window of
    ``windows``, the last one held out); the seed rule is the run's: the coder is made and the rows shuffled from
    ``seed`` whatever the other blocks, so a block's files equal those of a run of that block alone. Returns the
    fit and the trainer's name (``sparsify`` or ``anatomy``); the warnings are the fit's (the run says them:
    ``fit_sae.fit_notes``).
    ``timings`` (:class:`anatomy_cli.engine.estimate.Timings`) records the training and the writing with the
    held-out check as ``phases``. ``jumprelu`` (its ``bandwidth``, ``l0_coeff``): a JumpReLU coder, written in
    SAELens' format, else a TopK one in sparsify's; either config's ``model_name`` is ``model_name``
    (:func:`anatomy_cli.models.resolve.recorded`: what ``features`` opens when no ``--model`` is given), its
    ``context_size`` the windows' length (``--ctx``: what ``features`` reads when no ``--ctx`` is given), and
    either names its hook point (``hook_name``: a renamed folder keeps it). ``clean``: the held-out window's
    unmodified forward, run once for every block (:func:`clean_run`)."""
    import torch

    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine import sae_fit
    from anatomy_cli.models.sae import read

    start = time.perf_counter()
    n_train = sae_fit.rows(windows[:-1])
    with torch.random.fork_rng(devices=[]):  # the caller's (or a server's) global RNG is left as it was
        torch.manual_seed(seed)
        coder = sae_fit.make_coder(x.shape[1], d_sae, k, transcode=transcoder, jumprelu=jumprelu)
    with timings.phase(phases[0]), notes.status(f"fit-sae: training {label}") as line:
        trained = sae_fit.train(x[:n_train], target[:n_train], coder, epochs=epochs, batch=batch_size, lr=lr,
                                seed=seed, progress=line.counter(f"training {label}", "steps"))
    with timings.phase(phases[1]):
        if jumprelu is None:
            sae_fit.save_sparsify(coder, block.folder, model_name=model_name, context_size=len(windows[0]),
                                  hook_name=block.folder.name,  # sparsify's hook point: the folder's name
                                  skipped_positions=sae_fit.SKIPPED)
        else:
            sae_fit.save_saelens(coder, block.folder, hook=block.points[0], hook_out=block.points[1],
                                 model_name=model_name, context_size=len(windows[0]),
                                 skipped_positions=sae_fit.SKIPPED)
        sae_file = read.read(block.folder)
        held_out = list(windows[-1])
        splice = engine_sae.splice_run(lm, held_out, engine_sae.Dictionary(sae_file, lm.device),
                                       skip=sae_fit.SKIPPED,  # the positions the rows leave out: as the model has them
                                       clean=clean)
    health = analysis.health(splice, held_out[sae_fit.SKIPPED:], sae_file.stated_l0)
    dead = 1.0 - float(trained["fired"].float().mean())
    warnings = block_warnings(dead, "latents", health=health)
    curve = trained["fvu"]
    fit = BlockFit(layer=block.layer, folder=str(block.folder), site=sae_file.site, site_out=sae_file.site_out,
                   d_in=sae_file.d_in, d_sae=sae_file.d_sae, steps=trained["steps"], fvu_first=curve[0],
                   fvu_last=sum(curve[-10:]) / len(curve[-10:]), dead_fraction=dead,
                   seconds=time.perf_counter() - start, health=health.to_dict(), warnings=tuple(warnings))
    measured = ("seconds", "folder")  # left out: a block's files are the same whatever the run's --out and speed
    fit_report.write(block.folder, {**{k: v for k, v in fit.to_dict().items() if k not in measured},
                                    "held_out_tokens": len(held_out)})  # features reads it
    return fit, "anatomy" if isinstance(coder, sae_fit.TopKCoder) else "sparsify"
