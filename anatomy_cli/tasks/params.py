"""`params`: a model's parameters counted from its config or file headers, without loading weights (the
command's options; the counting is anatomy_cli/analyses/params). MODEL is the command's positional argument,
``--trust-remote-code`` the model option group's."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option

COMMAND = "params"


class WeightDType(str, Enum):
    """``--dtype``'s choices: the bytes per parameter of the memory column."""

    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"


@dataclass(frozen=True)
class ParamsOptions(Declared):
    """``per_layer``: one row per block; ``dtype``: add a memory column in this dtype; ``max_memory``: also
    estimate accelerate's placement under these budgets (``0=20GiB,cpu=60GiB``, parsed by the analysis)."""

    per_layer: bool = option(False, "--per-layer",
                             help="One row per block (attention, FFN, norms), plus the embeddings and the head.")
    dtype: WeightDType | None = option(
        None, "--dtype", case_sensitive=False, show_default=False,
        help="Add a memory column: parameters x bytes per parameter in this dtype (all resident weights).")
    max_memory: str | None = option(
        None, "--max-memory", metavar="DEVICE=SIZE,...", show_default=False,
        help="Also estimate where accelerate would place each block with these budgets, e.g. "
        "0=20GiB,cpu=60GiB (GPU index, cpu, mps, disk). No GPU needs to be present.")
