"""`anatomy layernorm VALUE...`: LayerNorm worked by hand on a few numbers (numpy; no torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Annotated
from typing import Optional

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from typer._click.core import Context

from anatomy_cli.cli.app import warn
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import layernorm as task


def _negative_number(arg: str) -> bool:
    if len(arg) < 2 or arg[0] != "-" or arg[1] == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return False
    return True


class NumbersCommand(TyperCommand):
    """A command whose arguments may be negative numbers: ``-50``, ``-1e-3``, ``-.5``, ``-inf``.

    click treats every word that starts with ``-`` as an option (``-inf`` even as
    ``-i -n -f``). A leading space makes such a word positional, and ``float()``
    ignores it; everything else (``-h``, ``-f json``, ``--eps``) parses as usual,
    and an option that takes a value still takes the next word (``--eps -1``).
    """

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, [" " + a if _negative_number(a) else a for a in args])


@command("layernorm", task.LayernormOptions, cls=NumbersCommand)
def layernorm(
    values: Annotated[Optional[list[str]], typer.Argument(
        metavar="VALUE", help="The vector to normalise; negative numbers need no '--'.",
        show_default=False)] = None,
    opts: task.LayernormOptions = task.LayernormOptions(),
    fmt: FormatOpt = None,
) -> None:
    """Normalise VALUE... as LayerNorm does: mean, population variance, std, eps, output.

    y = (x - mean) / sqrt(variance + eps) * γ + β, with variance = mean of
    (x - mean)², i.e. divided by n (as torch.nn.LayerNorm), in float64. If all
    values are equal (one value, for instance) the output is β; a warning on
    stderr says so.

    Examples:

        anatomy layernorm 100 0.001 -50 25

        anatomy layernorm 100 0.001 -50 25 --gamma 1,2,1,1 --beta 0,0,0.5,0

        anatomy layernorm 3 1 2 --eps 0 --format json
    """
    from anatomy_cli.analyses.layernorm import layer_norm
    from anatomy_cli.analyses.layernorm import parse_list
    from anatomy_cli.analyses.layernorm import parse_number

    result = layer_norm(
        [parse_number(v) for v in values or []],
        gamma=parse_list(opts.gamma, "--gamma") if opts.gamma is not None else None,
        beta=parse_list(opts.beta, "--beta") if opts.beta is not None else None,
        eps=opts.eps,
    )
    if result.constant:
        warn("all values are equal, so variance = 0 and x - mean = 0: the normalised vector is 0 "
             "and the output is β" + (" (all 0)" if opts.beta is None else ""))
    data = result.to_dict()
    stats = Section(
        columns=(Column("quantity"), Column("value", kind="number", digits=6)),
        rows=[{"quantity": k, "value": data[k]} for k in ("mean", "variance", "std", "eps", "denominator")],
    )
    vector = Section(
        columns=(Column("index", "#", "int"), Column("x", "x", "number"), Column("centered", "x - mean", "number"),
                 Column("normalized", "normalized", "number"), Column("gamma", "γ", "number"),
                 Column("beta", "β", "number"), Column("output", "output", "number")),
        rows=[{"index": i, "x": data["values"][i], "centered": data["centered"][i],
               "normalized": data["normalized"][i], "gamma": data["gamma"][i], "beta": data["beta"][i],
               "output": data["output"][i]} for i in range(data["n"])],
    )
    emit(Report(data=data, sections=[stats, vector]), fmt)
