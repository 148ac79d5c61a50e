"""`trace`: one position followed through the residual stream, row by row, with the logit lens (the task).

Rows are named as everywhere (docs/engine.md#layers): ``embed``, then block N's output as N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import NamedTuple

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.models import lens_choice
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._checks import TargetFields
from anatomy_cli.tasks.lens import check_unembed_hash
from anatomy_cli.tasks.lens import fitted_lens
from anatomy_cli.tasks.session import describe
from anatomy_cli.text.positions import check_position
from anatomy_cli.text.records import token_record
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.trace import Trace
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "trace"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Follow one token position through every layer: how much of the embedding survives, what each
layer adds, and what the model would predict if it stopped there (the logit lens).

One row for the embedding (embed), then one per block's output (0..L-1): cosine to the embedding
and to the previous row, the residual norm, the norms of what that block's attention and MLP
added, and the logit lens's top token and probability.
Then the model's own top-k next tokens. Encoders (BERT) have no next token: for them the lens
and top-k read the masked-LM head at the position, or are omitted when there is no head.

Examples:

\b
    anatomy trace "Thank you very"
    anatomy trace "Thank you very" --position 1 --top 10
    anatomy trace "Thank you very" --init random --format json
    printf 'Thank you very\\nThe capital of France is\\n' | anatomy trace - --format jsonl
"""
API_HELP = """`anatomy trace`: one position followed through the residual stream (rows ``embed``, then blocks 0..L−1:
cosines, norms, the logit lens), and the model's top ``k`` next tokens. ``lens``: ``logit``, ``tuned:DIR`` or
``jacobian:FILE`` (the lens columns' lens). ``result``: Trace; rows: ``layers`` (n_layers + 1)."""


@dataclass(frozen=True)
class TraceOptions(Declared, TargetFields):
    """``position``: the token to follow (None: the last, an encoder's last text token); ``k``: how many of the
    model's top next tokens to list; ``target``/``target_id``: a token ranked in every row's lens; ``lens``:
    ``logit``, ``tuned:DIR`` or ``jacobian:FILE`` (docs/commands/lens.md#fitted-lenses)."""

    position: int | None = option(
        None, "--position", "-p", metavar="N", show_default=False,
        help="Token position to follow (0-based; negative counts from the end, -1 = last token). "
             "Default: the last token; for encoders the last one that is not [SEP]/[CLS].")
    k: int = option(5, "--top", "-k", "--k", min=1, metavar="N", help="How many top next tokens to list.")
    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    first_token: bool = shared.first_token()
    lens: str = shared.lens("The lens of the lens columns: logit, a tuned-lens directory or a Jacobian lens file.")
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lens", lens_choice.parse(self.lens).text)  # UsageError for a bad --lens
        self.check_target()


@dataclass(frozen=True)
class TracePlan:
    target_id: int | None
    fitted: FittedLens | None = None


class Traced(NamedTuple):
    """One prompt's run: the position followed, the Trace, the target's token record (None without one)."""

    position: int
    trace: Trace
    target: dict[str, object] | None


def check(opened: Opened, opts: TraceOptions, encoded: Sequence[Encoded] = ()) -> TracePlan:
    """``opened``: an OpenedModel or a LoadedModel. Refuses a position outside a prompt of ``encoded`` and a
    target on a model without an LM head (the lens reads tokens through it)."""
    check_position(opts.position, encoded)
    fitted = fitted_lens(opened, opts.lens)
    if fitted is not None:
        require(opened.info, Need.lm_head, command="trace --lens")
    if opts.wanted is None:
        return TracePlan(None, fitted)
    require(opened.info, Need.lm_head, command="trace --target")
    return TracePlan(opts.target_id_in(opened), fitted)


def run(lm: LoadedModel, encoded: list[Encoded], opts: TraceOptions, plan: TracePlan) -> list[Traced]:
    from anatomy_cli.analyses import trace as analysis

    if opts.position is None:
        # An encoder's last token is its [SEP]: follow the last token of the text instead.
        positions = [[_last_text_token(enc)] for enc in encoded]
    else:
        positions = [[opts.position]] * len(encoded)
    names = engine.residual_names(lm) + engine.layer_names(lm, "attn_out") + engine.layer_names(lm, "mlp_out")
    if lm.has_unembed:
        names.append("logits")
    with notes.status(f"running {counted(len(encoded), 'prompt')}"):
        caches = engine.run(lm, encoded, names, positions=positions, batch_size=opts.batch_size)
    name_token = describe(lm)
    target_id = plan.target_id
    fitted = plan.fitted
    if fitted is not None:
        check_unembed_hash(lm, fitted)
    out = []
    for cache in caches:
        resid = cache.residual_stream()[:, 0]
        read = resid if fitted is None else fitted.transform(resid[:, None])[:, 0]
        result = analysis.trace(
            resid, attn_out=cache.stack("attn_out")[:, 0], mlp_out=cache.stack("mlp_out")[:, 0],
            lens_logits=engine.unembed(lm, read) if lm.has_unembed else None,
            logits=cache.logits[0] if lm.has_unembed else None, k=opts.k, describe=name_token,
            target_id=target_id, lens_rows=None if fitted is None else fitted.rows)
        if fitted is not None:
            result = replace(result, lens=fitted.kind, lens_source=str(fitted.path))
        target_info = token_record(target_id, *name_token(target_id)) if target_id is not None else None
        out.append(Traced(cache.positions[0], result, target_info))
    return out


def _last_text_token(enc: Encoded) -> int:
    text_positions = [i for i, special in enumerate(enc.special) if not special]
    return text_positions[-1] if text_positions else len(enc) - 1


OPTIONS = TraceOptions  # the options class the driver generates the CLI options and API keywords from


def carried(result: Traced) -> object:
    """What the API's Result carries of one prompt's result."""
    return result.trace
