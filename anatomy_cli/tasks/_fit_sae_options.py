"""`fit-sae`'s options and plan (:class:`FitSaeOptions`, :class:`FitSaePlan`), apart from tasks/fit_sae.py so that
the cross-layer fit it imports (tasks/_fit_clt.py) reads them by their own type."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from anatomy_cli.corpus.sources import open_source
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import flag
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.info import default_window
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks._checks import out_path
from anatomy_cli.tasks._fit_sae_block import BlockPlan
from anatomy_cli.tasks.session import check_early
from anatomy_cli.units import counted

CTX = 256  # --ctx's default: min(CTX, the model's context)


class Activation(str, Enum):
    topk = "topk"
    jumprelu = "jumprelu"  # thresholds trained with the straight-through estimator (engine/jumprelu.py)


@dataclass(frozen=True)
class FitSaeOptions(Declared):
    """``corpus``: text files, folders of .txt/.md, .jsonl/.csv/.parquet (as ``anatomy corpus`` reads them);
    ``layer``: the block(s): ``6``, ``"0-3"``, ``[2, 6]``, ``"all"`` (kept as the text :func:`sites.parse_blocks`
    reads); ``transcoder``: an MLP transcoder (the MLP's input -> its output) instead of an SAE on the block's
    output; ``out``: the folder written (``out/layers.L`` or ``out/layers.L.mlp`` per block); ``d_sae``:
    latents (default 8 × d_model); ``k``: active latents per token (TopK); ``activation``: ``topk`` or ``jumprelu``
    (engine/jumprelu.py: per-feature thresholds trained with the straight-through estimator, kernel width
    ``bandwidth`` (of the median starting threshold), the sparsity term's weight ``l0_coeff``, the target L0
    ``k``; per block written in SAELens' jumprelu format); ``max_tokens``,
    ``ctx``: the budget and the window (None: min(CTX, the model's context)); ``epochs``, ``batch_size``, ``lr``
    (default sparsify's); ``seed``; ``overwrite``; ``estimate``: the result is the cost (:class:`SaeEstimate`
    in tasks/fit_sae.py), nothing trained or written."""

    corpus: tuple[str, ...]  # CORPUS... (an input, no option: a path or a list of them, kept as texts)
    layer: int | str | tuple[int | str, ...] | list[int] = option(
        dataclasses.MISSING, "--layer", metavar="L|A-B|L,L|all", show_default=False, cli=list[str],
        help="The block(s), one SAE each, their activations collected in one pass: a block (negative counts from "
        "the end), a range, a list, all; repeat the option for more.")
    out: Path = option(dataclasses.MISSING, "--out", metavar="DIR", show_default=False, cli=Path,
                             help="The folder written: DIR/layers.N per block (DIR/layers.N.mlp for a transcoder).")
    transcoder: bool = option(False, "--transcoder", help="An MLP transcoder (the MLP's input -> its output) instead "
                              "of an SAE on the block's output.")
    clt: bool = option(False, "--clt", help="With --transcoder --layer all: one cross-layer transcoder (each "
                       "block's features read its MLP input and write to the MLP outputs of it and every later "
                       "block), written in circuit-tracer's cross_layer_transcoder layout (DIR/config.yaml, "
                       "W_enc_L, W_dec_L) with per-feature JumpReLU thresholds matching the TopK firing rates.")
    d_sae: int | None = option(None, "--d-sae", min=1, metavar="N", show_default=False,
                               help="Latents (default 8 x d_model).")
    k: int = option(32, "--k", min=1, metavar="N",
                    help="Active latents per token (TopK); jumprelu: the target mean L0 (where thresholds start).")
    activation: Activation = option(Activation.topk, "--activation", case_sensitive=False,
                                    help="topk (k latents per token) or jumprelu (a latent fires above its own "
                                    "threshold, trained with the straight-through estimator and an L0 penalty; "
                                    "written in SAELens' jumprelu format, --clt with its thresholds).")
    bandwidth: float = option(0.05, "--bandwidth", metavar="X",
                              help="jumprelu: the straight-through estimator's kernel width, as a fraction of the "
                              "median starting threshold; one step moves a threshold by at most about that "
                              "fraction.")
    l0_coeff: float = option(1.0, "--l0-coeff", metavar="X", min=0.0,
                             help="jumprelu: the weight of the sparsity term (mean L0 / k - 1)^2 beside the FVU "
                             "(per block).")
    max_tokens: int = option(20000, "--max-tokens", min=4, metavar="N",
                             help="Tokens read from the corpus (the last full window is held out).")
    ctx: int | None = shared.ctx(CTX)
    epochs: int = option(8, "--epochs", min=1, metavar="N", help="Passes over the tokens.")
    batch_size: int = option(256, "--batch-size", min=shared.MIN_ROWS, metavar="N",
                             help="Rows per step (at least 8: each step's loss is its rows' FVU).")
    lr: float | None = option(None, "--lr", metavar="X", show_default=False,
                              help="Adam's learning rate (default sparsify's, 2e-4/sqrt(d_sae/2^14); 4x that "
                                   "for a per-layer transcoder, TopK or JumpReLU; 1x for --clt).")
    seed: int = option(0, "--seed", metavar="N", help="Initialization and shuffling.")
    overwrite: bool = option(False, "--overwrite", help="Write into a folder that is not empty.")
    estimate: bool = shared.estimate("Print the expected cost (tokens, each phase's time, memory) and stop: the "
                                     "weights load for the probes that time the phases; nothing is trained or "
                                     "written (--out is checked, not made).")
    checkpoint: Path | None = option(None, "--checkpoint", metavar="FILE", show_default=False,
                                     help="--clt: save the training's state here (coder, Adam, step) and resume from "
                                     "it when it exists (same settings and tokens only).")
    checkpoint_every: int = option(50, "--checkpoint-every", min=1, metavar="N",
                                   help="--clt: write --checkpoint every N steps and after the last.")

    def __post_init__(self) -> None:
        super().__post_init__()
        given: Any = self.corpus  # a path, or several
        paths = [given] if isinstance(given, (str, Path)) else list(given)
        object.__setattr__(self, "corpus", tuple(str(c) for c in paths))
        object.__setattr__(self, "layer", sites.blocks_text(self.layer))
        object.__setattr__(self, "activation", Activation(self.activation))
        sites.parse_blocks(str(self.layer), None, "--layer", every=True)  # the syntax; the range once opened
        if not self.corpus:
            raise UsageError("fit-sae needs a corpus: CORPUS... (text files, folders of .txt/.md, .jsonl)")
        if "-" in self.corpus:
            raise UsageError("fit-sae reads files, not stdin: give CORPUS paths")
        for source in self.corpus:
            open_source(source)  # a missing path, an empty folder: one line
        if self.out is None:
            raise UsageError("fit-sae needs --out DIR (the folder the SAE is written to)")
        object.__setattr__(self, "out", out_path("--out", self.out, folder=True))
        if self.out.is_dir() and any(self.out.iterdir()) and not self.overwrite:
            raise UsageError(f"--out {self.out} is not empty: give --overwrite to write into it")
        if self.d_sae is not None and self.d_sae < self.k:
            raise UsageError(f"--d-sae {self.d_sae} is below --k {self.k}: give at least k latents")
        if not self.bandwidth > 0:
            raise UsageError(f"--bandwidth {self.bandwidth} is not above 0 (the kernel's width)")
        self.check_jumprelu_only()
        if self.lr is not None and not 0 < self.lr < 1:
            raise UsageError(f"--lr {self.lr} is outside (0, 1)")
        self.check_clt()  # --max-tokens against --ctx: in check, once --ctx is known to fit the model (check_budget)

    def check_budget(self, ctx: int) -> None:
        """UsageError when ``max_tokens`` holds under two windows of ``ctx`` tokens (one is held out)."""
        if self.max_tokens < 2 * ctx:
            raise UsageError(f"--max-tokens {self.max_tokens} is under two --ctx {ctx} windows (one is held out)")

    @property
    def jumprelu(self) -> dict[str, float] | None:
        """The JumpReLU's settings (``bandwidth``, ``l0_coeff``) as the engine takes them; None for TopK."""
        if self.activation is not Activation.jumprelu:
            return None
        return {"bandwidth": self.bandwidth, "l0_coeff": self.l0_coeff}

    def check_jumprelu_only(self) -> None:
        """UsageError when a JumpReLU-only setting (``--bandwidth``, ``--l0-coeff``) is moved from its default
        without ``--activation jumprelu``: a TopK fit has no thresholds and no L0 term, and ignored it silently."""
        if self.activation is Activation.jumprelu:
            return
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        moved = [flag(type(self), name) for name in ("bandwidth", "l0_coeff")
                 if getattr(self, name) != defaults[name]]
        if moved:
            raise UsageError(f"{' and '.join(moved)} {'set' if len(moved) > 1 else 'sets'} a JumpReLU's thresholds "
                             f"and L0 term: give --activation jumprelu too (a TopK fit has neither)")

    def check_clt(self) -> None:
        """--clt needs --transcoder and --layer all; --checkpoint needs --clt (and another path than --out)."""
        if self.clt and not self.transcoder:
            raise UsageError("--clt fits a cross-layer transcoder: give --transcoder too (an SAE has no cross-layer "
                             "form here)")
        if self.clt and str(self.layer) != "all":
            raise UsageError(f"--clt reads every block and writes to every later one: give --layer all, not "
                             f"--layer {self.layer}")
        if self.checkpoint is not None:
            if not self.clt:
                raise UsageError("--checkpoint resumes a --clt fit only (the per-layer fits are not resumable)")
            object.__setattr__(self, "checkpoint", out_path("--checkpoint", self.checkpoint))


@dataclass(frozen=True)
class FitSaePlan:
    blocks: tuple[BlockPlan, ...]  # in block order
    windows: tuple[tuple[int, ...], ...]
    d_sae: int
    ctx: int  # tokens per window: --ctx, else min(CTX, the model's context)

    @property
    def points(self) -> list[str]:
        """Every hook point collected, once each, in block order."""
        return list(dict.fromkeys(p for b in self.blocks for p in b.points))


def full_window_last(wins: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The windows in fit order, the held-out one last: a full window. A shorter last window (the remainder at the
    corpus's or ``--max-tokens``' end) trains and the full window before it is held out, so that the held-out
    check reads ``ctx - 1`` positions: held out, ``--max-tokens 2000 --ctx 64``'s remainder was 16 tokens, and at
    1,992 its 7 positions left every FVE unjudged. With two windows the full one trains (the fit's rows first)."""
    if len(wins) > 2 and len(wins[-1]) < len(wins[-2]):
        return (*wins[:-2], wins[-1], wins[-2])
    return tuple(wins)


def check_windows(wins: Sequence[Sequence[int]], ctx: int) -> None:
    """UsageError when the corpus's ``ctx``-token windows ``wins`` are under two (the last is held out), or when the
    training windows give fewer rows than :data:`anatomy_cli.declare.shared.MIN_ROWS` (8): the loss is each
    batch's FVU, the error over the rows' variance around their own mean, which one row does not have (the loss is
    then the error over 1e-30) and a few do not measure, the bound under which an FVE is not judged (the held-out
    window's, `sae`'s)."""
    from anatomy_cli.engine.sae_fit import rows

    if len(wins) < 2:
        tokens = sum(map(len, wins))
        raise UsageError(f"the corpus gives {counted(tokens, 'token')}, under two --ctx {ctx} windows (one is "
                         "held out): give more text or a smaller --ctx")
    n = rows(wins[:-1])
    if n < shared.MIN_ROWS:
        raise UsageError(f"the corpus gives {counted(n, 'training row')} ({counted(len(wins) - 1, 'window')} of "
                         f"{len(wins[0]):,} tokens, each window's first position left out), under the "
                         f"{shared.MIN_ROWS} a fit needs: its loss is each batch's FVU, the error over the rows' "
                         f"variance around their own mean, which fewer rows do not measure (nor is an FVE judged "
                         f"on fewer): give more text, or a larger --ctx or --max-tokens")


def before_open(spec: ModelSpec, opts: FitSaeOptions) -> None:
    """fit-sae's refusals from a GGUF file's header, before the model opens (the open imports torch: seconds):
    ``--layer`` past the file's blocks, ``--ctx`` past its context (:func:`anatomy_cli.tasks.session.check_early`),
    with the words :func:`check` gives once it is open; then ``--max-tokens`` under two windows of ``--ctx`` (or of
    the default the header's context gives). The CLI and the API (a model given by name or spec)."""
    header = check_early(spec, (str(opts.layer), "--layer"), opts.ctx, every=True)
    if header is not None and header.context_length:  # --ctx checked against the context first: the reason
        opts.check_budget(opts.ctx or default_window(CTX, header.context_length))
