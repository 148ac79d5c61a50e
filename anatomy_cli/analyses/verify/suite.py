"""The sections of `anatomy verify` in order, on one loaded model: :func:`verify`."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.identities import identities
from anatomy_cli.analyses.verify.known import known_answers
from anatomy_cli.analyses.verify.llamacpp import against_llamacpp
from anatomy_cli.analyses.verify.parity import parity
from anatomy_cli.analyses.verify.precision import Reload
from anatomy_cli.analyses.verify.precision import devices
from anatomy_cli.analyses.verify.precision import precision
from anatomy_cli.analyses.verify.runs import Runs
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.text.tokenization import Encoded

AGAINST = ("transformers", "llama.cpp", "all")


@dataclass(frozen=True)
class Plan:
    """What to run: ``against`` transformers (sections 1-5: parity, identities, precision, devices, known
    answers), llama.cpp (section 6) or all; ``quick``: sections 1-2 only (with ``against`` llama.cpp: section 6
    only). ``gguf``: the model's .gguf path (None: not a GGUF file). With ``against`` llama.cpp the section is
    required: one that cannot run is a failed row, not a skipped one (the task refuses it before weights load)."""

    against: str = "all"
    quick: bool = False
    gguf: str | None = None


def core(runs: Runs) -> list[C.SectionResult]:
    """Sections 1-2: parity with transformers and the identities."""
    return [parity(runs), identities(runs)]


def verify(lm: LoadedModel, encoded: Sequence[Encoded], reload: Reload, plan: Plan = Plan(), *,
           progress: Callable[[str], None] = lambda _s: None) -> C.Verification:
    """Every section ``plan`` asks for, on ``lm`` and the prompts ``encoded`` (at least one; two for the
    attribution check). ``reload(dtype, device)`` loads the same model again (the fp32 control, another
    device)."""
    runs = Runs(lm, list(encoded))
    sections: list[C.SectionResult] = []
    control = None
    if plan.against in ("transformers", "all"):
        progress("parity and identities")
        sections += core(runs)
        if not plan.quick:
            if runs.dtype != "fp32":
                progress("the fp32 control")
                control = Runs(reload("fp32", str(lm.device)), runs.encoded, runs.batch_size)
            sections.append(precision(runs, control, core))
            progress("devices")
            sections.append(devices(runs, reload))
            progress("known answers")
            sections.append(known_answers(lm))
    if plan.against == "llama.cpp" or (plan.against == "all" and not plan.quick):
        progress("llama.cpp")
        sections.append(against_llamacpp(control or runs, plan.gguf, required=plan.against == "llama.cpp"))
    return C.Verification(tuple(sections))
