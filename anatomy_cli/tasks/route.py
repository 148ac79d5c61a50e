"""`route`: per MoE block and position, the experts the router chose, their weights, its entropy and margin.

Refused before any weight loads: a dense model (``Need.moe``, naming its family), a ``--block`` past the model or
naming a block whose MLP is dense (Qwen2/3-MoE's ``mlp_only_layers``), ``--top`` above the model's k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.route import RouteRow
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "route"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Which experts each token is routed to in each mixture-of-experts block, and how close to a flip.

One row per MoE block and position: the chosen experts, heaviest first, with the weights the block
applies (softmax over the experts, top k, the family's normalisation), the router's entropy (nats) and
the margin between the k-th and the (k+1)-th router probability; a margin below 0.01 is a near tie.
Needs an MoE model (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE); a dense model is refused.

Examples:

\b
    anatomy route "Thank you very" --model ./tiny-mixtral
    anatomy route "Thank you very" --model ./tiny-mixtral --block 0 --top 1 --format json
    anatomy route "Thank you very" --model ./tiny-mixtral --plot route.html
    printf 'Hello\\nThe capital of France is\\n' | anatomy route - --model ./tiny-olmoe --format jsonl
"""
API_HELP = """`anatomy route`: per MoE block and position, the chosen experts (heaviest first), the weights the block
applies, the router's entropy (nats) and the margin between the k-th and (k+1)-th router probability.
``block``: ``"0,2"``, ``1`` (None: every MoE block). ``result``: RouteResult; rows: ``rows``."""


@dataclass(frozen=True)
class RouteOptions(Declared):
    """``block``: the blocks to show (``0,2``, ``1-3``, ``-1``; None: every MoE block); ``top``: list the first
    ``top`` of the k chosen experts (None: all k)."""

    block: str | int | None = option(
        None, "--block", metavar="N,...", show_default=False, cli=str | None,
        help="Only these blocks (0,2 or 1-3; negative counts from the last); default every MoE block.")
    top: int | None = option(None, "--top", min=1, metavar="N", show_default=False,
                             help="List the first N of the chosen experts (default all k).")
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block is not None:
            sites.parse_blocks(str(self.block), None, "--block")


@dataclass(frozen=True)
class RoutePlan:
    blocks: tuple[int, ...]
    top_k: int


@dataclass(frozen=True)
class RouteResult:
    """One prompt's routing: a row per (block, position), blocks in the order asked, positions in order."""

    rows: tuple[RouteRow, ...]
    n_experts: int
    top_k: int
    rule: str
    norm_topk_prob: bool
    shared_expert: bool
    near_tie_threshold: float

    def top_experts(self) -> tuple[list[int], list[list[int]]]:
        """``(blocks, ids)``: the blocks in the rows' order and ``ids[block row][position]``, the expert with the
        largest weight at each (the picture's cells)."""
        blocks = list(dict.fromkeys(r.block for r in self.rows))
        by_block: dict[int, list[int]] = {b: [] for b in blocks}
        for r in self.rows:
            by_block[r.block].append(r.experts[0])
        return blocks, [by_block[b] for b in blocks]

    def to_dict(self) -> dict[str, object]:
        return {"n_experts": self.n_experts, "top_k": self.top_k, "rule": self.rule,
                "norm_topk_prob": self.norm_topk_prob, "shared_expert": self.shared_expert,
                "near_tie_threshold": self.near_tie_threshold, "rows": [r.to_dict() for r in self.rows]}


def check(opened: Opened, opts: RouteOptions) -> RoutePlan:
    """``opened``: an OpenedModel or a LoadedModel (anything with ``info``)."""
    info = opened.info
    require(info, Need.moe, command=COMMAND)
    moe = info.moe
    assert moe is not None  # require(Need.moe) refused a model without one
    if opts.block is None:
        blocks = list(moe.sparse_blocks)
    else:
        blocks = [int(b) for b in sites.parse_blocks(str(opts.block), info.n_layers, "--block")]
        dense = [b for b in blocks if b not in moe.sparse_blocks]
        if dense:
            raise UsageError(f"--block {dense[0]}: that block of {info.display_name} has a dense MLP, "
                             f"no router; its MoE blocks are {_list(moe.sparse_blocks)}")
    if opts.top is not None and opts.top > moe.top_k:
        raise UsageError(f"--top {opts.top} is more than the {moe.top_k} experts this model routes each token to")
    return RoutePlan(tuple(blocks), moe.top_k)


def run(lm: LoadedModel, encoded: list[Encoded], opts: RouteOptions, plan: RoutePlan) -> list[RouteResult]:
    from anatomy_cli.analyses import route as analysis

    moe = lm.info.moe
    assert moe is not None  # check() refused a dense model
    names = [sites.name(b, p) for b in plan.blocks for p in sites.ROUTER_POINTS]
    with notes.status(f"running {counted(len(encoded), 'prompt')}"):
        caches = engine.run(lm, encoded, names, batch_size=opts.batch_size)
    out = []
    for enc, cache in zip(encoded, caches):
        rows: list[RouteRow] = []
        for b in plan.blocks:
            rows += analysis.block_rows(b, cache["router_logits", b], cache["expert_indices", b],
                                        cache["expert_weights", b], list(enc.pieces), opts.top)
        out.append(RouteResult(tuple(rows), moe.n_experts, moe.top_k, moe.rule, moe.norm_topk_prob,
                               moe.shared_expert, analysis.NEAR_TIE))
    return out


def _list(blocks: tuple[int, ...]) -> str:
    return ", ".join(str(b) for b in blocks)


OPTIONS = RouteOptions  # the options class the driver generates the CLI options and API keywords from
