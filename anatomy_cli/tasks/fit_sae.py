"""`fit-sae`: train a TopK SAE (or an MLP transcoder) for each chosen block of this model on a corpus and write
them in sparsify's format (the task).

The corpus is packed into ``ctx``-token windows as ``anatomy corpus`` packs it (:mod:`anatomy_cli.corpus.windows`),
up to ``max_tokens``; the last full window is held out (a shorter remainder trains: ``full_window_last``). The
activations come from anatomy's hooks (any model anatomy opens, GGUF files too), every chosen block's in one pass
over the corpus; the trainer is :mod:`anatomy_cli.engine.sae_fit` (sparsify's ``SparseCoder`` where eai-sparsify
is installed), one SAE per block, each from ``seed`` (so a block's SAE is the one a run of that block alone
writes). Each written SAE is read back as ``anatomy sae`` reads it and spliced into the held-out window: its
health figures and warnings are its row.
``clt`` (with ``transcoder`` and ``layer="all"``): one cross-layer transcoder over every block from the same pass,
in circuit-tracer's ``cross_layer_transcoder`` layout (tasks/_fit_clt.py, engine/clt_fit.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import TypedDict

from anatomy_cli.corpus.sources import open_source
from anatomy_cli.corpus.windows import token_stream
from anatomy_cli.corpus.windows import windows
from anatomy_cli.declare.commands import when_run
from anatomy_cli.engine import estimate as timing
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.models.resolve import recorded
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._fit_sae_block import BlockFit
from anatomy_cli.tasks._fit_sae_block import BlockPlan
from anatomy_cli.tasks._fit_sae_block import clean_run
from anatomy_cli.tasks._fit_sae_block import fit_block
from anatomy_cli.tasks._fit_sae_options import CTX
from anatomy_cli.tasks._fit_sae_options import Activation as Activation
from anatomy_cli.tasks._fit_sae_options import FitSaeOptions as FitSaeOptions
from anatomy_cli.tasks._fit_sae_options import FitSaePlan as FitSaePlan
from anatomy_cli.tasks._fit_sae_options import before_open as before_open
from anatomy_cli.tasks._fit_sae_options import check_windows
from anatomy_cli.tasks._fit_sae_options import full_window_last
from anatomy_cli.tasks.session import busy_threads
from anatomy_cli.units import counted
from anatomy_cli.units import human_bytes

if TYPE_CHECKING:
    from collections.abc import Iterator

    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.estimate import Estimate
    from anatomy_cli.engine.estimate import Timings
    from anatomy_cli.engine.estimate import TimingsRecord
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "fit-sae"
INPUTS = {"corpus": "corpus"}  # CORPUS... (positional) is the API's corpus


@dataclass(frozen=True)
class SaeFit:
    """What was written and how it fits: the shared recipe (sizes, tokens, epochs, lr, trainer), the cost
    printed first (``cost``: its ``phases`` estimated), the seconds of the one collecting pass and of the whole
    run, what each phase took against its estimate (``timings``), and one :class:`BlockFit` per block."""

    out: str
    transcoder: bool
    trainer: str
    d_sae: int
    k: int
    tokens: int
    held_out_tokens: int
    epochs: int
    lr: float
    collect_seconds: float
    seconds: float
    cost: dict[str, Any]
    timings: TimingsRecord
    blocks: tuple[BlockFit, ...]
    clt: dict[str, Any] | None = None  # a cross-layer fit only (tasks/_fit_clt.py): its thresholds and loss
    jumprelu: dict[str, float] | None = None  # --activation jumprelu: its bandwidth and l0_coeff (None: TopK)

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "blocks": [b.to_dict() for b in self.blocks]}
        for key in ("clt", "jumprelu"):  # the TopK per-layer fits' records as they were
            if d[key] is None:
                d.pop(key)
        return d


@dataclass(frozen=True)
class SaeEstimate:
    """``--estimate``: the cost a run of this plan prints first, nothing trained or written: its line (``line``)
    and its record (``cost``, as :attr:`SaeFit.cost`: tokens, rows, blocks, seconds, bytes and every phase)."""

    out: str
    line: str
    cost: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": True, **asdict(self)}


def cost_record(cost: SaeCost) -> dict[str, Any]:
    """:func:`estimate`'s figures as the JSON holds them: the quantities, then the total and each phase."""
    return {**{k: v for k, v in cost.items() if k != "estimate"}, **cost["estimate"].to_dict()}


