"""`circuit --estimate`: the graph's size, memory and time from shapes alone (the model's config or header, the
transcoders' safetensors headers, the prompt's token count), before any weight loads.

The number of active features is known only after the forward, so it is bounded: every feature of every block
at every position but the first (TopK transcoders: ``k`` per block and position, the config's ``k:``, a
sparsify folder's ``k``; exactly the run's count when no top value is 0; a block whose file carries a JumpReLU
threshold is not TopK whatever ``k:`` says, so the bound is every feature again). The feature rows are that bound
capped by ``--max-feature-nodes``; each byte count is float32 and an upper bound on what the run allocates for it.
A cross-layer transcoder's active feature at block l keeps L - l decoder rows (its ``W_dec_l [F, L - l, d]``
rows, read from the file for the active features only), so the decoder rows are A · (L + 1) / 2, not A.
The time is the FLOPs (:mod:`anatomy_cli.models.cost`'s rules) at its assumed rate: a rough figure. The batch
forward runs each MLP once (on one copy: the replacement model reads an MLP's output as a constant) and computes
no logits; a backward passes no gradient through an MLP or the LM head (it is seeded at the blocks), so each is
counted as a forward of ``B`` copies without the MLPs and the head, plus the dots.

``--heads`` adds its replays (analyses/circuit_heads.py ``replays``, the one count of them that the run's cost
line uses too), in batches of ``B`` copies: a forward and a backward per batch of targets, a held forward of the
batch plus one copy per batch of sources, a forward per batch of the QK contributors, the bias run and the prompt's
three replays (:func:`heads_cost`). The estimate bounds the kept graph by the whole one: every feature row and
logit a target, every feature, error and token node a source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models import cost
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.transcoders import TranscoderSet
from anatomy_cli.units import human_seconds

if TYPE_CHECKING:
    from anatomy_cli.tasks._circuit_options import CircuitOptions

FLOAT = 4  # bytes: the graph is built in float32
# The replays' FLOP rate as a fraction of cost.seconds' rate: SmolLM2 on the CPU, the quiet run of
# docs/commands/circuit.md#attention-inside-the-graph---heads-n (208 targets, 323 sources, 325 QK nodes, 6 tokens,
# 256 copies): 6.2e11 FLOP counted, 12.4 s at the rate, 35 s measured. The replays are small products over few
# tokens, under the frozen rules' hooks and the attention capture.
HEADS_RATE = 0.35


@dataclass(frozen=True)
class CircuitEstimate:
    """``n_tokens`` P, ``active_features_bound`` A, ``feature_rows`` n = min(--max-feature-nodes, A), ``n_logits``
    K (``--target`` and ``--target-id``'s count, else --max-n-logits), ``n_nodes`` N = n + (L+1)·P + K; bytes:
    ``adjacency_bytes`` (the N × N result), ``rows_bytes`` (the rows buffer: (n + K) rows × every node's column,
    A + (L+1)·P + K),
    ``setup_bytes`` (the active features' encoder and decoder rows, the error vectors; a cross-layer
    transcoder's feature at block l: L - l decoder rows), ``transcoder_bytes`` (held during the attribution:
    every layer (a cross-layer transcoder: its encoders), or with --offload disk one layer plus the skip matrices),
    ``backward_bytes`` (one batch's gradients at the sources), ``memory_bytes`` (their sum; the model's weights and
    its activations not counted); ``backward_passes``, ``flops``, ``seconds_expected`` on ``device``; ``k``: the
    TopK transcoders' active features per block and position (None: not TopK, every feature counted)."""

    n_tokens: int
    n_layers: int
    d_transcoder: int
    active_features_bound: int
    feature_rows: int
    n_logits: int
    n_nodes: int
    adjacency_bytes: int
    rows_bytes: int
    setup_bytes: int
    transcoder_bytes: int
    backward_bytes: int
    memory_bytes: int
    backward_passes: int
    flops: float
    seconds_expected: float
    device: str
    offload: str | None
    k: int | None = None
    heads_passes: int = 0  # --heads: its batched replays (0: no --heads)
    heads_flops: float = 0.0
    heads_seconds_expected: float = 0.0
    warnings: tuple[str, ...] = ()  # what opening the model and encoding the prompt warned of (the run's too)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if self.heads_passes or not k.startswith("heads_")}
        return {**out, "warnings": list(self.warnings)}


@dataclass(frozen=True)
class HeadsCost:
    """``circuit --heads``' replays for ``n_links`` edges (``n_targets`` targets, ``n_sources`` sources) and QK
    terms over ``n_contributors`` nodes, in batches of ``batch`` copies: ``passes`` forwards (``backwards`` of them
    with a backward), ``flops`` and ``seconds_expected`` on ``device``."""

    n_links: int
    n_targets: int
    n_sources: int
    n_contributors: int
    batch: int
    passes: int
    backwards: int
    flops: float
    seconds_expected: float
    device: str

    def line(self) -> str:
        return (f"circuit --heads: {self.n_links:,} edges ({self.n_targets:,} targets, {self.n_sources:,} sources) "
                f"and QK terms of {self.n_contributors:,} nodes: {self.passes:,} replays of up to {self.batch} "
                f"copies ({self.backwards:,} with a backward), about {self.flops:.2g} FLOP, roughly "
                f"{human_seconds(self.seconds_expected)} on {self.device} (a rough estimate)")


def heads_cost(info: ModelInfo, n_tokens: int, n_links: int, n_targets: int, n_sources: int, n_contributors: int,
               batch: int, device: str) -> HeadsCost:
    """The replays ``--heads`` runs (analyses/circuit_heads.py ``replays``, the one count of them): each a forward
    of its copies without the MLPs (one copy runs them) and the LM head, a backward twice its forward's products
    (the gradients of both operands); the FLOPs at :data:`HEADS_RATE` of :func:`cost.seconds`' rate."""
    from anatomy_cli.analyses.circuit_heads import replays

    _, mlp, core = _forward_parts(info, n_tokens)
    runs = replays(n_targets, n_sources, n_contributors, max(batch, 1))
    flops = sum(r.copies * core * (3.0 if r.backward else 1.0) + mlp for r in runs)
    return HeadsCost(n_links, n_targets, n_sources, n_contributors, max(batch, 1), len(runs),
                     sum(r.backward for r in runs), flops, cost.seconds(flops, device) / HEADS_RATE, device)


def estimate(info: ModelInfo, ts: TranscoderSet, n_tokens: int, opts: CircuitOptions, device: str) -> CircuitEstimate:
    """The bound for one prompt of ``n_tokens`` tokens (BOS included) on ``device``."""
    L, P, d, B = info.n_layers, n_tokens, info.d_model, opts.batch_size
    per_site = ts.topk or ts.d_transcoder  # TopK in every block: k per position; else every feature may fire
    A = L * max(P - 1, 0) * per_site
    n = A if opts.max_feature_nodes is None else min(opts.max_feature_nodes, A)
    K = len(opts.wanted) or opts.max_n_logits
    N = n + (L + 1) * P + K
    rows = FLOAT * (n + K) * (A + (L + 1) * P + K)
    R = A * (L + 1) // 2 if ts.cross_layer else A  # decoder rows: Σ_l A_l · (L - l) with A_l = A / L
    setup = FLOAT * ((A + R) * d + L * P * d)
    held = ts.layer_bytes + L * ts.skip_bytes if opts.offload == "disk" else L * ts.layer_bytes
    backward = FLOAT * B * (R + A + 2 * L * P * d)  # the sites' gradients; a dot per decoder row, their sums
    passes = math.ceil(K / B) + math.ceil(n / B)
    fwd, mlp, core = _forward_parts(info, P)
    rankings = 0 if n >= A else math.ceil(n / (opts.update_interval * B))
    flops = (fwd + 4.0 * L * P * ts.d_transcoder * d  # the prompt's forward; encode and decode every block
             + B * core + mlp  # the forward of B copies the backward passes run through: MLPs once, no logits
             + passes * (B * core + 2.0 * B * d * (R + (L + 1) * P))  # each backward ≈ B cores, then the dots
             + rankings * (L + 2) * 2.0 * (n + K) * (A + (L + 1) * P + K))  # re-ranking: ≤ L + 2 products each
    hc = heads_cost(info, P, 0, n + K, N - K, N - K, B, device) if opts.heads else None
    return CircuitEstimate(P, L, ts.d_transcoder, A, n, K, N, FLOAT * N * N, rows, setup, held, backward,
                           FLOAT * N * N + rows + setup + held + backward, passes, flops, cost.seconds(flops, device),
                           device, opts.offload, ts.topk, *((hc.passes, hc.flops, hc.seconds_expected) if hc else ()))


def _forward_parts(info: ModelInfo, tokens: int) -> tuple[float, float, float]:
    """(the prompt's whole forward, its MLPs' share, the rest without the MLPs and the LM head) in FLOPs, by
    :func:`cost.forward_flops`'s rule (a block's MLP: :func:`cost.mlp_weights`)."""
    fwd = cost.forward_flops(info, tokens)
    mlp = 2.0 * info.n_layers * cost.mlp_weights(info) * tokens
    head = 2.0 * float(info.lm_head_rows) * info.d_model * tokens
    return fwd, mlp, fwd - mlp - head
