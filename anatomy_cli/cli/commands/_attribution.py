"""`--method exact|attribution` and `--check N` for `patch` and `ablate`: the Typer options (the runs are
:mod:`anatomy_cli.tasks._attribution`, the check table :mod:`anatomy_cli.output.views._attribution`)."""

from __future__ import annotations

from typing import Annotated

import typer

from anatomy_cli.tasks._attribution import Method

MethodOpt = Annotated[Method, typer.Option(
    "--method", case_sensitive=False,
    help="exact: one edited run per cell; attribution: every cell estimated at once from one backward, "
    "(a_new - a) . dm/da (attribution patching), at the cost of one forward and one backward (patch runs "
    "CLEAN and CORRUPT in that forward as two batch rows).")]
CheckOpt = Annotated[int, typer.Option(
    "--check", metavar="N", min=0,
    help="With --method attribution: rerun the N cells with the largest |estimate| exactly and print them "
    "beside the estimates (Pearson's r and top-k agreement in the footer).")]
