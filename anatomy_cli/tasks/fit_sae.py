"""`fit-sae`: train a TopK SAE (or an MLP transcoder) for this model on a corpus and write it in sparsify's format
(the task).

The corpus is packed into ``ctx``-token windows as ``anatomy corpus`` packs it (:mod:`anatomy_cli.corpus.windows`),
up to ``max_tokens``; the last window is held out. The activations come from anatomy's hooks (any model anatomy
opens, GGUF files too); the trainer is :mod:`anatomy_cli.engine.sae_fit` (sparsify's ``SparseCoder`` where
eai-sparsify is installed). The written SAE is read back as ``anatomy sae`` reads it and spliced into the
held-out window: its health figures and warnings are the report's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.errors import UsageError
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel

COMMAND = "fit-sae"
INPUTS = {"corpus": "corpus"}  # CORPUS... (positional) is the API's corpus
DEAD_HIGH = 0.5  # a dead fraction over this is warned


@dataclass(frozen=True)
class FitSaeOptions:
    """``corpus``: text files, folders of .txt/.md, .jsonl/.csv/.parquet (as ``anatomy corpus`` reads them);
    ``layer``: the block; ``transcoder``: an MLP transcoder (the MLP's input -> its output) instead of an SAE on
    the block's output; ``out``: the folder written (``out/layers.L`` or ``out/layers.L.mlp``); ``d_sae``:
    latents (default 8 × d_model); ``k``: active latents per token; ``max_tokens``, ``ctx``: the budget and the
    window; ``epochs``, ``batch_size``, ``lr`` (default sparsify's); ``seed``; ``overwrite``."""

    corpus: tuple[str, ...] = ()
    layer: int = 0
    transcoder: bool = False
    out: Path | None = None
    d_sae: int | None = None
    k: int = 32
    max_tokens: int = 20000
    ctx: int = 256
    epochs: int = 8
    batch_size: int = 256
    lr: float | None = None
    seed: int = 0
    overwrite: bool = False

    def __post_init__(self) -> None:
        from anatomy_cli.corpus.sources import open_source

        object.__setattr__(self, "corpus", tuple(str(c) for c in self.corpus))
        if not self.corpus:
            raise UsageError("fit-sae needs a corpus: CORPUS... (text files, folders of .txt/.md, .jsonl)")
        if "-" in self.corpus:
            raise UsageError("fit-sae reads files, not stdin: give CORPUS paths")
        for source in self.corpus:
            open_source(source)  # a missing path, an empty folder: one line
        if self.out is None:
            raise UsageError("fit-sae needs --out DIR (the folder the SAE is written to)")
        object.__setattr__(self, "out", Path(self.out).expanduser())
        if self.out.exists() and not self.out.is_dir():
            raise UsageError(f"--out {self.out} is a file; give a folder")
        if self.out.is_dir() and any(self.out.iterdir()) and not self.overwrite:
            raise UsageError(f"--out {self.out} is not empty: give --overwrite to write into it")
        for name, value, least in (("--k", self.k, 1), ("--max-tokens", self.max_tokens, 4), ("--ctx", self.ctx, 2),
                                   ("--epochs", self.epochs, 1), ("--batch-size", self.batch_size, 1)):
            if value < least:
                raise UsageError(f"{name} takes a whole number of at least {least}")
        if self.d_sae is not None and self.d_sae < self.k:
            raise UsageError(f"--d-sae {self.d_sae} is below --k {self.k}: give at least k latents")
        if self.lr is not None and not 0 < self.lr < 1:
            raise UsageError(f"--lr {self.lr} is outside (0, 1)")
        if self.max_tokens < 2 * self.ctx:
            raise UsageError(f"--max-tokens {self.max_tokens} is under two --ctx {self.ctx} windows (one is held out)")


@dataclass(frozen=True)
class FitSaePlan:
    layer: int
    points: tuple[str, str]  # the input and the target hook points
    folder: Path
    windows: tuple[tuple[int, ...], ...]
    d_sae: int


@dataclass(frozen=True)
class SaeFit:
    """What was written and how it fits: the sizes, the training curve's last FVU, the dead fraction (latents
    that never fired in the last epoch), and the written SAE's health on the held-out window."""

    out: str
    transcoder: bool
    trainer: str
    site: str
    site_out: str
    d_in: int
    d_sae: int
    k: int
    tokens: int
    held_out_tokens: int
    epochs: int
    steps: int
    lr: float
    fvu_first: float
    fvu_last: float
    dead_fraction: float
    seconds: float
    cost: dict[str, float]
    health: dict[str, Any]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "warnings": list(self.warnings)}


def check(opened: Any, opts: FitSaeOptions) -> FitSaePlan:
    """The block against the model, the corpus tokenized into windows (refused when under two), and the cost,
    printed: all before the weights load."""
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.corpus.windows import token_stream
    from anatomy_cli.corpus.windows import windows
    from anatomy_cli.models import sites
    from anatomy_cli.models.capabilities import Need
    from anatomy_cli.models.capabilities import require

    require(opened.info, Need.decoder, command=COMMAND)
    info = opened.info
    layer = sites.check_block(opts.layer, info.n_layers, "--layer")
    points = (f"blocks.{layer}.mlp.hook_in", f"blocks.{layer}.hook_mlp_out") if opts.transcoder else (
        f"blocks.{layer}.hook_resid_post",) * 2
    assert opts.out is not None  # __post_init__
    folder = opts.out / (f"layers.{layer}.mlp" if opts.transcoder else f"layers.{layer}")
    hf = opened.tokenizer.hf
    bos = hf.bos_token_id if info.add_bos and hf.bos_token_id is not None else None

    def pieces() -> Any:
        for source in opts.corpus:
            yield from open_source(source).pieces()

    wins = tuple(windows(token_stream(pieces(), hf, eos=hf.eos_token_id), ctx=min(opts.ctx, info.n_ctx or opts.ctx),
                         bos=bos, max_tokens=opts.max_tokens))
    if len(wins) < 2:
        tokens = sum(map(len, wins))
        raise UsageError(f"the corpus gives {tokens} tokens, under two --ctx {opts.ctx} windows (one is held out): "
                         "give more text or a smaller --ctx")
    d_sae = opts.d_sae or 8 * info.d_model
    if opts.k > d_sae:
        raise UsageError(f"--k {opts.k} is above d_sae {d_sae}")
    return FitSaePlan(layer, points, folder, wins, d_sae)


def estimate(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan) -> dict[str, float]:
    """The expected cost: tokens, FLOPs (the forwards, the training), seconds at a rate measured now, memory."""
    from anatomy_cli.engine import sae_fit
    from anatomy_cli.models import cost

    d = lm.info.d_model
    train_rows = sum(map(len, plan.windows[:-1]))
    forward = sum(cost.forward_flops(lm.info, len(w)) for w in plan.windows)
    training = opts.epochs * train_rows * (6.0 * d * plan.d_sae + 6.0 * opts.k * d)
    rate = sae_fit.measured_rate(d, plan.d_sae, lm.device)
    memory = 4.0 * (2 * train_rows * d + 4 * 2 * d * plan.d_sae + opts.batch_size * plan.d_sae * 2)
    return {"tokens": float(train_rows), "forward_flops": forward, "train_flops": training, "rate_flops": rate,
            "seconds": (forward + training) / rate, "memory_bytes": memory}


def run(lm: LoadedModel, opts: FitSaeOptions, plan: FitSaePlan) -> SaeFit:
    """Collect, train, write, read back and splice into the held-out window."""
    import time

    import torch

    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine import sae_fit
    from anatomy_cli.models.sae import read
    from anatomy_cli.units import human_bytes
    from anatomy_cli.units import human_seconds

    cost = estimate(lm, opts, plan)
    what = "transcoder" if opts.transcoder else "SAE"
    notes.info(f"fit-sae: a TopK {what} at {plan.points[0]}, d_sae {plan.d_sae}, k {opts.k}: "
               f"{int(cost['tokens']):,} tokens ({len(plan.windows) - 1} windows, one more held out) x "
               f"{opts.epochs} epochs; about {cost['forward_flops'] + cost['train_flops']:.2g} FLOP "
               f"(forwards {cost['forward_flops']:.2g}, training {cost['train_flops']:.2g}) at a measured "
               f"{cost['rate_flops'] / 1e9:.0f} GFLOP/s: roughly {human_seconds(cost['seconds'])}; memory about "
               f"{human_bytes(cost['memory_bytes'])} (the activations, the SAE with Adam's state)")
    start = time.perf_counter()
    with notes.status("fit-sae: collecting activations") as line:
        acts = sae_fit.collect(lm, plan.windows, list(dict.fromkeys(plan.points)),
                               progress=line.counter("collecting activations", "windows"))
    x, target = acts[0], acts[-1]
    n_train = sum(map(len, plan.windows[:-1]))
    with torch.random.fork_rng(devices=[]):  # the caller's (or a server's) global RNG is left as it was
        torch.manual_seed(opts.seed)
        coder = sae_fit.make_coder(x.shape[1], plan.d_sae, opts.k, transcode=opts.transcoder)
    lr = opts.lr or sae_fit.default_lr(plan.d_sae)
    with notes.status("fit-sae: training") as line:
        trained = sae_fit.train(x[:n_train], target[:n_train], coder, epochs=opts.epochs, batch=opts.batch_size,
                                lr=lr, seed=opts.seed, progress=line.counter("training", "steps"))
    sae_fit.save_sparsify(coder, plan.folder)
    seconds = time.perf_counter() - start
    sae_file = read.read(plan.folder)
    held_out = list(plan.windows[-1])
    splice = engine_sae.splice_run(lm, held_out, engine_sae.Dictionary(sae_file, lm.device))
    health = analysis.health(splice, held_out, sae_file.stated_l0)
    dead = 1.0 - float(trained["fired"].float().mean())
    warnings = analysis.warnings(health, n_tokens=len(held_out), context_size=None, sae_bos=None, prompt_bos=None,
                                 centred=False, centred_now=0.0)
    if dead > DEAD_HIGH:
        warnings.append(f"{dead:.0%} of the latents never fired in the last epoch (over {DEAD_HIGH:.0%}): "
                        "train on more tokens, or give a smaller --d-sae")
    for w in warnings:
        notes.warn(w)
    curve = trained["fvu"]
    return SaeFit(out=str(plan.folder), transcoder=opts.transcoder,
                  trainer="sparsify" if not isinstance(coder, sae_fit.TopKCoder) else "anatomy",
                  site=sae_file.site, site_out=sae_file.site_out, d_in=sae_file.d_in, d_sae=sae_file.d_sae, k=opts.k,
                  tokens=n_train, held_out_tokens=len(held_out), epochs=opts.epochs, steps=trained["steps"], lr=lr,
                  fvu_first=curve[0], fvu_last=sum(curve[-10:]) / len(curve[-10:]), dead_fraction=dead,
                  seconds=seconds, cost=cost, health=health.to_dict(), warnings=tuple(warnings))