def recipe(k: int, jumprelu: dict[str, float] | None) -> tuple[str, str]:
    """(the coder's kind, its sparsity setting) as the cost line and the report name them: ``("TopK", "k 32")``,
    ``("JumpReLU", "target L0 32, L0 coefficient 1")``."""
    if jumprelu is None:
        return "TopK", f"k {k}"
    return "JumpReLU", f"target L0 {k}, L0 coefficient {jumprelu['l0_coeff']:g}"


def check(opened: Opened, opts: FitSaeOptions) -> FitSaePlan:
    """The blocks against the model, the corpus tokenized into windows (refused when under two, or when they give
    under 8 training rows: ``check_windows``), and the cost, printed: all before the weights load."""
    require(opened.info, Need.decoder, command=COMMAND)
    info = opened.info
    layers = sorted(int(b) for b in sites.parse_blocks(str(opts.layer), info.n_layers, "--layer", every=True))
    assert opts.out is not None  # __post_init__
    Site = sites.Site
    blocks = tuple(BlockPlan(layer, (sites.hook_name(layer, Site.mlp_in), sites.hook_name(layer, Site.mlp_out))
                             if opts.transcoder else (sites.hook_name(layer, Site.resid_post),) * 2,
                             opts.out / (f"layers.{layer}.mlp" if opts.transcoder else f"layers.{layer}"))
                   for layer in layers)
    ctx = info.window(opts.ctx, CTX, opened.name)
    opts.check_budget(ctx)
    hf = opened.tokenizer.hf
    bos = hf.bos_token_id if info.add_bos and hf.bos_token_id is not None else None

    def pieces() -> Iterator[tuple[str, bool]]:
        for source in opts.corpus:
            yield from open_source(source).pieces()

    wins = full_window_last(tuple(windows(token_stream(pieces(), hf, eos=hf.eos_token_id), ctx=ctx,
                                          bos=bos, max_tokens=opts.max_tokens)))
    check_windows(wins, ctx)
    d_sae = opts.d_sae or 8 * info.d_model
    if opts.k > d_sae:
        raise UsageError(f"--k {opts.k} is above d_sae {d_sae}")
    return FitSaePlan(blocks, wins, d_sae, ctx)


PHASES = ("collecting activations", "training", "writing and the held-out check")  # after the weights' load


class SaeCost(TypedDict):
    """:func:`estimate`: the training tokens and rows (each window's first position left out:
    ``engine.sae_fit.SKIPPED``) and blocks, the expected seconds and their :class:`Estimate`, the memory."""

    tokens: float
    rows: float
    blocks: float
    seconds: float
    estimate: Estimate
    activation_bytes: float
    memory_bytes: float


def estimate(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan) -> SaeCost:
    """The expected cost: tokens, blocks, the time of every phase (:mod:`anatomy_cli.engine.estimate`: the load
    as measured; the others from probes of their own code now: one window's collecting forward, scaled by the
    tokens; a few training steps of a coder of this size, scaled by the steps of every block; the held-out
    check's forwards, one clean for all blocks and two spliced per block, from the window's forward), memory
    (every collected point's activations at once, one SAE with Adam's state and a batch's latents at a time);
    ``--clt``: the CLT's training and check
    (:func:`anatomy_cli.tasks._fit_clt.probe`), and its thresholds and files
    (:func:`anatomy_cli.tasks._fit_clt.writing`)."""
    from anatomy_cli.engine import sae_fit
    _fit_clt = when_run("tasks._fit_clt")

    d, n = lm.info.d_model, len(plan.blocks)
    train_rows = sae_fit.rows(plan.windows[:-1])
    rows = train_rows + sae_fit.rows(plan.windows[-1:])
    tokens = sum(map(len, plan.windows))
    first = plan.windows[:1]
    begun = timing.now()
    window = timing.timed(lambda: sae_fit.collect(lm, first, plan.points))
    batch = min(opts.batch_size, train_rows)
    writing: tuple[timing.Phase, ...] = ()
    if opts.clt:  # one coder of every block; its own held-out check, thresholds and files
        step, coders, checks, coder_bytes = _fit_clt.probe(lm, opts, plan, batch)
        writing = _fit_clt.writing(lm, opts, plan)
    else:  # one coder per block; to check them, one clean forward and two spliced per block; one SAE's Adam state
        # and a batch's latents
        step = sae_fit.probe_step_seconds(d, plan.d_sae, opts.k, batch=batch, transcode=opts.transcoder,
                                          jumprelu=opts.jumprelu)
        coders, checks, coder_bytes = n, 1 + 2 * n, 4.0 * (4 * 2 * d * plan.d_sae + batch * plan.d_sae * 2)
    steps = opts.epochs * len(sae_fit.epoch_batches(train_rows, opts.batch_size))
    collecting, training, checking = PHASES
    forwards = timing.scaled("held-out forwards", window, len(first[0]), checks * len(plan.windows[-1]))
    est = timing.Estimate((timing.load_phase(lm), timing.probes_phase(begun),
                           timing.scaled(collecting, window, len(first[0]), tokens),
                           timing.scaled(training, step, 1, coders * steps),
                           timing.summed(checking, forwards, *writing)))
    activations = 4.0 * len(plan.points) * rows * d
    return {"tokens": float(tokens - len(plan.windows[-1])), "rows": float(train_rows), "blocks": float(n),
            "seconds": est.seconds, "estimate": est, "activation_bytes": activations,
            "memory_bytes": activations + coder_bytes}


