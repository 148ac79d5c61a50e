"""`dla`: direct logit attribution of a target's logit (minus a foil's) to the embedding, layers and heads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models.adapters import heads_split
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import refusal
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.text.positions import check_position
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.dla import Attribution
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "dla"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Direct logit attribution: how much each component wrote the target's logit at one position.

One row per contribution: the embedding (and position embedding), each layer's attention and
MLP output (--by head: each head, plus the attention output projection's bias), and a final
'bias' row. With --foil the rows explain logit(target) - logit(foil). The final norm's scale is
frozen at its value for the final residual; the rows add up to the model's own logit (JSON
'total' and 'logit'). Soft-capped models (Gemma 2) are decomposed before the soft-capping.

Examples:

\b
    anatomy dla "The capital of Germany is" --target " Berlin"
    anatomy dla "The capital of Germany is" --target " Berlin" --foil " Paris" --by head
    anatomy dla "Thank you very" --target-id 881 --format json
    anatomy dla "The capital of Germany is" --target " Berlin" --by head --top 10 --sort abs
"""
API_HELP = """`anatomy dla`: direct logit attribution of logit(target) (minus logit(foil)) at ``position``; the rows add
up to the model's own logit. ``result``: Attribution (the rows ``top``/``sort`` keep); rows: ``rows`` (one per
component)."""


class By(str, Enum):
    layer = "layer"
    head = "head"
    expert = "expert"  # MoE models: each chosen expert (and the shared expert) of every MoE block


class Sort(str, Enum):
    model = "model"
    abs = "abs"
    value = "value"


@dataclass(frozen=True)
class DlaOptions(Declared, TokenPair):
    """The target (and foil) whose logit is decomposed at ``position`` (None: the last); ``by`` layer or head;
    ``top``/``sort``: which rows the report keeps and their order (the sum stays the logit)."""

    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    foil: str | None = shared.foil()
    foil_id: int | None = shared.foil_id()
    first_token: bool = shared.first_token(foil=True)
    position: int | None = option(None, "--position", "-p", metavar="N", show_default=False,
                                  help="The position whose logit is decomposed (0-based; negative counts from the "
                                  "end). Default: the last.")
    by: By = option(By.layer, "--by", case_sensitive=False,
                    help="'head': one row per attention head (plus the output projection's bias) instead of one per "
                    "attention layer; 'expert' (MoE models): one row per chosen expert (and the shared expert) of "
                    "each MoE block instead of its MLP row.")
    top: int | None = option(None, "--top", "-k", min=1, metavar="N", show_default=False,
                             help="Keep the N rows of largest |contribution|; the rest are summed into one 'other' "
                             "row, so the rows still add up to the logit. Default: every row.")
    sort: Sort = option(Sort.model, "--sort", case_sensitive=False,
                        help="Row order: 'model' (embedding, blocks in order, bias), 'abs' (largest |contribution| "
                        "first) or 'value' (most positive first).")
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "by", By(self.by))
        object.__setattr__(self, "sort", Sort(self.sort))
        self.require_target("dla needs a token: give --target TEXT or --target-id N")
        self.check_tokens()


@dataclass(frozen=True)
class DlaPlan:
    ids: dict[str, int | None]  # {"target": id, "foil": id or None}


@dataclass(frozen=True)
class DlaResult:
    """One prompt's attribution at ``position``: ``full`` (every row, what the picture draws) and ``shown`` (the
    rows ``--top``/``--sort`` keep, what the report lists; 'other' sums the rest)."""

    position: int
    full: Attribution
    shown: Attribution
    ids: dict[str, int | None]
    by: By


def check(opened: Opened, opts: DlaOptions, encoded: list[Encoded]) -> DlaPlan:
    """Every refusal before the weights load: an encoder or a model without LM head, a post-LN model, heads that
    do not split (``--by head``), a position outside a prompt, the tokens (a foil equal to the target)."""
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    adapter = opened.info.adapter
    if adapter.post_ln:
        raise UsageError(f"dla needs a linear path from the residual stream to the logits; {opened.name} "
                         f"({adapter.name}) is post-LN (a norm after every block's residual sum), so its logits "
                         "are not a sum of per-component terms")
    if opts.by is By.head and heads_split(adapter) is None:
        raise UsageError(refusal(opened.info, Need.separable_heads, f"{COMMAND} --by head") + "; use --by layer")
    if opts.by is By.expert:
        require(opened.info, Need.moe, command=f"{COMMAND} --by expert")
    check_position(opts.position, encoded)
    return DlaPlan(opts.resolve(opened))


def run(lm: LoadedModel, encoded: list[Encoded], opts: DlaOptions, plan: DlaPlan) -> list[DlaResult]:
    from anatomy_cli.analyses import dla as analysis
    from anatomy_cli.engine import decompose

    by_head, by_expert = opts.by is By.head, opts.by is By.expert
    pos = -1 if opts.position is None else opts.position
    target, foil = plan.ids["target"], plan.ids["foil"]
    assert target is not None
    with notes.status(f"running {counted(len(encoded), 'prompt')}"):
        caches = engine.run(lm, encoded, decompose.names(lm, by_head=by_head, by_expert=by_expert),
                            positions=[[pos]] * len(encoded), batch_size=opts.batch_size)
    unembedding = decompose.unembedding_direction(lm, target, foil)
    out = []
    for cache in caches:
        full = analysis.logit_attribution(lm, cache, target, foil, by_head=by_head, by_expert=by_expert,
                                          unembedding=unembedding)
        if (mismatch := full.mismatch()) is not None:
            notes.warn(mismatch)
        out.append(DlaResult(cache.positions[0], full, full.select(opts.top, opts.sort.value), plan.ids, opts.by))
    return out


def carried(result: DlaResult) -> object:
    """What the API's Result carries of one prompt's result."""
    return result.shown


OPTIONS = DlaOptions  # the options class the driver generates the CLI options and API keywords from
