"""`fit-lens tuned`: fit a tuned lens on a corpus and write it in tuned-lens' format (the task's tuned half).

The recipe is tuned-lens' (:mod:`anatomy_cli.engine.tuned_fit`). The corpus is read through anatomy's corpus
sources (a text file, a directory of .txt/.md, ``-``, a .jsonl/.csv/.parquet column) and cut as tuned-lens'
``chunk_and_tokenize`` does: one token stream that starts with the EOS token, each document followed by EOS,
windows of ``ctx`` tokens (default min(TUNED_CTX, the model's context): tuned-lens' ``max_length``), the first
``tokens`` tokens only. The windows are shuffled (``torch.randperm`` seeded ``seed``) and split into ``steps``
steps (tuned-lens' ``num_steps``, default 250) of as equal a number of windows as can be (at least one each: fewer
windows than steps means fewer steps). Its options (``corpus``, ``column``, ``tokens``, ``ctx``, ``steps``,
``seed``: :data:`~anatomy_cli.tasks._fit_lens_options.TUNED_ONLY`) are fields of
:class:`~anatomy_cli.tasks._fit_lens_options.FitLensOptions`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.corpus.sources import open_source
from anatomy_cli.corpus.windows import token_stream
from anatomy_cli.corpus.windows import windows
from anatomy_cli.engine import estimate as timing
from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.engine.checkpoint import digest
from anatomy_cli.engine.estimate import Phase
from anatomy_cli.engine.estimate import now
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.models.lens_choice import LensChoice
from anatomy_cli.tasks import _lens_check
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._fit_files import FitCosts
from anatomy_cli.tasks._fit_lens_options import TUNED_CTX
from anatomy_cli.tasks._fit_lens_options import FitLensOptions
from anatomy_cli.tasks._lens_check import fit_check
from anatomy_cli.units import counted
from anatomy_cli.units import human_bytes

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.lens_check import LensCheck
    from anatomy_cli.corpus.sources import Source
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.estimate import Estimate
    from anatomy_cli.engine.estimate import Phase
    from anatomy_cli.tasks.protocol import Opened

PHASES = ("reading the corpus", "training", "writing and the held-out check")  # with the weights' load and probes
PROBE_TOKENS = 64  # the training probe's window: the first window's first tokens, scaled to every token


@dataclass(frozen=True)
class TunedPlan:
    ctx: int
    source: Source


def check(opened: Opened, opts: FitLensOptions) -> TunedPlan:
    """A decoder with an LM head, ``ctx`` within its context, the corpus opened (a directory without text files is
    refused here), all before the weights load."""

    info = opened.info
    require(info, Need.decoder, Need.lm_head, command="fit-lens tuned")
    ctx = info.window(opts.ctx, TUNED_CTX, opened.name)
    assert opts.corpus is not None  # validate()
    return TunedPlan(ctx, open_source(opts.corpus, column=opts.column))


@dataclass(frozen=True)
class TunedFit(FitCosts):
    """A fitted tuned lens as written to ``out``: the windows and tokens trained on, the steps, and per translator
    (``reads``: the residual row, ``embed`` or a block) the mean KL(final ‖ lens) in nats over the first step's
    windows (the zero lens: the logit lens) and over the last step's (before its update)."""

    out: str
    corpus: str
    windows: int
    tokens: int
    ctx: int
    steps: int
    seed: int
    lr: float
    flops: float
    memory_bytes: float
    reads: tuple[str | int, ...]
    kl_first: tuple[float, ...]
    kl_last: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "corpus": self.corpus, "windows": self.windows, "tokens": self.tokens,
                "ctx": self.ctx, "steps": self.steps, "seed": self.seed, "lr": self.lr, "flops": self.flops,
                "memory_bytes": self.memory_bytes,
                "translators": [{"translator": i, "reads": r, "kl_first": a, "kl_last": b}
                                for i, (r, a, b) in enumerate(zip(self.reads, self.kl_first, self.kl_last))],
                **self.costs()}


def windows_of(lm: LoadedModel, source: Source, ctx: int, tokens: int) -> list[tuple[int, ...]]:
    """The corpus as tuned-lens chunks it (the module docstring), the first ``tokens`` tokens."""

    hf = lm.tokenizer.hf
    eos = hf.eos_token_id
    stream = token_stream(source.pieces(), hf, eos=eos)
    return list(windows(itertools.chain([[eos]] if eos is not None else [], stream), ctx=ctx, max_tokens=tokens))


