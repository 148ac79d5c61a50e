"""`fit-lens jacobian`: fit a Jacobian lens on prompts and write it in jlens' format (the task: its options, checks
and dispatch). The fit itself is :mod:`anatomy_cli.tasks._jacobian_run` (in-process, or on Ray through
:mod:`anatomy_cli.tasks._jacobian_ray`); `fit-lens merge` is :mod:`anatomy_cli.tasks._lens_merge`; `fit-lens tuned`
(a tuned lens on a corpus, tuned-lens' format) is :mod:`anatomy_cli.tasks._tuned_fit`, its options fields here.

jlens' estimator exactly (:mod:`anatomy_cli.engine.jacobian_fit`): per prompt (its first ``max_seq_len`` tokens)
one forward of the ids replicated ``dim_batch`` times and ``ceil(d_model / dim_batch)`` backward passes; ``J_l``
averaged over the valid positions (``skip_first`` through the second-to-last), then over the prompts. Prompts
too short to have a valid position are skipped and counted. Blocks are anatomy's (0..L−1, jlens' layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import _jacobian_run
from anatomy_cli.tasks._checks import out_path
from anatomy_cli.tasks._fit_files import DTYPES
from anatomy_cli.tasks._jacobian_run import JacobianFit as JacobianFit  # re-exported: the views' result types
from anatomy_cli.tasks._lens_merge import MergedLens as MergedLens
from anatomy_cli.tasks._lens_merge import merge as merge

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.tasks._tuned_fit import TunedFit
    from anatomy_cli.tasks._tuned_fit import TunedPlan
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "fit-lens"
# KIND (positional), the CLI's --prompts FILE (the API's prompt), --out (required: the CLI's and the API's own)
INPUTS = {"kind": None, "prompt": "prompts", "out": "out"}
KINDS = ("jacobian", "tuned")


@dataclass(frozen=True)
class FitLensOptions(Declared):
    """The command's options, then its inputs. ``kind``: ``jacobian`` or ``tuned`` (None: not given yet: the CLI
    and the API build the options alone, then add KIND, the prompts and ``--out`` with ``dataclasses.replace``,
    which makes the checks that need them); ``prompt``: the prompts; ``out``: the ``.pt`` file to write
    (``tuned``: the directory). ``source_layers``: the blocks to fit (a list or the text ``0,4-8``; None: every
    block below the target); ``target_layer``: the block whose output J maps onto (None: the last; negative: from
    the end); ``dim_batch``: output dimensions per backward pass (the prompt's copies per forward); ``max_seq_len``:
    tokens kept per prompt; ``skip_first``: leading positions left out of the average; ``dtype``: ``fp16`` (jlens'
    files) or ``fp32``; ``overwrite``: replace an existing ``out``; ``checkpoint``: a file the running sums are
    written to (atomically) and resumed from when it exists (same settings and prompts only; ``tuned``: the
    translators, optimizer, schedule and step); ``checkpoint_every``: prompts (``tuned``: steps) between its
    writes, and after the last; ``shard``: ``i/N`` (or ``(i, N)``) fits prompts i, i + N, i + 2N, ... (0-based)
    only, for ``fit-lens merge``; ``ray``: fit the prompts on Ray workers (``ray_address``, else ``RAY_ADDRESS``,
    else a local Ray started for the run), ``workers`` actors of ``gpus_per_worker`` GPUs each. ``tuned`` only
    (:data:`~anatomy_cli.tasks._tuned_fit.TUNED_ONLY`): ``corpus`` (a path or ``-``), a table corpus's
    ``column``, ``tokens`` (the corpus's first ``tokens`` tokens), ``ctx`` (tokens per window; None: min(2048,
    the model's context)), ``steps`` (tuned-lens' ``num_steps``) and ``seed`` (the windows' shuffle)."""

    source_layers: Any = option(None, "--source-layers", metavar="N,...", show_default=False, cli=Optional[str],
                                help="The blocks to fit (0,4-8); default every block below the target.")
    target_layer: int | None = option(None, "--target-layer", metavar="N", show_default=False,
                                      help="The block J maps onto (default the last; negative counts from the end).")
    dim_batch: int = option(8, "--dim-batch", min=1,
                            help="Output dimensions per backward pass (copies of the prompt per forward).")
    max_seq_len: int = option(128, "--max-seq-len", min=2, help="Tokens kept per prompt.")
    skip_first: int = option(16, "--skip-first", min=0,
                             help="Leading positions left out of the average (attention sinks).")
    dtype: str = option("fp16", "--dtype", metavar="fp16|fp32",
                        help="The stored matrices' precision (fp16: as jlens saves).")
    overwrite: bool = option(False, "--overwrite", help="Replace FILE if it exists.")
    shard: Any = option(None, "--shard", metavar="i/N", show_default=False, cli=Optional[str],
                        help="Fit prompts i, i+N, i+2N, ... only (0-based); merge the N files with fit-lens merge.")
    checkpoint: Path | None = option(None, "--checkpoint", metavar="FILE", show_default=False,
                                     help="Save the fit's state here (jacobian: the running sums; tuned: translators, "
                                     "optimizer, schedule, step); resume from it when it exists (same settings "
                                     "only).")
    checkpoint_every: int = option(1, "--checkpoint-every", min=1, metavar="N",
                                   help="Write --checkpoint every N prompts (tuned: steps) and after the last.")
    ray: bool = shared.ray("jacobian: fit the prompts")
    ray_address: str | None = shared.ray_address()
    workers: int = shared.workers()
    gpus_per_worker: float = shared.gpus_per_worker()
    corpus: str | None = option(None, "--corpus", metavar="PATH|-", show_default=False,
                                help="tuned: the text to train on (a file, a directory of .txt/.md, "
                                ".jsonl/.csv/.parquet, '-').")
    column: str = option("text", "--column", help="tuned: a table corpus's text column.")
    tokens: int | None = option(None, "--tokens", metavar="N", show_default=False,
                                help="tuned: the token budget (the corpus's first N).")
    ctx: int | None = option(None, "--ctx", metavar="N", show_default=False,
                             help="tuned: tokens per window (default min(2048, the model's context)).")
    steps: int = option(250, "--steps", help="tuned: optimizer steps (tuned-lens' num_steps).")
    seed: int = option(42, "--seed", help="tuned: the seed of the windows' shuffle.")
    kind: str | None = None
    prompt: tuple[str, ...] = ()
    out: Path | None = None

    def __post_init__(self) -> None:
        from anatomy_cli.tasks import _tuned_fit

        super().__post_init__()
        if self.corpus is not None:
            object.__setattr__(self, "corpus", str(self.corpus))
        if self.kind is None:
            return  # the options alone: what needs KIND, the prompts or --out is checked when they are given
        if self.kind not in KINDS:
            raise UsageError(f"fit-lens {self.kind}: anatomy fits {', '.join(KINDS)} lenses; fit-lens merge A.pt "
                             "B.pt --out C.pt merges Jacobian lens fits")
        object.__setattr__(self, "prompt", tuple(self.prompt or ()))
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", out_path("--checkpoint", self.checkpoint))
            if self.out is not None and self.checkpoint == Path(self.out).expanduser():
                raise UsageError("--checkpoint must be another file than --out")
        elif self.checkpoint_every != 1:
            raise UsageError("--checkpoint-every needs --checkpoint FILE")
        if self.kind == "tuned":
            _tuned_fit.validate(self)
            object.__setattr__(self, "out", Path(self.out).expanduser())  # type: ignore[arg-type]
            return
        _tuned_fit.refuse_tuned_options(self)
        if not self.prompt:
            raise UsageError("fit-lens needs prompts: --prompts FILE (one per line)")
        if self.out is None:
            raise UsageError("fit-lens needs --out FILE (the lens file to write)")
        object.__setattr__(self, "out", out_path("--out", self.out))
        if self.out.exists() and not self.overwrite:
            raise UsageError(f"--out {self.out} exists: give --overwrite to replace it")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: use fp16 (jlens' files) or fp32")
        if self.shard is not None:
            object.__setattr__(self, "shard", _shard(self.shard))
        if self.skip_first + 2 > self.max_seq_len:
            raise UsageError(f"--skip-first {self.skip_first} leaves no position in --max-seq-len "
                             f"{self.max_seq_len} tokens (a prompt needs skip_first + 2)")
        if self.source_layers is not None:
            object.__setattr__(self, "source_layers", tuple(sites.parse_blocks(sites.blocks_text(self.source_layers),
                                                                               None, "--source-layers")))


def _shard(value: Any) -> tuple[int, int]:
    """``"i/N"`` or ``(i, N)`` -> ``(i, N)`` with 0 <= i < N; UsageError otherwise."""

    try:
        i, n = (int(v) for v in (value.split("/") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise UsageError(f"--shard {value!r}: give i/N, e.g. 0/4 (shards 0..N-1)") from None
    if not 0 <= i < n:
        raise UsageError(f"--shard {i}/{n}: i must be in 0..{n - 1}")
    return i, n


@dataclass(frozen=True)
class FitLensPlan:
    source_layers: tuple[int, ...]
    target_layer: int


def check(opened: Opened, opts: FitLensOptions, encoded: list[Encoded] | None = None) -> FitLensPlan | TunedPlan:
    """Resolves the target and source blocks against the model (before its weights load); refuses an encoder,
    ``--ray`` without Ray installed, and ``encoded`` (the prompts tokenized) when no prompt is long enough.
    ``tuned``: :func:`anatomy_cli.tasks._tuned_fit.check` (a TunedPlan)."""

    if opts.kind == "tuned":
        from anatomy_cli.tasks import _tuned_fit

        return _tuned_fit.check(opened, opts)

    require(opened.info, Need.decoder, command=f"{COMMAND} {opts.kind}")
    if opts.ray:
        from anatomy_cli.corpus.ray_run import ray_module

        ray_module()  # not installed: the one-line error before any weight loads
    n = opened.info.n_layers
    target = n - 1 if opts.target_layer is None else opts.target_layer
    target = sites.check_block(target + n if target < 0 else target, n, "--target-layer")
    if target == 0:
        raise UsageError("--target-layer 0 leaves no block below it to fit")
    if opts.source_layers is None:
        sources = tuple(range(target))
    else:
        sources = tuple(sorted({sites.check_block(b, n, "--source-layers") for b in opts.source_layers}))
        above = [b for b in sources if b >= target]
        if above:
            raise UsageError(f"--source-layers {','.join(map(str, above))}: every source block must be below the "
                             f"target block {target}")
    if encoded is not None:
        from anatomy_cli.tasks._jacobian_run import fitted_prompts

        fitted_prompts(encoded, opts)
    return FitLensPlan(sources, target)


def run(lm: Any, encoded: list[Encoded], opts: FitLensOptions, plan: FitLensPlan | TunedPlan) -> JacobianFit | TunedFit:
    """Fits, writes ``opts.out`` (atomically) and returns the summary: a JacobianFit (``lm`` the LoadedModel, or
    with ``opts.ray`` the OpenedModel: the workers load the weights); ``tuned``: a TunedFit, the corpus in
    ``plan``, ``encoded`` empty. Raises UsageError when no prompt is long enough."""
    if opts.kind == "tuned":
        from anatomy_cli.tasks import _tuned_fit

        assert isinstance(plan, _tuned_fit.TunedPlan)  # check() planned a tuned fit
        return _tuned_fit.run(lm, opts, plan)

    assert isinstance(plan, FitLensPlan)  # check() planned a Jacobian fit
    return _jacobian_run.run(lm, encoded, opts, plan)
