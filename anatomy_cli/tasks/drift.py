"""`drift`: how one word's vector diverges across contexts, residual reading by residual reading (the task).

The residual rows are named as everywhere else (docs/engine.md#layers): ``embed`` (the embedding), then block
N's output for N = 0..L−1 (the last before any final norm). ``--matrix`` takes one of those names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING
from typing import Optional

from anatomy_cli import engine
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.declare.inputs import Arg
from anatomy_cli.declare.inputs import Inputs
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    from anatomy_cli.analyses.drift import DriftResult
    from anatomy_cli.analyses.drift import WordLocation
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "drift"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Cosine similarity of WORD's vector between contexts at every layer, with an anisotropy baseline.

Layer embed is the embedding; layer N is block N's output, the last one
before any final norm. The header gives the 0-based token positions of
WORD in each context. Baseline: the mean cosine between WORD and the other
tokens of its own context.

Examples:

    anatomy drift bank --init random

    anatomy drift bank -c "I paid at the bank." -c "We swam to the bank."

    anatomy drift bank -c TEXT -c TEXT -c TEXT --matrix 5 --format json
"""
API_HELP = """`anatomy drift`: the cosine of WORD's vector between contexts at every residual row (``embed``, then
blocks 0..L-1), with the anisotropy baseline. ``matrix``: ``"embed"`` or a block. ``result``:
DriftResult; rows: ``layers`` (n_layers + 1)."""

# WORD, then its contexts (the CLI's repeated --context, the API's list); one result across the contexts.
TAKES = Inputs((
    Arg("word", "WORD", "The word to follow: matched as a whole word; in scripts written without spaces (Chinese, "
        "Japanese, Thai) as characters."),
    Arg("contexts", "TEXT", "A context containing WORD; repeat, at least two. Default (for 'bank'): a money and a "
        "river sentence.", api="list[str] | None", cli=Optional[list[str]], default=None, flags=("--context", "-c")),
), what="context", truncate=False, whole=True)
INPUTS = TAKES.fields()  # word and contexts: fields of DriftOptions that are the arguments, not options


class Pool(str, Enum):
    mean = "mean"
    first = "first"
    last = "last"


@dataclass(frozen=True)
class DriftOptions(Declared):
    """``word`` and its ``contexts`` (None: the built-in pair for 'bank'); ``matrix``: the residual row
    (``embed`` or a block) whose full pairwise matrix replaces the per-layer table.

    ``word`` and ``contexts`` are the command's inputs (:data:`INPUTS`: the CLI's WORD argument and ``--context``,
    the API's positional ``word, contexts``), not declared options: the CLI and the API build the options from
    the declared fields, then give them their inputs (:meth:`with_inputs`). Their defaults are the built-in pair
    (``analyses.drift.DEFAULT_WORD``, written out here: that module imports torch)."""

    word: str = "bank"
    contexts: tuple[str, ...] | None = None
    matrix: str | int | None = option(
        None, "--matrix", metavar="LAYER", show_default=False, cli=Optional[str],
        help="Print the full pairwise similarity matrix at this residual row (embed, or block N's output) instead "
        "of the per-layer table.")
    pool: Pool = option(Pool.mean, "--pool", case_sensitive=False, help="How to pool a word that spans several "
                        "tokens.")
    occurrence: int = option(1, "--occurrence", "-n", min=1, metavar="N",
                             help="Which occurrence of WORD to use in each context (1-based).")
    ignore_case: bool = option(False, "--ignore-case", "-i", help="Match WORD regardless of case.")

    def __post_init__(self) -> None:
        from anatomy_cli.analyses.drift import word_spans

        super().__post_init__()
        object.__setattr__(self, "pool", Pool(self.pool))
        if self.contexts is not None:
            object.__setattr__(self, "contexts", tuple(self.contexts))
        word_spans("", self.word)  # rejects an empty word before the model loads
        _check_utf8(self.word, "WORD")
        if self.matrix is not None:
            sites.parse_blocks(str(self.matrix), None, "--matrix", embed=True, negative=False)
        self.texts()

    def with_inputs(self, word: str, contexts: Sequence[str] | None) -> DriftOptions:
        """These options for ``word`` in ``contexts`` (None: the built-in pair), checked as a whole."""
        return dataclasses.replace(self, word=word, contexts=None if contexts is None else tuple(contexts))

    def texts(self) -> list[str]:
        """The contexts to run (the built-in pair for the default word); UsageError for fewer than two."""
        from anatomy_cli.analyses.drift import DEFAULT_CONTEXTS
        from anatomy_cli.analyses.drift import DEFAULT_WORD

        if not self.contexts:
            word = self.word.casefold() if self.ignore_case else self.word
            if word != DEFAULT_WORD:
                raise UsageError(f"no contexts given: the built-in pair is for {DEFAULT_WORD!r}; pass at least "
                                 f"two --context/-c TEXT containing {self.word!r}")
            return list(DEFAULT_CONTEXTS)
        if len(self.contexts) < 2:
            raise UsageError("drift needs at least two contexts: repeat --context/-c TEXT")
        for i, text in enumerate(self.contexts, start=1):
            if not text.strip():
                raise UsageError(f"context {i} is empty")
            _check_utf8(text, f"context {i}")
        return list(self.contexts)


