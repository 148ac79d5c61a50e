"""`layernorm`: LayerNorm worked by hand on a few numbers (the command's options; the arithmetic is
anatomy_cli/analyses/layernorm). The values are the command's positional arguments."""

from __future__ import annotations

from dataclasses import dataclass

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option

COMMAND = "layernorm"


@dataclass(frozen=True)
class LayernormOptions(Declared):
    """``gamma``/``beta``: the scale and shift as given, one comma-separated number per value (None: all 1,
    all 0; parsed by the analysis); ``eps``: added to the variance."""

    gamma: str | None = option(
        None, "--gamma", show_default=False,
        help="Scale γ, one number per value, comma-separated (e.g. 1,2,1,1). Default: all 1.")
    beta: str | None = option(
        None, "--beta", show_default=False,
        help="Shift β, one number per value, comma-separated (e.g. 0,0,0.5,0). Default: all 0.")
    eps: float = option(1e-5, "--eps",
                        help="Added to the variance before the square root (torch and GPT-2 use 1e-5).")
