"""`circuit`: the attribution graph of a prompt's next-token prediction over a replacement model built from
transcoders (circuit-tracer 0.5.0's algorithm; anatomy_cli/analyses/circuit.py).

Refused before any weight loads: a missing transcoder folder, a set whose layer count or width does not fit
the model, hooks other than MLP in → MLP out, an encoder, bad thresholds or counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import transcoders as tc_files
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import _circuit_estimate as _estimate
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._circuit import CircuitResult
from anatomy_cli.tasks._circuit import PathRow
from anatomy_cli.tasks._circuit_estimate import CircuitEstimate
from anatomy_cli.text import targets

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.sae.feature_labels import BlockLabels
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "circuit"
OFFLOAD = (None, "cpu", "disk")
IDS = ("current", "ct-0.5")  # --ids (analyses/circuit_files.py error_ids)
__all__ = ["COMMAND", "CircuitEstimate", "CircuitOptions", "CircuitPlan", "CircuitResult", "PathRow", "check",
           "estimate", "run"]


@dataclass(frozen=True)
class CircuitOptions(Declared):
    """circuit-tracer's ``attribute`` and ``prune_graph`` settings; ``out``: graph.pt; ``json``: the
    Neuronpedia graph JSON; ``labels``: a Neuronpedia explanations export per layer (``{layer: file}`` folder
    or file; default: ``features_dir``'s and the transcoders' explanations.json, models/sae/feature_labels.py);
    ``features_dir``: ``features --out`` folders (labels, top tokens, the dashboard pages linked); ``check``:
    re-measure that many edges by intervention; ``heads``: head loadings of every kept edge and QK attributions of
    that many strongest heads (analyses/circuit_heads.py; 0: off); ``top``: rows of the paths table;
    ``ids``: the node ids (``current``: circuit-tracer's now; ``ct-0.5``: 0.5.0's); ``offload``: ``cpu`` or
    ``disk``, where the transcoders wait while not in use (tasks/_circuit.py ``load_transcoders``); ``estimate``:
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
    estimate: bool = option(False, "--estimate", help="Print the graph's size, memory and expected time, before any "
                            "weight loads; compute nothing.")
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


@dataclass(frozen=True)
class CircuitPlan:
    """The transcoders' description; ``labels``: ``{(block, feature): description}``, their sources, top tokens and
    dashboards (models/sae/feature_labels.py ``block_labels``);
    ``target_ids``: ``--target``'s and ``--target-id``'s token ids, in order (none: the salient logits)."""

    transcoders: tc_files.TranscoderSet
    labels: BlockLabels = field(default_factory=lambda: _no_labels())
    target_ids: tuple[int, ...] = ()


def before_open(opts: CircuitOptions) -> None:
    """The transcoders' folder read (config and headers) before the model opens: one that holds none is refused
    at once, not after the open's seconds (:func:`check` reads it again, with the model)."""
    tc_files.describe(opts.transcoders)


def check(opened: Opened, opts: CircuitOptions) -> CircuitPlan:
    """Every refusal that needs no weights: the model is a decoder with an LM head, the transcoders fit it (those
    of ``ln2.hook_normalized``: its MLP reads a norm), each ``--target`` is one token of ``opened``'s tokenizer
    and each ``--target-id`` in its LM head (text/targets.py ``resolve``, as ``next`` and ``attribute`` check
    theirs; ``--estimate`` too) and the ``--labels`` export reads (a malformed one is a one-line error here,
    before the weights load)."""
    info = opened.info
    require(info, Need.decoder, Need.lm_head, command=COMMAND)
    ts = tc_files.describe(opts.transcoders)
    tc_files.check_fits(ts, info.n_layers, info.d_model, info.display_name)
    if ts.before_gain:  # ln2.hook_normalized: the MLP must read a norm whose gain the run divides out
        from anatomy_cli.models.sae.names import mlp_norm

        mlp_norm(info.adapter, opened.name)
    ids = tuple(targets.resolve(opened.tokenizer, c, model=opened.name, vocab_size=info.lm_head_rows)
                for c in opts.wanted)
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:  # two logit nodes of one token would share a node id in the JSON (Neuronpedia refuses the file)
        raise UsageError(f"--target / --target-id name token id {', '.join(map(str, twice))} more than once: "
                         f"each logit node once")
    if opts.estimate:
        return CircuitPlan(ts, target_ids=ids)
    from anatomy_cli.models.sae.feature_labels import block_labels

    own = ts.paths if ts.sae_format else ()
    return CircuitPlan(ts, block_labels(Path(ts.root), own, info.n_layers, opts.labels,
                                        shared.features_dirs(opts.features_dir)), ids)


def _no_labels() -> BlockLabels:
    from anatomy_cli.models.sae.feature_labels import BlockLabels

    return BlockLabels()


def estimate(info: Any, encoded: list[Encoded], opts: CircuitOptions, plan: CircuitPlan, device: str
             ) -> list[CircuitEstimate]:
    """``--estimate``: per prompt the graph's size, memory and time from the model's shape (``info``: config or
    header), the transcoders' headers and the token count; no weight is read. ``device``: ``--device``
    (``auto`` resolved as loading resolves it)."""
    from anatomy_cli.engine.loading import resolve_device

    kind = resolve_device(device).type
    return [_estimate.estimate(info, plan.transcoders, len(enc), opts, kind) for enc in encoded]


def run(lm: LoadedModel, encoded: list[Encoded], opts: CircuitOptions, plan: CircuitPlan, *,
        batch: bool | None = None) -> list[CircuitResult] | list[CircuitEstimate]:
    """The graphs (``opts.estimate``: the estimates, on the loaded model's device). ``batch``: the prompts are a
    batch (the CLI: read from stdin; default: more than one), so ``--out`` and ``--json`` write one file per prompt,
    ``FILE-1.json``, ``FILE-2.json``, ... as ``--plot`` does."""
    if opts.estimate:
        return estimate(lm.info, encoded, opts, plan, str(lm.device))
    from anatomy_cli.tasks import _circuit

    out = []
    transcoders = _circuit.load_transcoders(lm, plan.transcoders, opts.offload)
    numbered = len(encoded) > 1 if batch is None else batch
    for i, enc in enumerate(encoded, start=1):
        with notes.status(f"attributing {len(enc)} tokens"):
            out.append(_circuit.one(lm, enc, transcoders, opts, plan, i if numbered else None))
    return out
