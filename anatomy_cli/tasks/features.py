"""`features`: readable dictionary features over a corpus, in one streaming pass (the task).

:class:`FeaturesOptions` holds the dictionary (DICT: what ``anatomy sae`` reads), the corpus and every option;
:func:`check` reads the dictionary and refuses what needs no weights; :func:`measure` is the whole run (open,
check, load, the pass through :mod:`anatomy_cli.corpus.feature_run`, the summary, the files written) and returns a
:class:`FeaturesRun`, which :mod:`anatomy_cli.output.views.features` renders. See docs/commands/features.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.declare.shared import ShardRun
from anatomy_cli.errors import UsageError
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.models.sae.fit_report import held_out_fve
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    from anatomy_cli.models.sae.read import SAEFile

COMMAND = "features"
INPUTS = {"sae": None}  # DICT (positional) is the API's sae
SHOWN = 50  # --show's default: the table's rows (the most frequent features)
COOC_LIMIT = 1 << 26  # followed features x d_sae counts kept for co-firing (int64: 512 MiB)


@dataclass(frozen=True)
class FeaturesOptions(Declared):
    """``sae``: the dictionary (a SAELens or sparsify folder, a Gemma Scope params.npz; SAE or transcoder; one
    block of a circuit-tracer set, ``hook`` naming it);
    ``corpus``: the text (as ``anatomy corpus`` reads it); ``feature``/``features``: the ids followed (both may be
    given; none: every feature); the rest as their flags say."""

    sae: Path | str
    corpus: str = option(dataclasses.MISSING, "--corpus", metavar="PATH|-", show_default=False,
                         help="The text: a file, a directory of .txt/.md, .jsonl/.csv/.parquet (--column), a "
                         "datasets directory, '-' (stdin); as anatomy corpus reads it.")
    hook: str | None = option(None, "--hook", metavar="NAME", show_default=False,
                              help="The hook point, where the files state none (Gemma Scope), as anatomy sae takes "
                              "it; in a folder of dictionaries (fit-sae --layer all), the one read (layers.14.mlp); "
                              "in a circuit-tracer transcoder set or cross-layer transcoder, the block read (14).")
    feature: Any = option(None, "--feature", metavar="ID", min=0, show_default=False, cli=list[int] | None,
                          help="Follow this feature (repeatable).")
    features: str | None = option(None, "--features", metavar="RANGES", show_default=False,
                                  help="Follow these features: 0-99, or 3,7,10-19. Default (no --feature): all.")
    top_k: int = option(20, "--top-k", min=1, metavar="N", help="Top-activating contexts kept per feature.")
    quantiles: int = option(10, "--quantiles", min=0, metavar="N",
                            help="Activation intervals of equal width over [0, max] to sample contexts from "
                            "(SAEDashboard's n_quantiles; 0: none).")
    quantile_size: int = option(5, "--quantile-size", min=1, metavar="N",
                                help="Contexts sampled per interval (SAEDashboard's quantile_group_size).")
    window: int = option(10, "--window", min=0, metavar="N", help="Context tokens kept on each side of a token.")
    cooccur: int = option(10, "--cooccur", min=0, metavar="N",
                          help="Features listed that fire on the same tokens most often (0: not counted).")
    logit_top: int = option(10, "--logit-top", min=1, metavar="N",
                            help="Tokens listed at each end of a feature's logit effects.")
    seed: int = option(22, "--seed", metavar="N", help="The seed of the sampled contexts (delphi's default).")
    ctx: int | None = shared.ctx(shared.CORPUS_CTX, "the dictionary's context size, else ")
    max_tokens: int | None = shared.max_tokens()
    column: str = shared.column()
    bos: bool | None = shared.bos("the dictionary's prepend_bos, else when the tokenizer adds one")
    allow_special: bool = option(False, "--allow-special", help="Read special-token text in the corpus as that "
                                 "special token. Default: plain text.")
    out: Path | None = option(None, "--out", metavar="DIR", show_default=False, extra={"file_okay": False},
                              help="Write features.parquet, contexts.parquet, logit_effects.parquet and the run's "
                              "shards here; running again resumes.")
    overwrite: bool = option(False, "--overwrite", help="Replace a run of other settings in --out (and --delphi).")
    delphi: Path | None = option(None, "--delphi", metavar="DIR", show_default=False, extra={"file_okay": False},
                                 help="Also write delphi's latent cache (safetensors splits of locations, activations "
                                 "and tokens) here. Needs --out.")
    show: int = option(SHOWN, "--show", min=0, metavar="N",
                       help="Rows of the table (and of tsv): the N most frequent features, with a line counting the "
                       "rest (0: every feature). --format json and --out's files always hold every feature.")
    estimate: bool = shared.estimate("Print the expected cost and stop (no weights load).")
    run: ShardRun = shared.shard_run()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sae", Path(self.sae))
        object.__setattr__(self, "corpus", str(self.corpus))
        for name in ("out", "delphi"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if self.feature is not None:
            object.__setattr__(self, "feature", tuple(int(f) for f in self.feature))
        _ = self.ranges  # --features' syntax, before anything opens
        if self.delphi is not None and self.out is None:
            raise UsageError("--delphi DIR needs --out DIR (the run's shards are kept there)")

    @property
    def ranges(self) -> list[int]:
        """``--features``' ids (UsageError for bad syntax), without repeats."""
        return parse_ranges(self.features) if self.features else []

    def wanted(self, d_sae: int) -> list[int]:
        """The followed ids, sorted (every feature when none is named); UsageError for one out of range."""
        ids = sorted({*(self.feature or ()), *self.ranges})
        bad = [f for f in ids if f >= d_sae]
        if bad:
            flag = "--feature" if bad[0] in (self.feature or ()) else "--features"
            raise UsageError(f"{flag} {bad[0]} is out of range: the dictionary has {d_sae} features (0-{d_sae - 1})")
        return ids or list(range(d_sae))