def _remainder(plan: FitSaePlan) -> str:
    """The cost line's word on a training window shorter than the rest (the corpus's remainder, which trains)."""
    short = [len(w) for w in plan.windows[:-1] if len(w) < len(plan.windows[-1])]
    return f", the last of {short[0]:,}" if short else ""


def cost_line(opts: FitSaeOptions, plan: FitSaePlan, cost: SaeCost) -> str:
    what = "transcoder" if opts.transcoder else "SAE"
    n = len(plan.blocks)
    where = plan.blocks[0].points[0] if n == 1 else f"{sites.block_spans(b.layer for b in plan.blocks)} ({n} {what}s)"
    if opts.clt:
        what, where = "cross-layer transcoder", f"{sites.block_spans(b.layer for b in plan.blocks)} ({n} blocks)"
    kind, sparsity = recipe(opts.k, opts.jumprelu)
    return (f"fit-sae: a {kind} {what} at {where}, d_sae {plan.d_sae}, {sparsity}: {int(cost['tokens']):,} tokens "
            f"({counted(len(plan.windows) - 1, 'window')} of {plan.ctx:,}{_remainder(plan)}; "
            f"{counted(int(cost['rows']), 'row')}, each window's first position left out) x "
            f"{counted(opts.epochs, 'epoch')}, {counted(len(plan.windows[-1]), 'token')} held out (the last full "
            "window): "
            f"{cost['estimate'].describe()}; memory about {human_bytes(cost['memory_bytes'])} (the activations "
            f"of {counted(len(plan.points), 'hook point')} in one pass, "
            f"{human_bytes(cost['activation_bytes'])}; " + ("the coder with Adam's state" if opts.clt else
                                                     f"one {what} with Adam's state at a time") + ")")


def run(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan) -> SaeFit | SaeEstimate:
    """Collect every block's activations in one pass, then per block: train, write, read back and splice into
    the held-out window (``clt``: one cross-layer transcoder over every block instead, tasks/_fit_clt.py); on a
    busy machine with one thread (:func:`anatomy_cli.tasks.session.busy_threads`), the probes too.
    ``opts.estimate``: the cost alone (:class:`SaeEstimate`), from the probes a run makes first."""
    with busy_threads(COMMAND):
        return fit(lm, opts, plan)


def fit(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan) -> SaeFit | SaeEstimate:
    """:func:`run`'s work: the estimate (``opts.estimate``: only that), the collecting pass, the fits."""
    from anatomy_cli.engine import sae_fit

    cost = estimate(lm, opts, plan)
    said = cost_line(opts, plan, cost)
    if opts.estimate:
        return SaeEstimate(out=str(opts.out), line=said, cost=cost_record(cost))
    notes.info(said)
    timings = cost["estimate"].timings()
    start = time.perf_counter()
    with timings.phase(PHASES[0]), notes.status("fit-sae: collecting activations") as line:
        acts = dict(zip(plan.points, sae_fit.collect(lm, plan.windows, plan.points,
                                                     progress=line.counter("collecting activations", "windows"))))
    collect_seconds = time.perf_counter() - start
    if opts.clt:
        fit_clt = when_run("tasks._fit_clt").fit_clt

        made = fit_clt(lm, opts, plan, acts, timings=timings, phases=PHASES[1:], start=start)
    else:
        made = per_layer(lm, opts, plan, acts, timings)
    fit_notes(opts, made["blocks"], sae_fit.rows(plan.windows[-1:]))
    return SaeFit(out=str(opts.out), transcoder=opts.transcoder, d_sae=plan.d_sae, k=opts.k,
                  tokens=sum(map(len, plan.windows[:-1])), held_out_tokens=len(plan.windows[-1]), epochs=opts.epochs,
                  collect_seconds=collect_seconds, seconds=time.perf_counter() - start,
                  cost=cost_record(cost),
                  timings=timings.to_dict(), jumprelu=opts.jumprelu, **made)


