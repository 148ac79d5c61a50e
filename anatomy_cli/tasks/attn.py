"""`attn`: attention weights from one forward with eager attention (the task).

``layer`` and ``head``: one head's query x key pattern; ``layer`` alone: every head of that block from one
query (``position``); neither: every block. Blocks count 0..L−1 (docs/engine.md#layers).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import NamedTuple

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.text.positions import check_position

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.attention import Attention
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "attn"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Attention patterns: how much each query position attends to each key position.

--layer L --head H: the full pattern of one head (query x key). --layer L alone: every head of
layer L, from one query position (--position) to every key. Neither: the same for every layer.
JSON, JSONL, TSV and CSV give one row per weight (layer, head, query_position, key_position,
query_token, key_token, weight); causal models leave out the keys after the query (weight 0).
The table shows a matrix when it fits the terminal, else each row's --top keys.
Patterns come from one forward with eager attention (every other command keeps sdpa).

Examples:

\b
    anatomy attn "The cat sat on the mat" --layer 5 --head 1
    anatomy attn "The cat sat on the mat" --layer 5 --position 3
    anatomy attn "The cat sat on the mat" --format json | jq '.weights[0]'
"""
API_HELP = """`anatomy attn`: attention weights, eager attention. ``layer`` (a block, 0..L−1) and ``head``: one head's
query x key pattern; ``layer``: every head of it from one query (``position``); neither: every block.
``result``: Attention (``grid``: [layers, heads, queries, keys]); rows: ``weights`` (one per weight)."""


@dataclass(frozen=True)
class AttnOptions(Declared):
    """``layer``/``head``/``position``: negative counts from the end; ``k``: top keys per row in a table too
    wide for the terminal."""

    layer: int | None = option(None, "--layer", "-l", metavar="L", show_default=False,
                               help="Block (0-based; negative counts from the last). Default: every block.")
    head: int | None = option(None, "--head", metavar="H", show_default=False,
                              help="Head within --layer: show its full pattern, query position x key position.")
    position: int | None = option(
        None, "--position", "-p", metavar="N", show_default=False,
        help="Query position when showing several heads (negative counts from the end). Default: the last "
             "token; for encoders the last one that is not [SEP]/[CLS].")
    k: int = option(3, "--top", "-k", "--k", min=1, metavar="N",
                    help="Top keys per row in a table too wide for the terminal.")
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:

        super().__post_init__()
        if self.head is not None and self.layer is None:
            raise UsageError("--head needs --layer: give the layer the head belongs to")
        if self.head is not None and self.position is not None:
            raise UsageError("--position picks the query row when showing several heads; with --head every row "
                             "is shown")

    @property
    def one_head(self) -> bool:
        return self.head is not None


@dataclass(frozen=True)
class AttnPlan:
    layers: list[int]
    heads: list[int]
    queries: list[list[int]]  # per prompt: the query rows shown


def check(opened: Opened, opts: AttnOptions, encoded: Sequence[Encoded] = ()) -> AttnPlan:
    """The blocks, heads and query rows to show; UsageError for --layer/--head/--position out of range."""
    n_layers, n_heads = opened.info.n_layers, opened.info.n_heads
    layers = [sites.check_block(opts.layer, n_layers, "--layer")] if opts.layer is not None else list(range(n_layers))
    if opts.head is not None and not -n_heads <= opts.head < n_heads:
        raise UsageError(f"--head {opts.head} is out of range: {opened.name} has {n_heads} heads per layer "
                         f"(use 0..{n_heads - 1}, or -{n_heads}..-1 from the end)")
    check_position(opts.position, encoded)
    heads = [opts.head % n_heads] if opts.head is not None else list(range(n_heads))
    queries = [list(range(len(e))) if opts.one_head else [_query(e, opts.position)] for e in encoded]
    return AttnPlan(layers, heads, queries)


def _query(enc: Encoded, position: int | None) -> int:
    if position is not None:
        return position % len(enc)
    text = [i for i, special in enumerate(enc.special) if not special]  # an encoder's last token is [SEP]
    return text[-1] if text else len(enc) - 1


class AttnRun(NamedTuple):
    """One prompt's patterns: ``attention``, what the command reports; for an HTML page (``run``'s ``pooling``)
    every head's pattern too, ``pooled`` ``[n_layers, n_heads, m, m]`` in blocks of ``block`` positions."""

    attention: Attention
    pooled: torch.Tensor | None = None
    block: int = 1


# (block_factor(n, n_heads_total, causal), pool(pattern, block)): how an HTML page shrinks the patterns
# (anatomy_cli/output/html/attn.py), handed over by the view that draws it.
Pooling = tuple[Callable[[int, int, bool], int], Callable[["torch.Tensor", int], "torch.Tensor"]]


def run(lm: LoadedModel, encoded: list[Encoded], opts: AttnOptions, plan: AttnPlan,
        pooling: Pooling | None = None) -> list[AttnRun]:
    """One AttnRun per prompt, from one forward with eager attention. ``pooling``: an HTML page switches between
    every layer and head, so the same forward keeps every head's pattern, pooled (a long prompt's full patterns
    never stay in memory)."""
    from anatomy_cli.analyses import attention as analysis

    pooled: list[torch.Tensor | None] = [None] * len(encoded)
    blocks = [1] * len(encoded)
    if pooling is not None:
        pooled, blocks, grids = _all_heads(lm, encoded, plan, opts.batch_size, pooling)
    else:
        grids = engine.attention_patterns(lm, encoded, layers=plan.layers, batch_size=opts.batch_size,
                                          reduce=lambda i, _layer, p: p[plan.heads][:, plan.queries[i]])
    return [AttnRun(analysis.attention(grid, layers=plan.layers, heads=plan.heads, queries=q, tokens=enc.pieces,
                                       causal=lm.is_causal), full, block)
            for enc, grid, q, full, block in zip(encoded, grids, plan.queries, pooled, blocks)]


def _all_heads(lm: LoadedModel, encoded: list[Encoded], plan: AttnPlan, batch_size: int,
               pooling: Pooling) -> tuple[list[torch.Tensor | None], list[int], list[torch.Tensor]]:
    """From one forward: every head's pattern ``[n_layers, n_heads, m, m]`` per prompt, pooled into blocks when
    the prompt is long, the block size per prompt, and the exact rows the table shows
    (``[layers, heads, queries, pos]``)."""
    import torch

    block_factor, pool = pooling
    blocks = [block_factor(len(e), lm.n_layers * lm.n_heads, lm.is_causal) for e in encoded]
    exact: dict[tuple[int, int], torch.Tensor] = {}

    def reduce(i: int, layer: int, pattern: torch.Tensor) -> torch.Tensor:
        if layer in plan.layers:
            exact[i, layer] = pattern[plan.heads][:, plan.queries[i]].to("cpu", copy=True)
        return pool(pattern, blocks[i])

    full = engine.attention_patterns(lm, encoded, batch_size=batch_size, reduce=reduce)
    grids = [torch.stack([exact[i, layer] for layer in plan.layers]) for i in range(len(encoded))]
    return list(full), blocks, grids


def carried(result: AttnRun) -> Attention:
    """What the API's Result carries: the patterns shown."""
    return result.attention


OPTIONS = AttnOptions  # the options class the driver generates the CLI options and API keywords from