def parse_ranges(text: str) -> list[int]:
    """``0-99``, ``3,7,10-19`` as ids (sorted, unique); UsageError for anything else."""
    out: set[int] = set()
    for part in (p.strip() for p in str(text).split(",")):
        a, dash, b = part.partition("-")
        if not a.isdigit() or (dash and not b.isdigit()) or (dash and int(b) < int(a)):
            raise UsageError(f"--features takes ids and ranges such as 0-99 or 3,7,10-19, not '{text}'")
        out.update(range(int(a), int(b) + 1) if dash else (int(a),))
    return sorted(out)


@dataclass(frozen=True)
class FeaturesPlan:
    sae_file: SAEFile
    features: tuple[int, ...]
    ctx: int
    bos: bool
    cooccur: bool
    fit_report: dict[str, Any] | None = None  # weak_note's: the JSON's ``fit_report``


def check(opened: Any, opts: FeaturesOptions, sae_file: SAEFile) -> FeaturesPlan:
    """The plan of ``sae_file`` (the dictionary ``opts.sae`` names, read once by the caller) on ``opened``;
    UsageError for one that does not fit the model, a feature out of range, ``--ctx`` past the model's context; a
    decoder with an LM head (the logit effects)."""
    info = opened.info
    require(info, Need.decoder, Need.lm_head, command=COMMAND)
    sae_file.check_fits(info, opened.name)
    ids = tuple(opts.wanted(sae_file.d_sae))
    ctx = info.window(opts.ctx, sae_file.context_size or shared.CORPUS_CTX, opened.name)
    bos = opts.bos if opts.bos is not None else sae_file.prepend_bos if sae_file.prepend_bos is not None \
        else info.add_bos
    fit_report = weak_note(sae_file.path)
    cooccur = opts.cooccur > 0 and len(ids) * sae_file.d_sae <= COOC_LIMIT
    if opts.cooccur > 0 and not cooccur:
        notes.warn(f"co-firing is not counted for {len(ids):,} features x {sae_file.d_sae:,} (over "
                   f"{COOC_LIMIT:,} counts): follow fewer with --features")
    return FeaturesPlan(sae_file, ids, ctx, bos, cooccur, fit_report)


def weak_note(dictionary: Path) -> dict[str, Any] | None:
    """One warning when the fit report beside ``dictionary`` (models/sae/fit_report.py, written by fit-sae) gives
    a held-out FVE too weak to read (:func:`anatomy_cli.analyses.sae.too_weak`, fit-sae's and circuit's rule: on
    8 positions or more).
    Returns what the JSON says of it (``fit_report``): ``path``, ``held_out_fve``, ``too_weak``, ``warning`` (the
    line, None when not weak); None where there is no report (the dictionary is not judged), or one that cannot be
    read: optional metadata (docs/commands/features.md#a-weak-dictionary), so a warning, not an error."""
    from anatomy_cli.analyses.sae import FVE_LOW
    from anatomy_cli.analyses.sae import too_weak

    try:
        found = held_out_fve(dictionary)
    except ValueError as e:
        notes.warn(f"the fit report {e}: the dictionary is not judged (fit-sae wrote it; fit again to rewrite it)")
        return None
    if found is None:
        return None
    fve, positions, path = found
    weak = too_weak(fve, positions)
    warning = (f"the dictionary is too weak to read: its fit report ({path}) gives a held-out FVE of "
               f"{fve:.3f}, under {FVE_LOW}: its features explain little of the activation; fit it on more "
               "tokens (docs/commands/sae.md#what-a-useful-fit-takes)") if weak else None
    if warning is not None:
        notes.warn(warning)
    return {"path": str(path), "held_out_fve": fve, "too_weak": weak, "warning": warning}


def settings_of(opts: FeaturesOptions, plan: FeaturesPlan) -> Any:
    from anatomy_cli.corpus.feature_run import FeatureSettings

    return FeatureSettings(ctx=plan.ctx, bos=plan.bos, sae=str(Path(opts.sae).resolve()), hook=opts.hook,
                           features=plan.features, max_tokens=opts.max_tokens, shard_windows=opts.run.shard_windows,
                           allow_special=opts.allow_special, top_k=opts.top_k, quantile_size=opts.quantile_size,
                           window=opts.window, seed=opts.seed, cooccur=plan.cooccur, delphi=opts.delphi is not None,
                           batch_size=opts.run.batch_size)
