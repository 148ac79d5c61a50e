"""`attn`: attention weights from one forward with eager attention (the task).

``layer`` and ``head``: one head's query x key pattern; ``layer`` alone: every head of that block from one
query (``position``); neither: every block. Blocks count 0..L−1 (docs/engine.md#layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.attention import Attention
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "attn"


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
    from anatomy_cli.text.positions import check_position

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


def run(lm: LoadedModel, encoded: list[Encoded], opts: AttnOptions, plan: AttnPlan,
        grids: Sequence[torch.Tensor] | None = None) -> list[Attention]:
    """One Attention per prompt. ``grids``: the ``[layers, heads, queries, keys]`` weights when the caller
    already ran the forward (an HTML page keeps every head too); else this runs it."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import attention as analysis

    if grids is None:
        grids = engine.attention_patterns(lm, encoded, layers=plan.layers, batch_size=opts.batch_size,
                                          reduce=lambda i, _layer, p: p[plan.heads][:, plan.queries[i]])
    return [analysis.attention(grid, layers=plan.layers, heads=plan.heads, queries=q, tokens=enc.pieces,
                               causal=lm.is_causal) for enc, grid, q in zip(encoded, grids, plan.queries)]