def run(lm: LoadedModel, opts: FitLensOptions, plan: TunedPlan) -> TunedFit:
    """Fits, writes ``opts.out`` (config.json + params.pt) and returns the summary. With ``opts.checkpoint`` the
    translators, the optimizer's and the schedule's state, the step and the KLs so far are saved every
    ``opts.checkpoint_every`` steps (and after the last), and resumed from: the same windows in the same order
    (the seed), so a resumed fit is the uninterrupted one."""
    import torch

    from anatomy_cli.engine import tuned_fit
    from anatomy_cli.engine.fitted_lens import unembed_hash

    assert opts.tokens is not None
    begun = now()
    try:
        wins = windows_of(lm, plan.source, plan.ctx, opts.tokens)
    finally:
        if opts.corpus == "-":
            plan.source.path.unlink(missing_ok=True)
    reading = Phase(PHASES[0], now() - begun, done=True)
    if not wins:
        raise UsageError(f"--corpus {opts.corpus} has no text to train on")
    n, used = len(wins), sum(map(len, wins))
    if used < opts.tokens:
        notes.info(f"the corpus has {used:,} tokens, fewer than --tokens {opts.tokens:,}: training on all of them")
    steps = min(opts.steps, n)
    if steps < opts.steps:
        notes.info(f"{counted(n, 'window')} of up to {plan.ctx:,} tokens: {counted(steps, 'step')}, not {opts.steps:,} "
                   "(one window per step at least)")
    flops, memory, est = _announce(lm, wins, steps, plan.ctx, reading)
    timings = est.timings()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(opts.seed)).tolist()
    lens = tuned_fit.translators(lm.info.d_model, lm.n_layers, lm.device)
    opt, scheduler = tuned_fit.optimizer(lens, steps)
    head = lm.model.get_output_embeddings()
    config = tuned_fit.config(lm, unembed_hash(head.weight))
    settings = {"d_model": lm.info.d_model, "n_layers": lm.n_layers, "unembed_hash": config["unembed_hash"],
                "ctx": plan.ctx, "steps": steps, "seed": opts.seed, "windows": digest(wins)}
    with timings.phase(PHASES[1]):
        first, last = _train(lm, lens, (opt, scheduler), wins, order, steps, opts, settings)
    assert opts.out is not None
    with timings.phase(PHASES[2]):
        tuned_fit.save(lens, Path(opts.out), config)
        check = _check(lm, opts)
    return TunedFit(out=str(opts.out), corpus=opts.corpus or "", windows=n, tokens=used, ctx=plan.ctx, steps=steps,
                    seed=opts.seed, lr=tuned_fit.LR_SCALE * (1 - tuned_fit.MOMENTUM), flops=flops,
                    memory_bytes=memory, reads=tuple(sites.residual_label(i) for i in range(lm.n_layers)),
                    kl_first=tuple(first), kl_last=tuple(last), estimate=est.to_dict(), timings=timings.to_dict(),
                    check=check.to_dict())


def _check(lm: LoadedModel, opts: FitLensOptions) -> LensCheck:
    """The written lens, read back as ``lens --lens tuned:DIR`` reads it, on the held-out paragraph."""
    from anatomy_cli.engine.fitted_lens import open_lens

    assert opts.out is not None  # the options' check: a fit names its --out
    lens = open_lens(LensChoice("tuned", Path(opts.out)), d_model=lm.info.d_model, n_layers=lm.n_layers)
    assert lens is not None  # a tuned choice with a path opens a lens
    return fit_check(lm, lens, f"the tuned lens {opts.out}")


def _train(lm: LoadedModel, lens: torch.nn.ModuleList, optim: tuple[torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR],
           wins: list[tuple[int, ...]], order: list[int], steps: int, opts: FitLensOptions, settings: dict[str, Any]
           ) -> tuple[list[float], list[float]]:
    """The steps (engine/tuned_fit.py ``train``), from the checkpoint's when there is one to resume
    (engine/checkpoint.py); each translator's mean KL over the first step's windows and over the last's."""
    from anatomy_cli.engine import tuned_fit

    ckpt = None if opts.checkpoint is None else Checkpoint(opts.checkpoint, settings, opts.checkpoint_every)
    resumed = None if ckpt is None else ckpt.load()
    if resumed is not None:
        notes.info(f"resuming from {opts.checkpoint}: {int(resumed['step']):,} of {counted(steps, 'step')} done")
    with notes.status("fit-lens tuned") as line:
        return tuned_fit.train(lm, lens, optim, wins, order, steps, checkpoint=ckpt, resumed=resumed,
                               report=line.update)


def _announce(lm: LoadedModel, wins: list[tuple[int, ...]], steps: int, ctx: int,
              reading: Phase) -> tuple[float, float, Estimate]:
    """The cost line before the fit: FLOPs, peak memory (weights + the fit's own), and the time of every phase
    (:mod:`anatomy_cli.engine.estimate`): the weights' load and the corpus's reading as measured; the training
    from probes of its own code now (one window's backward on up to :data:`PROBE_TOKENS` tokens of the first
    window, scaled by the tokens; one optimizer step, by the steps); the held-out check from its probe."""
    from anatomy_cli.engine import tuned_fit

    n, used = len(wins), sum(map(len, wins))
    flops = cost.tuned_fit_flops(lm.info, used, n)
    weights = float(sum(p.numel() * p.element_size() for p in lm.model.parameters()))
    memory = weights + cost.tuned_fit_bytes(lm.info, min(ctx, used))
    begun = timing.now()
    probe = tuned_fit.translators(lm.info.d_model, lm.n_layers, lm.device)
    opt, scheduler = tuned_fit.optimizer(probe, 1)
    ids = wins[0][:PROBE_TOKENS]
    tuned_fit.window_backward(lm, probe, ids[:2], 1.0)  # a warm-up: the first backward allocates
    window = timing.timed(lambda: tuned_fit.window_backward(lm, probe, ids, 1.0))
    step = timing.timed(lambda: tuned_fit.step(probe, opt, scheduler))
    checking = _lens_check.probe_seconds(lm, tuple(range(lm.n_layers + 1)))
    training = timing.Phase(PHASES[1], window * used / len(ids) + step * steps)
    est = timing.Estimate((timing.load_phase(lm), reading, timing.probes_phase(begun), training,
                           timing.Phase(PHASES[2], checking)))
    notes.info(f"fit-lens tuned: {counted(n, 'window')}, {used:,} tokens, {counted(steps, 'step')}, "
               f"{lm.n_layers} translators: about {flops:.2g} FLOP; {est.describe()} "
               f"on {lm.device.type}; memory about {human_bytes(memory)} (a rough estimate)")
    return flops, memory, est
