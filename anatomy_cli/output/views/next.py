"""`next`'s view: the top tokens and the target as a table, the record as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.output.render import TOKEN_COLUMNS
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

if TYPE_CHECKING:
    from anatomy_cli.analyses.next_token import NextTokens
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel

COLUMNS = (
    Column("rank", "rank", "int"),
    *TOKEN_COLUMNS,
    Column("logprob", "logprob", "float", 3),
)
ROWS = "top"


def report(lm: LoadedModel, enc: Encoded, result: NextTokens) -> Report:
    data = {**prompt_record(lm, enc), **result.to_dict()}
    sections = [Section(COLUMNS, data["top"], title=f"top {len(result.top)} next tokens")]
    if result.target is not None:
        sections.append(Section(COLUMNS, [data["target"]], title="target"))
    heading = [f"next · {model_label(lm)}", f"{prompt_line(enc)} · after {enc.pieces[-1]}"]
    return Report(data=data, sections=sections, heading=heading)
