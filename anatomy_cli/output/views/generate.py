"""`generate`'s view: the steps (or the coefficient sweep) as a table, the record as JSON, one JSON line per step
(per coefficient) for ``--format jsonl``, and the picture's caption."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any
from typing import cast

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import TOKEN_COLUMNS
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

if TYPE_CHECKING:
    from anatomy_cli.analyses.generate import Continuation
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.generate import Generated
    from anatomy_cli.tasks.generate import GenerateOptions
    from anatomy_cli.tasks.generate import GeneratePlan

STEP_COLUMNS = (
    Column("step", "step", "int"),
    *TOKEN_COLUMNS,
    Column("rank", "rank", "int"),
    Column("top_text", "top tokens"),
)
LENS_COLUMN = Column("first_top1_layer", "first top-1 layer", "int")
SWEEP_COLUMNS = (
    Column("coef", "coef", "float", 2),
    Column("continuation", "continuation"),
    Column("kl", "KL from coef 0 (nats)", "number", 4),
    Column("target_logprob", "target logprob", "float", 3),
    Column("target_shift", "target shift", "float", 3),
)


def rows_key(opts: GenerateOptions) -> str:
    """The key of the JSON rows: ``sweep`` for several coefficients, else ``steps``."""
    return "sweep" if opts.sweep else "steps"


def _steps_section(c: Continuation, lens: bool) -> Section:
    rows = []
    for st in c.steps:
        row = st.to_dict()
        row["top_text"] = ", ".join(f"{t.token} {t.probability:.3f}" for t in st.top)
        rows.append(row)
    return Section((*STEP_COLUMNS, LENS_COLUMN) if lens else STEP_COLUMNS, rows,
                   title=f"{len(c.steps)} generated tokens")


def report(lm: LoadedModel, enc: Encoded, out: Generated, opts: GenerateOptions, plan: GeneratePlan) -> Report:
    """One prompt's report: the prompt record, ``sampling``, ``steer``, then the steps or the sweep (and
    ``check`` with ``opts.check``). ``out``: the task's Generated."""
    data = {**prompt_record(lm, enc), "sampling": opts.sampling.record(), "steer": plan.steer, "lens": opts.lens_text}
    data.update(out.result.to_dict())
    heading = [f"generate · {model_label(lm)}", prompt_line(enc)]
    if plan.steer is not None:
        heading.append(steered_line(plan.steer))
    if opts.sweep:
        sections = [Section(SWEEP_COLUMNS, data["sweep"], title="coefficient sweep")]
    else:
        continued = cast("Continuation", out.result)  # not --sweep: one continuation
        sections = [_steps_section(continued, opts.lens is not None)]
        heading.append(f"continuation {continued.text!r} · stopped: {continued.stopped}")
    lines = []
    if opts.check:
        data["check"] = {"max_abs_logit_diff": out.max_abs_logit_diff}
        lines.append(f"cache check: largest |logit difference| cached vs uncached {out.max_abs_logit_diff:.3g}")
    return Report(data=data, sections=sections, heading=heading, notes=lines)


def steered_line(steer: dict[str, Any]) -> str:
    """The heading's line of a steered run: the vector (file or SAE feature), its site and block(s), the
    coefficient(s). ``steer``: the record's ``steer`` key."""
    label = f" ({steer['label']})" if steer.get("label") else ""
    source = f"SAE feature {steer['feature']}{label} of {steer['file']}" if "feature" in steer \
        else f"vector {steer['file']}"
    layers, coefs = steer["layers"], steer["coef"]
    blocks = f"block{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"
    values = f"coefficient{'s' if len(coefs) > 1 else ''} {', '.join(f'{c:g}' for c in coefs)}"
    return f"steered by {source} · {steer['site']} of {blocks} · {values}"


def jsonl_rows(enc: Encoded, data: dict[str, Any], opts: GenerateOptions) -> list[dict[str, object]]:
    """``--format jsonl``'s lines of one prompt: one per step (per coefficient for a sweep)."""
    return [{"prompt": enc.text, **row} for row in data[rows_key(opts)]]


def drawable(opts: GenerateOptions) -> bool:
    return opts.sweep or opts.lens is not None


def figure(lm: LoadedModel, enc: Encoded, out: Generated, opts: GenerateOptions, plan: GeneratePlan) -> FigureArgs:
    """``plots.draw("generate", ...)``'s arguments: the sweep or the lens grid and the caption (the steered
    blocks and coefficients, or the lens)."""
    from anatomy_cli.analyses.generate import Sweep

    vector, coefs, result = plan.vector, opts.coefs, out.result
    if isinstance(result, Sweep):
        where = "" if vector is None else f"{vector.site} of block{'s' if len(vector.layers) > 1 else ''} " \
                                          f"{', '.join(map(str, vector.layers))}"
        detail = f"steering {where} · coefficients {', '.join(f'{c:g}' for c in coefs)}"
    else:
        which = (opts.lens_text or "logit").partition(":")[0]
        detail = f"{which} lens of every block at each of {len(result.steps)} steps"
        if vector is not None:
            detail += f" · steered, coefficient {coefs[0]:g}"
    return (result, Caption.of("generate", lm, enc.text, detail)), {}
