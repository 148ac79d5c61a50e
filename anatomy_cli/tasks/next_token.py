"""`next`: the next-token distribution after each prompt, and a target token's rank (the task).

The pattern every task follows: a frozen options dataclass whose ``__post_init__`` refuses what needs no model;
:func:`check` makes every refusal that needs the opened model (its capability record, its tokenizer) before any
weight loads and returns what it resolved; :func:`run` computes the result objects. The CLI parses its options
into :class:`NextOptions`; the API builds the same object from its keywords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._checks import TargetFields
from anatomy_cli.tasks.session import describe
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.next_token import NextTokens
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "next"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """The model's next-token distribution after PROMPT: rank, token, id, probability, log-probability.

Probabilities are a float64 softmax over the whole vocabulary at the last position.
Needs a decoder-only model with an LM head (encoders such as BERT are refused).

Examples:

\b
    anatomy next "Thank you very"
    anatomy next "Thank you very" --target " much" --top 5
    anatomy next "Thank you very" --target-id 881
    anatomy next "Thank you very" --init random --format json
    printf 'Thank you very\\nThe capital of France is\\n' | anatomy next - --format jsonl
"""
API_HELP = """`anatomy next`: the next-token distribution after the prompt (float64 softmax at the last position).
``result``: NextTokens; rows: ``top`` (k)."""


@dataclass(frozen=True)
class NextOptions(Declared, TargetFields):
    """``k``: how many of the most probable tokens to list; ``target``/``target_id``: a token whose rank and
    probability are reported (``first_token``: the first token of a several-token TEXT)."""

    k: int = option(10, "--top", "-k", "--k", min=1, metavar="N", help="How many of the most probable tokens to list.")
    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    first_token: bool = shared.first_token()
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_target()


@dataclass(frozen=True)
class NextPlan:
    target_id: int | None


def check(opened: Opened, opts: NextOptions) -> NextPlan:
    """``opened``: an OpenedModel or a LoadedModel (anything with ``info``, ``tokenizer``, ``name``)."""
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    return NextPlan(opts.target_id_in(opened))


def run(lm: LoadedModel, encoded: list[Encoded], opts: NextOptions, plan: NextPlan) -> list[NextTokens]:
    from anatomy_cli.analyses import next_token as analysis

    with notes.status(f"running {counted(len(encoded), 'prompt')}"):
        caches = engine.run(lm, encoded, ["logits"], positions=[[-1]] * len(encoded), batch_size=opts.batch_size)
    name_token = describe(lm)
    return [analysis.next_tokens(cache.logits[0], opts.k, name_token, target_id=plan.target_id) for cache in caches]


OPTIONS = NextOptions  # the options class the driver generates the CLI options and API keywords from
