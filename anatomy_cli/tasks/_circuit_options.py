"""`circuit`'s options (:class:`CircuitOptions`), apart from tasks/circuit.py so that tasks/_circuit_estimate.py, which
that module imports, reads them by their own type."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.text import targets

OFFLOAD = (None, "cpu", "disk")
IDS = ("current", "ct-0.5")  # --ids (analyses/circuit_files.py error_ids)


@dataclass(frozen=True)
class CircuitOptions(Declared):
    """circuit-tracer's ``attribute`` and ``prune_graph`` settings; ``out``: graph.pt; ``json``: the
    Neuronpedia graph JSON; ``labels``: a Neuronpedia explanations export per layer (``{layer: file}`` folder
    or file; default: ``features_dir``'s and the transcoders' explanations.json, models/feature_labels.py);
    ``features_dir``: ``features --out`` folders (labels, top tokens, the dashboard pages linked); ``check``:
    re-measure that many edges by intervention; ``heads``: head loadings of every kept edge and QK attributions of
    that many strongest heads (analyses/circuit_heads.py; 0: off); ``top``: rows of the paths table;
    ``ids``: the node ids (``current``: circuit-tracer's now; ``ct-0.5``: 0.5.0's); ``offload``: ``cpu`` or
    ``disk``, where the transcoders wait while not in use (engine/replacement.py ``open_transcoders``); ``estimate``:
    the graph's size, memory and time from the shapes alone, nothing run.
    ``target`` / ``target_id``: the logit nodes by text (each one token; ``first_token``: a longer text stands for
    its first) and by id, texts first; none: the salient logits."""

    transcoders: str = option(
        dataclasses.MISSING, "--transcoders", metavar="DIR",
        help="circuit-tracer transcoder_set folder (config.yaml + one file per layer; Gemma Scope 2 safetensors "
        "too), cross_layer_transcoder folder (config.yaml + W_enc_l / W_dec_l), a folder of SAELens / sparsify "
        "transcoders, or Gemma Scope params.npz files (layer_N/.../params.npz), one per layer (anatomy fit-sae "
        "CORPUS --transcoder --layer all --out DIR trains one).")
    max_n_logits: int = option(10, "--max-n-logits", min=1, help="At most this many logit nodes.")
    desired_logit_prob: float = option(0.95, "--desired-logit-prob",
                                       help="Logit nodes until their probabilities sum to this.")
    target: tuple[str, ...] = option(
        (), "--target", metavar="TOKEN", show_default=False, cli=list[str] | None,
        help="These tokens as the logit nodes (repeatable); each exactly one token (mind the leading space: "
        "' Paris').")
    target_id: tuple[int, ...] = option(
        (), "--target-id", metavar="N", min=0, show_default=False, cli=list[int] | None,
        help="Logit nodes given by token id (repeatable; after the --target ones).")
    first_token: bool = shared.first_token()
    batch_size: int = option(256, "--batch-size", min=1, help="Rows per backward pass.")
    max_feature_nodes: int | None = option(7500, "--max-feature-nodes", min=1,
                                           help="Feature rows computed, in influence order.")
    update_interval: int = option(4, "--update-interval", min=1, help="Re-rank the features every this many batches.")
    node_threshold: float = option(0.8, "--node-threshold", help="Keep nodes up to this cumulative influence.")
    edge_threshold: float = option(0.98, "--edge-threshold", help="Keep edges up to this cumulative influence.")
    out: str | None = option(None, "--out", metavar="FILE", show_default=False, cli=Path | None,
                             help="Write circuit-tracer's graph.pt.")
    json: str | None = option(None, "--json", metavar="FILE", show_default=False, cli=Path | None,
                              help="Write the Neuronpedia graph JSON.")
    labels: str | None = option(None, "--labels", metavar="PATH", show_default=False, cli=Path | None,
                                help="Neuronpedia explanations export(s): fills clerp. Default: each --features-dir's "
                                "explanations.json, explanations.json beside the transcoders or beside a block's.")
    features_dir: Sequence[str] | None = shared.features_dir()
    check: int = option(0, "--check", min=0, metavar="N", help="Re-measure N edges by intervention.")
    heads: int = option(
        0, "--heads", min=0, metavar="N",
        help="Attention inside the graph: split every kept edge into one part per (block, head) plus the bypass "
        "(--json: each link's 'heads'; the table: 'first head'), and the N strongest heads' pre-softmax scores into "
        "query x key terms of the graph's nodes (--json: 'qk'). 0: off.")
    top: int = option(10, "--top", min=1, help="Rows of the paths table.")
    offload: str | None = option(
        None, "--offload", metavar="cpu|disk", show_default=False,
        help="Keep the transcoders off the device (cpu) or on disk (disk: read a block's when it is used); a "
        "cross-layer transcoder's encoders so, its decoders read row by row either way.")
    estimate: bool = shared.estimate("Print the graph's size, memory and expected time, before any weight loads; "
                                     "compute nothing.")
    ids: str = option(
        "current", "--ids", metavar="current|ct-0.5",
        help="Node ids of --json and the table: current (circuit-tracer's since its fix of issue #78: error nodes "
        "{block}_-1_{pos}, every id unique) or ct-0.5 (circuit-tracer 0.5.0's byte for byte: error nodes "
        "0_{block}_{pos}, which can equal a block-0 feature's id; such a graph is refused).")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("target", "target_id"):  # a list (or None) from the API: a tuple
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        for name in ("out", "json", "labels"):  # a Path from the CLI: its text, as the API gives it
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))
        for name, p in (("--desired-logit-prob", self.desired_logit_prob), ("--node-threshold",
                        self.node_threshold), ("--edge-threshold", self.edge_threshold)):
            if not 0.0 <= p <= 1.0:
                raise UsageError(f"{name} takes a number between 0 and 1, not {p}")
        if self.estimate:
            for name, given in (("--out", self.out), ("--json", self.json)):
                if given is not None:
                    raise UsageError(f"--estimate computes no graph: it writes no {name} file (drop one of the two)")
            if self.check:
                raise UsageError("--estimate computes no graph: it re-measures no --check edges (drop one of the two)")
            for name in [n for n, given in (("--labels", self.labels is not None),
                                             ("--features-dir", bool(self.features_dir))) if given][:1]:
                raise UsageError(f"--estimate computes no graph: it labels no features with {name} (drop one of "
                                 f"the two)")
        targets.check_first_token(self.first_token, *self.wanted)
        if self.ids not in IDS:
            raise UsageError(f"--ids takes current or ct-0.5, not {self.ids!r}")
        if self.offload not in OFFLOAD:
            raise UsageError(f"--offload takes cpu or disk, not {self.offload!r}")
        if not Path(self.transcoders).is_dir():
            raise UsageError(f"--transcoders {self.transcoders}: no such directory")
        if self.labels is not None and not Path(self.labels).exists():
            raise UsageError(f"--labels {self.labels}: no such file or directory")

    @property
    def wanted(self) -> tuple[targets.TokenChoice, ...]:
        """The logit nodes as given, ``--target`` texts then ``--target-id`` ids (each checked: not empty, not
        negative)."""
        chosen = [targets.choice(t, first_token=self.first_token) for t in self.target]
        chosen += [targets.choice(None, i) for i in self.target_id]
        return tuple(c for c in chosen if c is not None)
