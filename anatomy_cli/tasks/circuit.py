"""`circuit`: the attribution graph of a prompt's next-token prediction over a replacement model built from
transcoders (circuit-tracer 0.5.0's algorithm; anatomy_cli/analyses/circuit.py).

Refused before any weight loads: a missing transcoder folder, a set whose layer count or width does not fit
the model, hooks other than MLP in → MLP out, an encoder, bad thresholds or counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.errors import UsageError
from anatomy_cli.models import transcoders as tc_files
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._circuit import CircuitResult
from anatomy_cli.tasks._circuit import PathRow

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel

COMMAND = "circuit"
__all__ = ["COMMAND", "CircuitOptions", "CircuitPlan", "CircuitResult", "PathRow", "check", "run"]


@dataclass(frozen=True)
class CircuitOptions:
    """circuit-tracer's ``attribute`` and ``prune_graph`` settings; ``out``: graph.pt; ``json``: the
    Neuronpedia graph JSON; ``labels``: a Neuronpedia explanations export per layer (``{layer: file}`` folder
    or file); ``check``: re-measure that many edges by intervention; ``top``: rows of the paths table."""

    transcoders: str
    max_n_logits: int = 10
    desired_logit_prob: float = 0.95
    target: tuple[str, ...] = ()
    batch_size: int = 256
    max_feature_nodes: int | None = 7500
    update_interval: int = 4
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    out: str | None = None
    json: str | None = None
    labels: str | None = None
    check: int = 0
    top: int = 10

    def __post_init__(self) -> None:
        for name, v in (("--max-n-logits", self.max_n_logits), ("--batch-size", self.batch_size),
                        ("--update-interval", self.update_interval), ("--top", self.top)):
            if v < 1:
                raise UsageError(f"{name} takes a whole number of at least 1")
        if self.max_feature_nodes is not None and self.max_feature_nodes < 1:
            raise UsageError("--max-feature-nodes takes a whole number of at least 1")
        if self.check < 0:
            raise UsageError("--check takes a whole number of edges (0: none)")
        for name, p in (("--desired-logit-prob", self.desired_logit_prob), ("--node-threshold",
                        self.node_threshold), ("--edge-threshold", self.edge_threshold)):
            if not 0.0 <= p <= 1.0:
                raise UsageError(f"{name} takes a number between 0 and 1, not {p}")
        if not Path(self.transcoders).is_dir():
            raise UsageError(f"--transcoders {self.transcoders}: no such directory")
        if self.labels is not None and not Path(self.labels).exists():
            raise UsageError(f"--labels {self.labels}: no such file or directory")


@dataclass(frozen=True)
class CircuitPlan:
    transcoders: tc_files.TranscoderSet


def check(opened: Any, opts: CircuitOptions) -> CircuitPlan:
    """Every refusal that needs no weights: the model is a decoder with an LM head and the transcoders fit it."""
    info = opened.info
    require(info, Need.decoder, Need.lm_head, command=COMMAND)
    ts = tc_files.describe(opts.transcoders)
    tc_files.check_fits(ts, info.n_layers, info.d_model, info.label or info.model_type)
    return CircuitPlan(ts)


def run(lm: LoadedModel, encoded: list[Encoded], opts: CircuitOptions, plan: CircuitPlan) -> list[CircuitResult]:
    from anatomy_cli.tasks import _circuit

    out = []
    transcoders = _circuit.load_transcoders(lm, plan.transcoders)
    for enc in encoded:
        with notes.status(f"attributing {len(enc)} tokens"):
            out.append(_circuit.one(lm, enc, transcoders, opts, plan))
    return out
