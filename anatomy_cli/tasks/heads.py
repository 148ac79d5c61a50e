"""`heads`: five scores per attention head, on a prompt (or the random sequence) and on random tokens repeated
(the task). Heads are numbered by their block, 0..L−1 (docs/engine.md#layers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple
from typing import Optional

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.declare.inputs import Arg
from anatomy_cli.declare.inputs import Inputs
from anatomy_cli.errors import PromptTooLong
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.session import warn_cost
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from collections.abc import Callable

    from anatomy_cli.analyses.heads import Heads
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "heads"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """What each attention head does: one row per (layer, head) with five scores.

entropy (nats), first_token (mass on position 0, the attention sink) and prev_token (weight on
the previous position) are measured on PROMPT, or on the random sequence without one;
induction and duplicate_token on --seq-len random ordinary tokens (seed --seed) repeated twice.
Definitions and sources: docs/commands/heads.md. One forward with eager attention; the
scores are computed layer by layer.

Examples:

\b
    anatomy heads --sort induction --top 5
    anatomy heads "The cat sat on the mat. The cat" --sort prev_token
    anatomy heads --seq-len 100 --seed 1 --format json
"""
API_HELP = """`anatomy heads`: five scores per attention head; entropy, first_token, prev_token on the prompt (or the
random sequence without one), induction and duplicate_token on ``seq_len`` random tokens repeated.
``result``: Heads; rows: ``heads`` (n_layers x n_heads, or ``top``)."""

# The prompt is optional: without one, entropy, first_token and prev_token are measured on the random sequence.
TAKES = Inputs((Arg("prompt", "[PROMPT]", "Measure entropy, first_token and prev_token on this text ('-': one prompt "
                    "per stdin line). Default: on the random sequence.", api="str | list[str] | None",
                    cli=Optional[str], default=None, prompts=True),))


class Score(str, Enum):
    entropy = "entropy"
    first_token = "first_token"
    prev_token = "prev_token"
    induction = "induction"
    duplicate_token = "duplicate_token"


@dataclass(frozen=True)
class HeadsOptions(Declared):
    """``seq_len``: random tokens per copy of the repeated sequence, drawn with ``seed``; ``sort``: a
    :class:`Score` to order by; ``top``: how many heads the rows keep (a picture colours them all)."""

    seq_len: int = option(50, "--seq-len", min=2,
                          help="Random tokens per copy of the repeated sequence (it is 2 x this long).")
    seed: int = option(0, "--seed", min=0, help="Seed that draws the random tokens.")
    sort: Score | None = option(None, "--sort", case_sensitive=False, show_default=False,
                                help="Order by this score, highest first (entropy: lowest first). Default: layer, "
                                "head.")
    top: int | None = option(None, "--top", "-k", "-n", min=1, metavar="N", show_default=False,
                             help="Show only the first N heads (--plot still colours every head and frames these N).")
    batch_size: int = shared.batch_size()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sort is not None:
            object.__setattr__(self, "sort", Score(self.sort).value)  # ValueError for an unknown score


class Scored(NamedTuple):
    """One prompt's scores (``encoded``: the random sequence when no prompt was given); every head, of which the
    rows list the first ``top`` (None: all) while a picture colours them all and frames those."""

    encoded: Encoded
    heads: Heads
    top: int | None = None

    @property
    def shown(self) -> Heads:
        """``heads`` with its first ``top`` rows: what the table, the JSON and the API's result list."""
        return dataclasses.replace(self.heads, rows=self.heads.rows[:self.top] if self.top else self.heads.rows)


def check(opened: Opened, opts: HeadsOptions, encoded: Sequence[Encoded] = ()) -> None:
    """UsageError when the random sequence does not fit the context or a prompt has fewer than 2 tokens."""

    info, seq_len = opened.info, opts.seq_len
    n_ctx = info.n_ctx
    extra = 0 if info.is_causal else 2  # an encoder's [CLS] ... [SEP]
    if n_ctx and 2 * seq_len + extra > n_ctx:
        raise PromptTooLong(f"--seq-len {seq_len} makes a random sequence of {2 * seq_len + extra} tokens; "
                            f"{opened.name} takes at most {n_ctx} (use --seq-len {(n_ctx - extra) // 2} or less)")
    for i, enc in enumerate(encoded, start=1):
        if len(enc) < 2:
            which = f"prompt {i}" if len(encoded) > 1 else "the prompt"
            raise UsageError(f"{which} is {len(enc)} token: heads measures queries 1..n-1 and needs at least 2")


def run(lm: LoadedModel, encoded: list[Encoded], opts: HeadsOptions, plan: None = None) -> list[Scored]:
    """Every head's scores per prompt (the random sequence's own when there is none), sorted by ``opts.sort``."""
    warn_cost(f"heads on {counted(len(encoded) + 1, 'prompt')}", lm,
              sum(cost.forward_flops(lm.info, n) for n in [*(len(e) for e in encoded), 2 * opts.seq_len]))
    with notes.status("heads") as line:
        return _score(lm, encoded, opts, line.counter("heads", "prompt layers"))


def _score(lm: LoadedModel, encoded: list[Encoded], opts: HeadsOptions,
           progress: Callable[[int, int], None]) -> list[Scored]:
    import torch

    from anatomy_cli.analyses import heads as analysis

    seq_len, seed = opts.seq_len, opts.seed
    ids = analysis.random_repeat(engine.ordinary_token_ids(lm), seq_len, seed)
    rand = engine.encode_ids(lm, ids, text=f"<{seq_len} random tokens, seed {seed}, repeated>")
    start = rand.special.index(False)
    done, total = [0], (len(encoded) + 1) * lm.n_layers

    def reduce(i: int, _layer: int, pattern: torch.Tensor) -> torch.Tensor:
        done[0] += 1
        progress(done[0], total)
        if i < len(encoded):
            return analysis.pattern_scores(pattern)
        return torch.cat([analysis.pattern_scores(pattern),
                          analysis.repeat_scores(pattern, start=start, seq_len=seq_len)])

    scores = engine.attention_patterns(lm, [*encoded, rand], reduce=reduce, batch_size=opts.batch_size)
    options: dict[str, Any] = dict(seq_len=seq_len, seed=seed, random_token_ids=ids[:seq_len], sort=opts.sort)
    repeat = scores[-1][:, 3:]
    if not encoded:
        return [Scored(rand, analysis.heads(scores[-1][:, :3], repeat, measured_on="random", **options), opts.top)]
    return [Scored(enc, analysis.heads(s, repeat, measured_on="prompt", **options), opts.top)
            for enc, s in zip(encoded, scores)]


def units(encoded: list[Encoded], results: list[Scored]) -> list[tuple[Encoded, Scored]]:
    """Each result with the text it was measured on (the random sequence's own when there is no prompt)."""
    return [(r.encoded, r) for r in results]


def carried(result: Scored) -> Heads:
    """What the API's Result carries: the heads its rows list."""
    return result.shown


OPTIONS = HeadsOptions  # the options class the driver generates the CLI options and API keywords from