def texts(opts: DriftOptions, word: str, contexts: Sequence[str] | None) -> tuple[DriftOptions, list[str]]:
    """The options for ``word`` in ``contexts`` (checked as a whole, before anything opens) and the contexts to
    tokenize."""
    opts = opts.with_inputs(word, contexts)
    return opts, opts.texts()


@dataclass(frozen=True)
class DriftPlan:
    locations: list[WordLocation]
    matrix_row: int | None  # the residual row 0..L (0 = embed) of --matrix


def check(opened: Opened, opts: DriftOptions, encoded: list[Encoded]) -> DriftPlan:
    """Before the weights load: ``--matrix`` names a residual row of this model, the word is in every context."""
    from anatomy_cli.analyses import drift as analysis

    row = None
    if opts.matrix is not None:
        labels = sites.parse_blocks(str(opts.matrix), opened.info.n_layers, "--matrix", embed=True,
                                    negative=False)
        if len(labels) != 1:
            raise UsageError(f"--matrix takes one residual row ({sites.EMBED} or a block), got {opts.matrix!r}")
        row = sites.residual_row(labels[0])
    locations = [analysis.locate(i + 1, e.text, e.ids, e.offsets, e.pieces, opts.word, special=e.special,
                                 occurrence=opts.occurrence, ignore_case=opts.ignore_case)
                 for i, e in enumerate(encoded)]
    return DriftPlan(locations, row)


def run(lm: LoadedModel, encoded: list[Encoded], opts: DriftOptions, plan: DriftPlan) -> DriftResult:
    from anatomy_cli.analyses import drift as analysis

    with notes.status("running the contexts"):
        caches = engine.run(lm, encoded, engine.residual_names(lm))
    result = analysis.drift(
        opts.word, [c.residual_stream() for c in caches], plan.locations, [e.ids for e in encoded],
        [e.special for e in encoded], pool_how=opts.pool.value, is_causal=lm.is_causal, model=lm.name,
        untrained=lm.untrained, occurrence=opts.occurrence, ignore_case=opts.ignore_case,
        matrix_layer=plan.matrix_row,
    )
    for a, b in result.identical:
        why = ("the model is decoder-only and sees only the left context"
               if lm.is_causal else "the two texts tokenize identically")
        notes.warn(f"contexts {a} and {b} are identical up to and including {opts.word!r} and {why}: "
                   f"the word's vectors are identical in every layer, whatever follows")
    return result


OPTIONS = DriftOptions  # the options class the driver generates the CLI options and API keywords from


def _check_utf8(text: str, what: str) -> None:
    # Undecodable argv bytes arrive as lone surrogates, which tokenizers reject with a TypeError.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{what} is not valid UTF-8 (character {exc.start + 1})") from None