def per_layer(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan, acts: dict[str, Any],
              timings: Timings) -> dict[str, Any]:
    """One coder per block from the collected ``acts`` (freed as the blocks go): ``trainer``, ``lr``, ``blocks``."""
    from anatomy_cli.engine import sae_fit

    lr = opts.lr or sae_fit.default_lr(plan.d_sae, scaled=opts.transcoder)
    fits, trainer = [], ""
    with timings.phase(PHASES[2]):  # the held-out window's clean forward, once for every block's splice
        clean = clean_run(lm, plan.blocks, plan.windows[-1])
    for i, block in enumerate(plan.blocks):
        x, target = acts[block.points[0]], acts[block.points[-1]]
        for p in block.points:  # no later block reads them: freed as the run goes
            acts.pop(p, None)
        label = f"block {block.layer}" + (f" ({i + 1}/{len(plan.blocks)})" if len(plan.blocks) > 1 else "")
        fit, trainer = fit_block(lm, block, x, target, plan.windows, label=label, transcoder=opts.transcoder,
                                 d_sae=plan.d_sae, k=opts.k, epochs=opts.epochs, batch_size=opts.batch_size, lr=lr,
                                 seed=opts.seed, timings=timings, phases=PHASES[1:], jumprelu=opts.jumprelu,
                                 model_name=recorded(lm.name), clean=clean)
        fits.append(fit)
        del x, target
    return {"trainer": trainer, "lr": lr, "blocks": tuple(fits)}


def clt_splice_note(health: dict[str, Any]) -> list[str]:
    """A cross-layer transcoder's one word on its splice into every block at once (the same figures in every
    block's row, so no block's rule can blame one): the held-out window's spliced KL over ``KL_HIGH_NATS``, which
    the per-layer fit warns of per block and a ``--clt`` fit said nothing of (9.8 nats on a tiny fit)."""
    from anatomy_cli.analyses.sae import KL_HIGH_NATS

    kl = health.get("kl_spliced_nats")
    if kl is None or not kl > KL_HIGH_NATS:
        return []
    return [f"spliced into every block at once, the CLT moves the held-out window's next-token distribution by "
            f"KL {kl:.2f} nats (over {KL_HIGH_NATS:g}; CE {health['ce_clean_nats']:.2f} -> "
            f"{health['ce_spliced_nats']:.2f}): circuit's graphs through it leave much to error nodes"]


def fit_notes(opts: FitSaeOptions, fits: Sequence[BlockFit], positions: int) -> None:
    """The fits' warnings: one block's each on a line (``block L: ...``); of several blocks one line in all, naming
    the blocks too weak to read on the held-out window's ``positions`` (:func:`anatomy_cli.analyses.sae.too_weak`:
    none under 8) and those with
    other warnings, whose text stays in the JSON's ``blocks[].warnings`` and each block's fit report (a fit of 30
    blocks said ~60 lines). Then what it takes to fit a useful one."""
    from anatomy_cli.analyses.sae import FVE_LOW
    from anatomy_cli.analyses.sae import too_weak

    if len(fits) == 1:
        for w in fits[0].warnings:
            notes.warn(f"block {fits[0].layer}: {w}")
    weak = [f.layer for f in fits if too_weak(f.health.get("fve"), positions)]
    warned = [f.layer for f in fits if f.warnings]
    what = "block" if opts.clt else "transcoder" if opts.transcoder else "SAE"
    parts = []
    if weak:
        parts.append(f"{len(weak)} of {len(fits)} {what}s{' of the CLT' if opts.clt else ''} too weak to read "
                     f"(held-out FVE under {FVE_LOW}: "
                     f"{sites.block_spans(weak)}): train on more tokens (--max-tokens; "
                     "docs/commands/sae.md#what-a-useful-fit-takes)")
    if opts.clt and fits:
        parts += clt_splice_note(fits[0].health)
    if len(fits) > 1 and warned:
        where = "the JSON's blocks[].warnings" + ("" if opts.clt else " and each block's anatomy-fit.json")
        parts.append(f"{counted(sum(len(f.warnings) for f in fits), 'warning')} on {sites.block_spans(warned)} "
                     f"(the held-out window's health): {where} say them")  # _fit_sae_block.block_warnings
    if parts:
        notes.warn("; ".join(parts))
