"""`verify`: prove the engine's numbers on this model, dtype and device (the task).

:class:`VerifyOptions` holds the command's options (the reference, ``quick``, the prompts to check on; the
CLI reads ``--prompts FILE`` into ``prompt``); :func:`check` refuses a prompt without tokens and makes the
:class:`~anatomy_cli.analyses.verify.suite.Plan`, with the .gguf file behind the model for the llama.cpp section
(``ModelInfo.source``, set when the model was opened); :func:`run` runs every section the plan asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.tasks import notes
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.verify.checks import Verification
    from anatomy_cli.analyses.verify.precision import Reload
    from anatomy_cli.analyses.verify.suite import Plan
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "verify"
INPUTS = {"prompt": "prompts"}  # the API's prompt, the CLI's --prompts FILE
# The built-in prompts: a fact, a collocation, an IOI sentence, a longer clause (--quick takes the first two).
PROMPTS = ("The capital of France is", "Thank you very much for the help with the",
           "When Mary and John went to the store, John gave a drink to",
           "The quick brown fox jumps over the lazy dog because it was")


class Against(str, Enum):
    transformers = "transformers"
    llamacpp = "llama.cpp"
    all = "all"


@dataclass(frozen=True)
class VerifyOptions(Declared):
    """``against``: ``transformers``, ``llama.cpp`` or ``all`` (an :class:`Against` or its value); ``quick``:
    parity and identities only, on the first two prompts; ``prompt``: the prompts to check on (None:
    :data:`PROMPTS`), the command's input (the CLI and the API build the options alone, then add it with
    ``dataclasses.replace``)."""

    against: Against = option(Against.all, "--against", case_sensitive=False,
                              help="The reference: transformers' own forward (sections 1-5), llama.cpp (a .gguf file, "
                              "section 6: exit 1 where it cannot run), or all.")
    quick: bool = option(False, "--quick", help="Parity and identities only, on two prompts.")
    prompt: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "against", Against(self.against))  # ValueError for an unknown reference
        if self.prompt is not None:
            object.__setattr__(self, "prompt", tuple(self.prompt))

    @property
    def texts(self) -> list[str]:
        texts = list(self.prompt or PROMPTS)
        return texts[:2] if self.quick else texts


def gguf_file(info: ModelInfo, untrained: bool) -> str | None:
    """The .gguf file behind the model (a path, a packaged short name such as ``smollm2``, ``ollama:NAME``:
    ``info.source``, resolved once when it was opened), for the llama.cpp section; None for any other model or
    random weights."""
    if untrained or info.source is None or Path(info.source).suffix.lower() != ".gguf":
        return None
    return str(info.source)


def check(opened: Opened, encoded: list[Encoded], opts: VerifyOptions, untrained: bool) -> Plan:
    """A prompt without tokens is refused; so is ``--against llama.cpp`` where that section cannot run (a model
    that is not a .gguf file, random weights, llama-cpp-python missing or unusable on this CPU): a section asked
    for by name that checks nothing is a failure (exit 1), said before any weight loads. The plan of sections."""
    from anatomy_cli.analyses.verify.suite import Plan

    if any(len(e) == 0 for e in encoded):
        raise UsageError("a prompt has no tokens")
    gguf = gguf_file(opened.info, untrained)
    if opts.against is Against.llamacpp:
        why = cannot_run_llamacpp(gguf, untrained)
        if why is not None:
            raise AnatomyError(f"--against llama.cpp checks nothing here: {why}")
    return Plan(against=opts.against.value, quick=opts.quick, gguf=gguf)


def cannot_run_llamacpp(gguf: str | None, untrained: bool) -> str | None:
    """Why the llama.cpp section cannot run on this model here, or None."""
    if untrained:
        return "random weights (--init random) are not the .gguf file's"
    if gguf is None:
        return "the model is not a .gguf file"
    from anatomy_cli.analyses.verify.llamacpp import unusable

    return unusable(gguf)


def run(lm: LoadedModel, encoded: list[Encoded], reload: Reload, plan: Plan) -> Verification:
    """Every section ``plan`` asks for, with a status line. ``reload(dtype, device)``: the model again (the
    precision and device sections)."""
    from anatomy_cli.analyses.verify.suite import verify

    with notes.status("verifying") as line:
        return verify(lm, encoded, reload, plan, progress=lambda what: line.update(f"verifying: {what}"))


def failure(result: Verification) -> str | None:
    """The one line that names the failed checks (None when every check passed)."""
    if result.passed:
        return None
    failed = result.failed
    names = "; ".join(f"{section}: {c.label}" for section, c in failed[:12])
    more = f" and {len(failed) - 12} more" if len(failed) > 12 else ""
    return f"{counted(len(failed), 'check')} failed: {names}{more}"
