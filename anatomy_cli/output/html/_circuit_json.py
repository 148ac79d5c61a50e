"""The graph JSON's records as `circuit --plot FILE.html` reads them: the circuit-tracer / Neuronpedia schema that
``--json`` writes (anatomy_cli/analyses/circuit_files.py: nodes, links; anatomy_cli/analyses/circuit_heads.py:
``links[].heads``, ``qk``). Types only: nothing here runs."""

from __future__ import annotations

from typing import TypedDict


class _NodeKeys(TypedDict):
    node_id: str  # {layer}_{feature}_{pos} for a feature
    feature_type: str  # embedding, cross layer transcoder, mlp reconstruction error, logit
    layer: str | int
    ctx_idx: int


class Node(_NodeKeys, total=False):
    """A node: the keys every node has, and those the page reads where present."""

    clerp: str  # its label
    activation: float | None
    influence: float | None  # cumulative influence
    token_prob: float  # a logit's probability


class HeadPart(TypedDict):
    layer: int
    head: int
    weight: float


class HeadSplit(TypedDict):
    """``--heads``: a link's weight split by the first attention head of its paths."""

    bypass: float
    parts: list[HeadPart]
    rest: float


class _LinkKeys(TypedDict):
    source: str
    target: str
    weight: float


class Link(_LinkKeys, total=False):
    heads: HeadSplit  # --heads


class QKTerm(TypedDict):
    query: str  # a contributor's node id, or bias / other
    key: str
    value: float


class _QKKeys(TypedDict):
    layer: int
    head: int
    query_pos: int
    key_pos: int
    score: float
    terms: list[QKTerm]
    rest: float


class QKEntry(_QKKeys, total=False):
    """One head's QK attribution (``qk``)."""

    n_terms: int
    softcap: float
