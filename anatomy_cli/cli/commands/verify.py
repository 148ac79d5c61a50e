"""`anatomy verify`: prove the engine's numbers on this model, dtype and device, in one command."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from anatomy_cli.cli import records
from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import load_weights, model_label, open_model, open_texts
from anatomy_cli.cli.options import FormatOpt, PlotOpt, model_options, prompt_options
from anatomy_cli.errors import AnatomyError, UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section, emit
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.analyses.verify.checks import Check, Verification
    from anatomy_cli.analyses.verify.suite import Plan
    from anatomy_cli.engine.model import LoadedModel
    from anatomy_cli.text.tokenization import Encoded

# The built-in prompts: a fact, a collocation, an IOI sentence, a longer clause (--quick takes the first two).
PROMPTS = ("The capital of France is", "Thank you very much for the help with the",
           "When Mary and John went to the store, John gave a drink to",
           "The quick brown fox jumps over the lazy dog because it was")


class Against(str, Enum):
    transformers = "transformers"
    llamacpp = "llama.cpp"
    all = "all"


COLUMNS = (
    Column("check", "check"),
    Column("measured", "measured", "number"),
    Column("limit", "limit", "number"),
    Column("result", "result"),
    Column("max_abs", "max |Δ|", "number"),
    Column("cosine", "cosine", "float", 7),
    Column("note", "note"),
)


def _row(c: Check) -> dict[str, Any]:
    score = c.score is not None
    return {"check": c.label, "measured": c.score if score else c.error,
            "limit": (f"≥ {c.threshold:g}" if score else (None if c.tolerance is None else f"≤ {c.tolerance:g}")),
            "result": {True: "pass", False: "FAIL", None: "skip"}[c.passed], "max_abs": c.max_abs,
            "cosine": c.cosine, "note": c.note}


def _read_prompts(path: str | None) -> list[str] | None:
    from anatomy_cli.text.inputs import read_prompts

    if path is None:
        return None
    if path == "-":
        return read_prompts("-")
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--prompts {path}: no such file")
    with file.open("rb") as f:
        return read_prompts("-", stdin=f)


@app.command("verify")
@model_options()
@prompt_options()
def verify_command(
    prompts_file: Annotated[Optional[str], typer.Option(
        "--prompts", metavar="FILE|-", help="Prompts to check on, one per line ('-': stdin); default four "
        "built-in ones.")] = None,
    against: Annotated[Against, typer.Option(
        "--against", help="The reference: transformers' own forward (sections 1-4), llama.cpp (a .gguf "
        "file, section 5), or all.", case_sensitive=False)] = Against.all,
    quick: Annotated[bool, typer.Option(
        "--quick", help="Parity and identities only, on two prompts.")] = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Check anatomy's numbers on this model: each row a check, its error, its tolerance, pass or fail.

    Sections: 1 parity with transformers' own forward (every residual point per layer against
    output_hidden_states, the final norm, the logits, attention patterns against output_attentions);
    2 identities exact up to rounding (the residual decomposition, the lens at the last layer, DLA rows,
    self-patching, batched against one by one, attribution patching on a linear metric); 3 precision
    (the fp32 control for --dtype bf16/fp16) and devices (CPU against CUDA/MPS when present); 4 known
    answers of trained models (induction and previous-token heads, IOI, capitals); 5 a .gguf file against
    llama.cpp when llama-cpp-python is installed. Exit 0 when every check passes, 1 when any fails (named on
    stderr), 2 on a usage error.

    Examples:

    \b
        anatomy verify --model model.Q4_1.gguf
        anatomy verify --model model.Q4_1.gguf --quick
        anatomy verify --model model.Q4_1.gguf --plot verify.html
        anatomy verify --model ./my-checkpoint --dtype bf16 --format json
        anatomy verify --init random --against transformers
        printf 'Thank you very\\nThe capital of France is\\n' | anatomy verify --prompts - --quick
    """
    texts = _read_prompts(prompts_file) or list(PROMPTS)
    if quick:
        texts = texts[:2]
    opened, encoded = open_texts(texts, spec, prompts)
    if any(len(e) == 0 for e in encoded):
        raise UsageError("a prompt has no tokens")
    lm = load_weights(opened)
    from anatomy_cli.analyses.verify.suite import Plan

    def reload(dtype: str, device: str) -> LoadedModel:
        return load_weights(open_model(dataclasses.replace(spec, dtype=dtype, device=device, device_map=None,
                                                           max_memory=None, offload_folder=None)))

    plan = Plan(against=against.value, quick=quick, gguf=gguf_file(spec.model, lm.untrained))
    result = run(lm, encoded, reload, plan)
    emit(report(lm, result, encoded, plan), fmt)
    if plot:
        from anatomy_cli.output import plots

        plots.draw("verify", plot, None, result, caption(lm, result, encoded))
    if not result.passed:
        failed = result.failed
        names = "; ".join(f"{section}: {c.label}" for section, c in failed[:12])
        more = f" and {len(failed) - 12} more" if len(failed) > 12 else ""
        raise AnatomyError(f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed: {names}{more}")


def gguf_file(model: str, untrained: bool) -> str | None:
    """The .gguf file ``model`` names (a path, a packaged short name such as ``smollm2``, ``ollama:NAME``), for
    the llama.cpp section; None for any other model or random weights."""
    from anatomy_cli.models.resolve import check_path

    if untrained:
        return None
    try:
        source = check_path(str(model))
    except AnatomyError:
        return None
    return source.ref if source is not None and source.kind == "gguf" else None


def run(lm: LoadedModel, encoded: list[Encoded], reload: Any, plan: Plan) -> Verification:
    """Every section ``plan`` asks for, with a status line on a terminal's stderr."""
    from anatomy_cli.analyses.verify.suite import verify

    with status("verifying") as line:
        return verify(lm, encoded, reload, plan, progress=lambda what: line.update(f"verifying: {what}"))


def caption(lm: LoadedModel, result: Verification, encoded: list[Encoded]) -> Any:
    """The pictures' caption: the model, dtype and device, and the counts."""
    from anatomy_cli.output import plots

    counts = result.counts()
    return plots.Caption.of("verify", lm, None, f"{records.dtype_name(lm)} on {lm.device} · {counts['passed']} "
                            f"passed, {counts['failed']} failed, {counts['skipped']} skipped on {len(encoded)} "
                            f"prompt{'s' if len(encoded) != 1 else ''}")


def report(lm: LoadedModel, result: Verification, encoded: list[Encoded], plan: Plan) -> Report:
    """The report the command prints: one table section per verify section; ``data`` is its JSON."""
    data = {**records.model_record(lm), "device": str(lm.device), "against": plan.against, "quick": plan.quick,
            "prompts": [e.text for e in encoded], **result.to_dict()}
    sections = [Section(COLUMNS, [_row(c) for c in s.checks], title=f"{i}. {s.title}" + (f" · {s.note}" if s.note
                                                                                           else ""))
                for i, s in enumerate(result.sections, start=1)]
    counts = result.counts()
    heading = [f"verify · {model_label(lm)} · {records.dtype_name(lm)} on {lm.device}",
               f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
               f"on {len(encoded)} prompt{'s' if len(encoded) != 1 else ''}"]
    notes = ["untrained weights (--init random): known answers are skipped"] if lm.untrained else []
    return Report(data=data, sections=sections, heading=heading, notes=notes)
