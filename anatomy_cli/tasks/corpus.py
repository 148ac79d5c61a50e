"""`corpus`: per-layer (and per-head) statistics over a whole corpus, resumable, on Ray if asked (the task).

:class:`CorpusOptions` holds every option of the command (the CLI parses into it, ``anatomy.corpus_stats``
builds it from its keywords); :func:`check` makes the refusals that need the opened model, before any weight
loads; :func:`measure` is the whole run (open, check, load, measure every shard, merge) and returns a
:class:`CorpusRun`, which :mod:`anatomy_cli.output.views.corpus` renders. Residual rows are named ``embed``,
then 0..L−1 (block N's output; docs/engine.md#layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.corpus.ray_run import ray_module
from anatomy_cli.corpus.sources import open_source
from anatomy_cli.declare import shared
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.declare.shared import ShardRun
from anatomy_cli.errors import UsageError
from anatomy_cli.models import lens_choice
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.lens import check_unembed_hash
from anatomy_cli.tasks.lens import fitted_lens
from anatomy_cli.tasks.notes import status
from anatomy_cli.tasks.session import check_early
from anatomy_cli.tasks.session import load_weights
from anatomy_cli.tasks.session import open_model

if TYPE_CHECKING:
    from collections.abc import Callable

    from anatomy_cli.corpus.runner import Result
    from anatomy_cli.corpus.runner import Settings
    from anatomy_cli.corpus.sources import Source
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens
    from anatomy_cli.engine.opening import OpenedModel
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.tasks.protocol import Opened
    from anatomy_cli.text.tokenization import Tokenizer

COMMAND = "corpus"


@dataclass(frozen=True)
class CorpusOptions(Declared):
    """The command's options (``out`` the ``--out`` directory). ``lens``: the lenses to measure, each ``logit``,
    ``tuned:DIR`` or ``jacobian:FILE`` (``--lens``, repeatable; a text, a list, None or True for the logit lens
    alone, the default, or False/``()`` for none, ``--no-lens``); kept as a tuple of texts with absolute paths."""

    ctx: int | None = shared.ctx(shared.CORPUS_CTX)
    max_tokens: int | None = shared.max_tokens()
    column: str = shared.column()
    bos: bool | None = shared.bos("when the tokenizer itself adds one (LLaMA, Gemma)")
    heads: bool = option(False, "--heads", help="Also per head: attention entropy, sink (first-token) mass, "
                         "previous-token mass (a second forward, with eager attention).")
    lens: Any = shared.lenses(None, "A lens to measure (repeatable, one of each kind): logit (the default), tuned:DIR "
                              "(a tuned-lens directory) or jacobian:FILE (a Jacobian lens .pt file). Per layer: KL to "
                              "the final distribution, CE, entropy, in nats per token and bits per byte.")
    experts: bool = option(False, "--experts", help="Also per MoE block and expert (Mixtral, Qwen2/3-MoE, OLMoE): the "
                           "share of token slots routed to it, its mean weight, the load imbalance and how often pairs "
                           "of experts are chosen together.")
    lens_every: int = option(1, "--lens-every", min=1, metavar="N", help="Measure the lenses at every N-th position "
                             "only (each costs (L+1)·d·vocab per position).")
    out: Path | None = option(None, "--out", metavar="DIR", show_default=False, extra={"file_okay": False},
                              help="Write shards, manifest and summary Parquet here; running again resumes.")
    overwrite: bool = option(False, "--overwrite", help="Replace a run of other settings in --out.")
    run: ShardRun = shared.shard_run()
    save_activations: str | None = option(
        None, "--save-activations", metavar="SITE[,SITE]", show_default=False,
        help="Also save the activations at these hook points (blocks.6.hook_resid_post, ...) under --out DIR/"
        "activations as safetensors shards with a Parquet index, for training SAEs. See docs/corpus.md.")
    activation_dtype: str = option("fp32", "--activation-dtype", metavar="fp32|fp16",
                                   help="The saved activations' dtype.")
    allow_special: bool = option(False, "--allow-special", help="Read special-token text in prompts, such as "
                                 "<|endoftext|>, as that special token. Default: it is plain text, split like any "
                                 "other text.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.out is not None and not isinstance(self.out, Path):
            object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "lens", lens_texts(self.lens))
        _ = self.sites  # --save-activations' syntax, --activation-dtype: refused before anything opens

    @property
    def sites(self) -> tuple[str, ...]:
        """``--save-activations``' hook points (UsageError for a bad one, or without ``--out``, or with Ray)."""
        if self.save_activations is None:
            return ()
        from anatomy_cli.corpus.activations import DTYPES
        from anatomy_cli.corpus.activations import parse_sites

        if self.activation_dtype not in DTYPES:
            raise UsageError(f"--activation-dtype is fp32 or fp16, not '{self.activation_dtype}'")
        if self.out is None or self.run.ray:
            raise UsageError("--save-activations needs --out DIR and runs in-process (not with --ray)")
        return parse_sites(self.save_activations)


