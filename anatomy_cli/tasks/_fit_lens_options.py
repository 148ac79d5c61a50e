"""`fit-lens`'s options and plan (:class:`FitLensOptions`, :class:`FitLensPlan`), with the refusals that tell the
two kinds' options apart: apart from tasks/fit_lens.py, so that the fits it imports (tasks/_jacobian_run.py,
tasks/_jacobian_ray.py, tasks/_tuned_fit.py) read them by their own type."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields
from pathlib import Path
from typing import Any
from typing import Optional

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.tasks._checks import out_path
from anatomy_cli.tasks._fit_files import DTYPES

KINDS = ("jacobian", "tuned")
JACOBIAN_ONLY = {"source_layers": "--source-layers", "target_layer": "--target-layer", "dim_batch": "--dim-batch",
                 "max_seq_len": "--max-seq-len", "skip_first": "--skip-first", "dtype": "--dtype",
                 "shard": "--shard", "ray": "--ray", "ray_address": "--ray-address", "workers": "--workers",
                 "gpus_per_worker": "--gpus-per-worker"}
TUNED_CTX = 2048  # fit-lens tuned's default window: min(TUNED_CTX, the model's context) (tuned-lens' max_length)
TUNED_ONLY = {"corpus": "--corpus", "column": "--column", "tokens": "--tokens", "ctx": "--ctx", "steps": "--steps",
              "seed": "--seed"}


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
    (:data:`TUNED_ONLY`): ``corpus`` (a path or ``-``), a table corpus's
    ``column``, ``tokens`` (the corpus's first ``tokens`` tokens), ``ctx`` (tokens per window; None: min(TUNED_CTX,
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
                             help=f"tuned: tokens per window (default min({TUNED_CTX}, the model's context)).")
    steps: int = option(250, "--steps", help="tuned: optimizer steps (tuned-lens' num_steps).")
    seed: int = option(42, "--seed", help="tuned: the seed of the windows' shuffle.")
    kind: str | None = None
    prompt: tuple[str, ...] = ()
    out: Path | None = None

    def __post_init__(self) -> None:
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
            _validate_tuned(self)
            object.__setattr__(self, "out", Path(self.out).expanduser())  # type: ignore[arg-type]
            return
        _refuse_tuned_options(self)
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


def _validate_tuned(opts: FitLensOptions) -> None:
    """The refusals of options of kind ``tuned`` (nothing opened)."""
    if opts.prompt:
        raise UsageError("fit-lens tuned reads --corpus PATH, not prompts: drop --prompts")
    given = _given(opts, JACOBIAN_ONLY)
    if given:
        raise UsageError(f"{', '.join(given)}: for fit-lens jacobian only (a tuned lens trains in this process "
                         "and is written in fp32, as tuned-lens writes it)")
    if opts.corpus is None:
        raise UsageError("fit-lens tuned needs --corpus PATH (a text file, a directory of .txt/.md files, '-', or a "
                         ".jsonl/.csv/.parquet file)")
    if opts.corpus != "-" and not Path(opts.corpus).exists():
        raise UsageError(f"--corpus {opts.corpus} does not exist")
    if opts.tokens is None:
        raise UsageError("fit-lens tuned needs --tokens N (the corpus's first N tokens are trained on)")
    for flag, value, least in (("--tokens", opts.tokens, 2), ("--ctx", opts.ctx, 2), ("--steps", opts.steps, 1)):
        if value is not None and value < least:
            raise UsageError(f"{flag} takes a whole number of at least {least}")
    if opts.out is None:
        raise UsageError("fit-lens tuned needs --out DIR (the tuned lens directory to write)")
    out = Path(opts.out).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; a tuned lens is a directory (config.json + params.pt)")
    out_path("--out", out, folder=True)
    if any((out / f).exists() for f in ("config.json", "params.pt")) and not opts.overwrite:
        raise UsageError(f"--out {out} holds a lens already: give --overwrite to replace it")


def _refuse_tuned_options(opts: FitLensOptions) -> None:
    """``--corpus`` and the rest given to another kind than ``tuned``."""
    given = _given(opts, TUNED_ONLY)
    if given:
        raise UsageError(f"{', '.join(given)}: for fit-lens tuned only (fit-lens {opts.kind} reads --prompts FILE)")


def _given(opts: FitLensOptions, flags: dict[str, str]) -> list[str]:
    """The flags of ``flags`` (``{field: flag}``) whose fields differ from their defaults."""
    defaults = {f.name: f.default for f in fields(opts)}
    return [flag for name, flag in flags.items() if getattr(opts, name) != defaults[name]]
