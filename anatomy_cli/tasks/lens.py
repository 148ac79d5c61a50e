"""`lens`: the logit lens at every residual-stream row and position, optionally following a target (the task).

Rows are named as everywhere (docs/engine.md#layers): ``embed``, then block N's output as N; ``layers`` picks
rows by those names (the last block always kept), ``stride`` every N-th row (``embed``, then every N-th after
it) and the last.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING
from typing import cast

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models import lens_choice
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._checks import TargetFields
from anatomy_cli.tasks.session import describe
from anatomy_cli.tasks.session import warn_cost
from anatomy_cli.text import targets

if TYPE_CHECKING:
    from anatomy_cli.analyses.lens import LensGrid
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "lens"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """The logit lens at every layer and position: what the model would predict if it stopped there.

A grid with rows embed, 0, ..., L-1 (the embedding, then each block's output) and the prompt's
positions as columns; each cell is the most probable token of unembed(final_norm(h)) at that row
and position, with --stat's number. --target adds the target's rank and probability in every cell
and, per position, the first row (embed or block) where it is the top token. The table shows the
grid; tsv/csv/json give one row per cell.

Examples:

\b
    anatomy lens "The capital of Germany is"
    anatomy lens "The capital of Germany is" --target " Berlin" --stat rank
    anatomy lens "Thank you very" --stride 4 --stat entropy
    anatomy lens "Thank you very" --layers embed,5,11 --top 3 --format json
    anatomy lens "The capital of Germany is" --lens jacobian:lens.pt
"""
API_HELP = """`anatomy lens`: the logit lens at every residual-stream row (``embed``, then blocks 0..L−1) and position.
``layers``: the rows to show (``["embed", 0, 6]`` or ``"embed,0,6"``); ``lens``: ``logit``, ``tuned:DIR`` or
``jacobian:FILE`` (a fitted lens, docs/commands/lens.md#fitted-lenses). ``result``: LensGrid; rows: ``cells``
(one per row x position)."""


class Stat(str, Enum):
    prob = "prob"
    logprob = "logprob"
    rank = "rank"
    entropy = "entropy"
    kl = "kl"


@dataclass(frozen=True)
class LensOptions(Declared, TargetFields):
    """``stat``: the number each cell shows; ``layers``: the rows to show (``embed`` or block numbers, a list or
    the text ``embed,0,6,11``); ``stride``: every N-th row; ``k``: top tokens per cell (None: 1, no lists);
    ``lens``: ``logit`` (default), ``tuned:DIR`` (a tuned-lens directory) or ``jacobian:FILE`` (a Jacobian lens
    file): the lens each row is read through (docs/commands/lens.md#fitted-lenses)."""

    stat: Stat = option(Stat.prob, "--stat", "-s", case_sensitive=False,
                        help="The number shown in each cell ('rank' needs --target).")
    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    first_token: bool = shared.first_token()
    layers: list[int | str] | str | None = option(
        None, "--layers", metavar="embed,N,...", show_default=False, cli=str | None,
        help="Show only these rows: embed and block numbers (embed,0,6,11); the last block is always kept.")
    stride: int | None = option(None, "--stride", min=1, metavar="N", show_default=False,
                                help="Show every N-th row (embed, block N-1, 2N-1, ...) and the last block.")
    k: int | None = option(None, "--top", "-k", "--k", min=1, metavar="N", show_default=False,
                           help="The N most probable tokens per cell (JSON 'top'; the table lists them in the cell).")
    lens: str = shared.lens("The lens: logit, a tuned-lens directory (tuned:DIR) or a Jacobian lens file "
                            "(jacobian:FILE).")
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lens", lens_choice.parse(self.lens).text)  # UsageError for a bad --lens
        object.__setattr__(self, "stat", Stat(self.stat).value)  # ValueError for an unknown statistic
        self.check_target()
        if self.stat == "rank" and self.wanted is None:
            raise UsageError("--stat rank is the target's rank: give --target TEXT or --target-id N")
        if self.layers is not None and self.stride is not None:
            raise UsageError("--layers and --stride both thin the rows: give one of them")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(sites.parse_blocks(sites.blocks_text(self.layers), None,
                                                                        "--layers", embed=True)))


@dataclass(frozen=True)
class LensPlan:
    rows: tuple[int | str, ...]  # the row names to show, in stream order, the last block always included
    target_id: int | None
    fitted: FittedLens | None = None  # a fitted lens (its tensors memory-mapped, not read yet)
    unfitted: tuple[int | str, ...] = ()  # rows asked for (or shown by default) that the fitted lens cannot read


def rows(n_layers: int, layers: tuple[int | str, ...] | None, stride: int | None) -> tuple[int | str, ...]:
    """The row names to show, in stream order: ``layers`` (checked against the model) or every ``stride``-th
    row, and the last block always."""
    if layers is not None:
        picked = {sites.residual_row(v if v == sites.EMBED else sites.check_block(int(v), n_layers, "--layers"))
                  for v in layers}
    else:
        picked = set(range(0, n_layers + 1, stride or 1))
    return tuple(sites.residual_label(r) for r in sorted(picked | {n_layers}))


def check(opened: Opened, opts: LensOptions) -> LensPlan:
    """``opened``: an OpenedModel or a LoadedModel. Refuses a model without an LM head, bad rows, a bad target."""
    require(opened.info, Need.lm_head, command=COMMAND)
    layers = cast("tuple[int | str, ...] | None", opts.layers)  # a tuple once __post_init__ has read it
    shown = rows(opened.info.n_layers, layers, opts.stride)
    wanted = opts.wanted
    target_id = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=opened.name,
                                                            vocab_size=opened.info.lm_head_rows)
    fitted = fitted_lens(opened, opts.lens)
    if fitted is None:
        return LensPlan(shown, target_id)
    readable = {sites.residual_label(r) for r in fitted.rows}
    return LensPlan(tuple(r for r in shown if r in readable), target_id, fitted,
                    tuple(r for r in shown if r not in readable))


def fitted_lens(opened: Opened, lens: str | None, *, command: str = COMMAND) -> FittedLens | None:
    """The fitted lens ``lens`` names (None or ``logit``: the logit lens, None), checked against ``opened``'s
    width and block count from its header, before the model's weights load: the one reading of ``--lens`` for
    every command (``command`` names it in the refusal). Refuses an encoder (a fitted lens reads next tokens)."""
    from anatomy_cli.engine import fitted_lens as fitted

    choice = lens_choice.parse(lens)
    if choice.kind == "logit":
        return None
    require(opened.info, Need.decoder, command=f"{command} --lens {choice.kind}")
    return fitted.open_lens(choice, d_model=opened.info.d_model, n_layers=opened.info.n_layers)


def run(lm: LoadedModel, encoded: list[Encoded], opts: LensOptions, plan: LensPlan,
        k: int | None = None) -> list[LensGrid]:
    """One grid per prompt, thinned to ``plan.rows``. ``k``: top tokens per cell to compute when more than
    ``opts.k`` are wanted (an HTML page's hover text); the grid then lists ``k`` (see ``LensGrid.keep_top``)."""
    from anatomy_cli.analyses import lens as analysis

    n_tokens = sum(len(e) for e in encoded)
    warn_cost(f"lens on {n_tokens:,} tokens", lm,
              sum(cost.forward_flops(lm.info, len(e)) + cost.lens_flops(lm.info, len(e)) for e in encoded))
    with notes.status(f"running {lm.name}"):
        caches = engine.run(lm, encoded, engine.residual_names(lm), batch_size=opts.batch_size)
    name_token = describe(lm)
    fitted = plan.fitted
    if fitted is not None:
        check_unembed_hash(lm, fitted)
    grids = []
    for i, cache in enumerate(caches, start=1):
        what = f"lens · prompt {i}/{len(encoded)}" if len(encoded) > 1 else "lens"
        resid = cache.residual_stream()
        with notes.status(what) as line:
            grid = analysis.lens_grid(resid if fitted is None else fitted.transform(resid),
                                      lambda h: engine.unembed(lm, h), describe=name_token,
                                      positions=cache.positions, k=k or opts.k, target_id=plan.target_id,
                                      progress=line.counter(what, "positions"),
                                      rows=None if fitted is None else fitted.rows)
        if fitted is not None:
            grid = replace(grid, lens=fitted.kind, lens_source=str(fitted.path), unfitted=plan.unfitted)
        grids.append(grid.select(plan.rows))
    if fitted is not None:
        read_check = when_run("tasks._lens_check").read_check

        with notes.status("checking the fitted lens against the logit lens"):
            read_check(lm, fitted, [cache.residual_stream() for cache in caches])
    return grids


def check_unembed_hash(lm: LoadedModel, fitted: FittedLens) -> None:
    """A tuned lens records tuned-lens' hash of the LM head it was fitted with: warn when this model's differs."""
    from anatomy_cli.engine.fitted_lens import unembed_hash

    if fitted.unembed_hash is None:
        return
    head = lm.model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None and unembed_hash(weight) != fitted.unembed_hash:
        base = f" (fitted for {fitted.base_model})" if fitted.base_model else ""
        notes.warn(f"the tuned lens {fitted.path}{base} records another LM head (unembed_hash differs from "
                   f"{lm.name}'s): it may have been fitted on another model")


OPTIONS = LensOptions  # the options class the driver generates the CLI options and API keywords from