def lens_texts(lens: Any) -> tuple[str, ...]:
    """``CorpusOptions.lens`` as the tuple of lens texts (absolute paths). UsageError for a bad lens or one kind
    given twice (a run's figures are keyed by the lens' kind)."""
    if lens is True or lens is None:
        return ("logit",)
    if lens is False:
        return ()
    texts = [lens] if isinstance(lens, str) else list(lens)
    out: list[str] = []
    for text in texts:
        choice = lens_choice.parse(str(text))
        path = None if choice.path is None else choice.path.resolve()
        if any(t.partition(":")[0] == choice.kind for t in out):
            raise UsageError(f"--lens {choice.kind} is given twice: one lens of each kind per run")
        out.append(choice.kind if path is None else f"{choice.kind}:{path}")
    return tuple(out)


@dataclass(frozen=True)
class CorpusPlan:
    ctx: int
    bos: bool
    fitted: tuple[FittedLens, ...] = ()  # each fitted lens (tensors memory-mapped), checked against the model


@dataclass(frozen=True)
class CorpusRun:
    """What :func:`measure` returns: the runner's :class:`~anatomy_cli.corpus.runner.Result`, the source's
    identity, the run's settings, the loaded model (None on Ray: the workers load it) and the spec."""

    result: Result
    identity: dict[str, object]
    settings: Settings
    lm: LoadedModel | None
    spec: ModelSpec


def check(opened: Opened, opts: CorpusOptions) -> CorpusPlan:
    """Every refusal that needs the opened model: a decoder (with a lens, an LM head; with ``--experts``, a mixture
    of experts), a fitted lens of another width or depth (from its header, before any weight loads), the saved sites
    within its blocks, ``--ctx`` within its context."""

    info: ModelInfo = opened.info
    require(info, Need.decoder, *([Need.lm_head] if opts.lens else []), command=COMMAND)
    if opts.experts:
        require(info, Need.moe, command=f"{COMMAND} --experts")
    fitted = tuple(f for f in (fitted_lens(opened, text, command=COMMAND) for text in opts.lens) if f is not None)
    if opts.sites:
        from anatomy_cli.corpus.activations import check_sites

        check_sites(opts.sites, info, opened.name)
    return CorpusPlan(ctx=info.window(opts.ctx, shared.CORPUS_CTX, opened.name),
                      bos=info.add_bos if opts.bos is None else opts.bos, fitted=fitted)


def measure(source: str, spec: ModelSpec, opts: CorpusOptions) -> CorpusRun:
    """The whole run: the model opened and loaded through the current loader (with Ray only opened: the
    workers load it), every shard measured or read back from ``opts.out``, merged in shard order."""
    from anatomy_cli.corpus.runner import Settings
    from anatomy_cli.corpus.runner import run

    sites = opts.sites
    src = open_source(source, column=opts.column)
    try:
        identity = src.identity()
        lm, opened, tokenizer, plan = _load(spec, opts)
        _say_lenses(lm, plan)
        settings = Settings(ctx=plan.ctx, bos=plan.bos, max_tokens=opts.max_tokens, lens=opts.lens,
                            lens_every=opts.lens_every, heads=opts.heads, shard_windows=opts.run.shard_windows,
                            allow_special=opts.allow_special, batch_size=opts.run.batch_size, save_activations=sites,
                            activation_dtype=opts.activation_dtype, experts=opts.experts)
        result = _run(run, src, spec, settings, tokenizer, lm, identity, opts)
    finally:
        if source == "-":
            src.path.unlink(missing_ok=True)
    for why in result.recomputed:
        notes.info(f"{why}; computed again")
    if result.resumed:
        notes.info(f"resumed: {result.resumed} of {result.shards} shards were read from the output directory")
    return CorpusRun(result=result, identity=identity, settings=settings, lm=lm, spec=spec)


def _run(run: Callable[..., Result], src: Source, spec: ModelSpec, settings: Settings, tokenizer: Tokenizer,
         lm: LoadedModel | None, identity: dict[str, object], opts: CorpusOptions) -> Result:
    CorpusStatus = when_run("tasks._corpus_status").CorpusStatus

    with status("corpus: planning the first shard") as line:
        progress = CorpusStatus(line, opts.max_tokens)
        try:
            return run(src, spec, settings, tokenizer=tokenizer, lm=lm, out=opts.out, overwrite=opts.overwrite,
                       identity=identity, ray=opts.run.on_ray(), progress=progress)
        except KeyboardInterrupt:
            notes.info(progress.interrupted(opts.out))
            raise


def _load(spec: ModelSpec, opts: CorpusOptions) -> tuple[LoadedModel | None, OpenedModel, Tokenizer, CorpusPlan]:
    """``(lm, opened, tokenizer, plan)``; with Ray the driver opens the model only (lm None: the workers load
    the weights). ``tokenizer``: transformers' own (the windows are planned with its batch encoding)."""
    if opts.run.ray:
        ray_module()  # not installed: the one-line error before anything loads
    check_early(spec, ctx=opts.ctx)  # --ctx past a GGUF's context: refused from its header, before the open
    opened = open_model(spec)
    plan = check(opened, opts)
    if not opts.run.ray:
        lm = load_weights(opened)
        return lm, opened, lm.tokenizer, plan
    if opened.light:
        open_exact = when_run("engine.opening").open_exact

        return None, opened, open_exact(spec).tokenizer, plan
    return None, opened, opened.tokenizer, plan


def _say_lenses(lm: LoadedModel | None, plan: CorpusPlan) -> None:
    """A tuned lens fitted with another LM head warns (in-process only: on Ray the driver has no weights)."""

    if lm is not None:
        for fitted in plan.fitted:
            check_unembed_hash(lm, fitted)

