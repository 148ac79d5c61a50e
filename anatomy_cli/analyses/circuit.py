"""The attribution graph (circuit-tracer 0.5.0's ``attribute``): active features from one forward, direct-effect
rows by batched backward passes on the frozen replacement model, feature rows in influence order.

Node order (columns, and rows of the square adjacency): active features (layer, position, feature — sorted) |
error nodes, layer-major (``l * n_pos + pos``) | tokens (``n_pos``) | logits. Rows are targets.

Then influence, pruning and scores, as circuit-tracer 0.5.0's graph.py computes them (:func:`prune`,
:func:`scores`): ``A [N, N]``, rows targets, columns sources; the last ``n_logits`` nodes are logits, the
``n_tokens`` before them tokens, the error nodes before those.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import NamedTuple

import torch

from anatomy_cli.engine import replacement as rep
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.replacement import Transcoders
from anatomy_cli.engine.replacement import as_stack


@dataclass
class CircuitGraph:
    """circuit-tracer's ``Graph`` fields, plus ``n_layers``, ``pieces`` (token strings) and ``scan``."""

    input_string: str
    input_tokens: torch.Tensor
    adjacency_matrix: torch.Tensor
    active_features: torch.Tensor
    selected_features: torch.Tensor
    activation_values: torch.Tensor
    logit_targets: list[tuple[str, int]]
    logit_probabilities: torch.Tensor
    vocab_size: int
    n_layers: int
    pieces: list[str] = field(default_factory=list)
    scan: str | list[str] | None = None

    @property
    def n_pos(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.selected_features.shape[0])

    @property
    def n_logits(self) -> int:
        return len(self.logit_targets)


@dataclass
class Setup:
    """What the rows need: ``active [n, 3]``, ``values [n]``, ``encoder [n, d]`` (W_enc rows), ``decoder [m, d]``
    (act · decoder row), ``decoder_layer [m]`` (the block each row writes to) and ``decoder_owner [m]`` (its
    active feature, nondecreasing; per-layer sets: m = n, row i is feature i's; a cross-layer transcoder's feature
    at layer l has L - l rows), ``errors [L, P, d]``, ``tokens [P, d]`` (the embedding's output), the real
    ``logits [V]`` and ``fve``: per block the fraction of its MLP output's variance (positions 1..) that the
    transcoders' reconstruction explains (None: fewer than two positions or no variance)."""

    active: torch.Tensor
    values: torch.Tensor
    encoder: torch.Tensor
    decoder: torch.Tensor
    decoder_layer: torch.Tensor
    decoder_owner: torch.Tensor
    errors: torch.Tensor
    tokens: torch.Tensor
    logits: torch.Tensor
    fve: tuple[float | None, ...] = ()

    def writes(self, i: int) -> list[tuple[int, int, torch.Tensor]]:
        """(block, position, vector) for each MLP output active feature ``i`` writes to."""
        lo, hi = (int(torch.searchsorted(self.decoder_owner, i, right=r)) for r in (False, True))  # sorted owners
        pos = int(self.active[i, 1])
        return [(int(self.decoder_layer[r]), pos, self.decoder[r]) for r in range(lo, hi)]


def setup(lm: LoadedModel, ids: torch.Tensor, transcoders: Transcoders) -> Setup:
    """One forward: per layer the features active at positions 1.. (position 0 is kept out, as circuit-tracer
    does), their decoder rows (per block written to) and the error ``mlp_out - reconstruction`` (zero at
    position 0), the reconstruction summing every decoder row that writes to the block. Each layer's encoder is
    used here once (``weights()``: an offloaded one is brought in for it and dropped after); the attribution keeps
    only the active features' encoder and decoder rows."""
    stack = as_stack(transcoders)
    with rep.frozen(lm), torch.no_grad():
        fw = rep.forward(lm, ids, stack, 1)
    d, n_pos = lm.d_model, len(ids)
    active, values, enc, dec, dec_layer, owner, bias = [], [], [], [], [], [], []
    n = 0
    for layer in range(stack.n_layers):
        x = fw.mlp_in[layer][0].float()
        with stack.layer(layer).weights() as full:
            acts = full.encode(x)
            acts[0] = 0
            where = acts.nonzero()  # [k, 2] (position, feature), row-major: the sparse tensor's sorted order
            feats = where[:, 1]
            enc.append(full.W_enc[feats].float())
            rows = stack.decoder_rows(layer, feats, full).float()  # [k, n_out, d]
            bias.append(full.b_dec.float() + full.skip(x))
            del full
        vals = acts[where[:, 0], feats]
        values.append(vals)
        active.append(torch.cat([torch.full_like(where[:, :1], layer), where], 1))
        dec.append((rows * vals.to(rows.device)[:, None, None]).reshape(-1, d))
        dec_layer.append((layer + torch.arange(rows.shape[1], device=rows.device)).repeat(len(feats)))
        owner.append((n + torch.arange(len(feats), device=rows.device)).repeat_interleave(rows.shape[1]))
        n += len(feats)
    s = Setup(torch.cat(active), torch.cat(values), torch.cat(enc), torch.cat(dec), torch.cat(dec_layer),
              torch.cat(owner), torch.zeros(0), fw.embed[0].detach().float(), fw.logits[0, -1].detach().float())
    recon = torch.zeros(stack.n_layers * n_pos, d, device=s.decoder.device)
    recon.index_add_(0, s.decoder_layer * n_pos + s.active[s.decoder_owner, 1], s.decoder)
    recon = recon.reshape(stack.n_layers, n_pos, d)
    s.errors = torch.stack([fw.mlp_out[layer][0].float() - recon[layer] - bias[layer]
                            for layer in range(stack.n_layers)])
    s.errors[:, 0] = 0
    s.fve = tuple(_fve(fw.mlp_out[layer][0][1:].float(), s.errors[layer, 1:]) for layer in range(stack.n_layers))
    return s


def _fve(target: torch.Tensor, error: torch.Tensor) -> float | None:
    """``1 - Σ error² / Σ (target - its mean)²`` over positions (as anatomy sae's health reads it)."""
    var = (target.double() - target.double().mean(0)).pow(2).sum()
    if target.shape[0] < 2 or float(var) == 0.0:
        return None
    return float(1 - error.double().pow(2).sum() / var)


def salient_logits(logits: torch.Tensor, max_n_logits: int, desired_prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """circuit-tracer's salient targets: the top ``max_n_logits`` tokens, cut after the first whose cumulative
    probability reaches ``desired_prob``. Returns (ids, probabilities)."""
    probs = torch.softmax(logits.float(), -1)
    top_p, top_idx = torch.topk(probs, max_n_logits)
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_prob)) + 1
    return top_idx[:cutoff], top_p[:cutoff]


def logit_vectors(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """The unembedding rows of ``ids`` minus the mean row (circuit-tracer demeans over the whole vocabulary)."""
    head = lm.points["logits"][0]
    w = torch.as_tensor(head.weight).detach().float()
    return w[ids] - w.mean(0)


class Rows:
    """Direct effects on batches of targets: one frozen forward of ``batch`` copies, one backward per batch.

    The decoder rows are grouped once by the (block, position) they write to (``_segments``), so each backward
    reads a feature row's edges off one ``[B, d] @ [d, k]`` product per group instead of gathering a ``[B, d]``
    gradient per decoder row."""

    def __init__(self, lm: LoadedModel, ids: torch.Tensor, transcoders: Transcoders, s: Setup,
                 batch: int) -> None:
        self.lm, self.s, self.batch = lm, s, batch
        self._ctx = rep.frozen(lm)
        self._ctx.__enter__()
        self.fw = rep.forward(lm, ids, transcoders, batch, last_logits=True, shared_mlp=True)
        self._segments()

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)

    def _segments(self) -> None:
        """``self.groups``: ``(block, position, lo, hi)`` per run of decoder rows writing there, over the rows in
        ``self.order`` (None: the setup's order is already grouped — a per-layer set); ``self.owners``: the
        active feature of each row in that order (None: row i is feature i's)."""
        s, n_pos = self.s, len(self.fw.embed[0])
        key = s.decoder_layer * n_pos + s.active[s.decoder_owner, 1]
        grouped = bool((key[1:] >= key[:-1]).all())
        self.order = None if grouped else torch.argsort(key, stable=True)
        key = key if self.order is None else key[self.order]
        owners = s.decoder_owner if self.order is None else s.decoder_owner[self.order]
        identity = len(owners) == len(s.active) and bool((owners == torch.arange(len(owners),
                                                                                 device=owners.device)).all())
        self.owners = None if identity else owners
        values, counts = torch.unique_consecutive(key, return_counts=True)
        bounds = [0, *torch.cumsum(counts, 0).tolist()]
        self.groups = [(int(v) // n_pos, int(v) % n_pos, lo, hi)
                       for v, lo, hi in zip(values.tolist(), bounds[:-1], bounds[1:])]

    def compute(self, layers: torch.Tensor, positions: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """Rows ``[len(layers), n_active + L*P + P]``: target b is ``vectors[b] · resid[layers[b]][pos b]`` where
        resid[l] is the MLP input of block l (l = L: the final norm's output). The gradient of that sum is put
        straight on each site read (``grad_outputs``), one tensor per block read."""
        fw, s, n = self.fw, self.s, len(layers)
        sites, seeds = [], []
        for layer in torch.unique(layers).tolist():
            site = fw.final if layer == self.lm.n_layers else fw.mlp_in[layer]
            b = torch.where(layers == layer)[0]
            seed = torch.zeros_like(site)
            seed[b.to(site.device), positions[b].to(site.device)] = vectors[b].to(site.device, site.dtype)
            sites.append(site)
            seeds.append(seed)
        grads = torch.autograd.grad(sites, [fw.embed, *fw.mlp_out], seeds, retain_graph=True, allow_unused=True)
        g_embed = grads[0].float()[:n]
        g_mlp: list[torch.Tensor | None] = [None if g is None else g.float()[:n] for g in grads[1:]]
        feats = self.feature_edges(g_mlp, n, g_embed)
        errs = g_embed.new_zeros(n, len(g_mlp), g_embed.shape[1])
        for layer, g in enumerate(g_mlp):
            if g is not None:
                errs[:, layer] = torch.einsum("bpd,pd->bp", g, s.errors[layer])
        toks = torch.einsum("bpd,pd->bp", g_embed, s.tokens)
        return torch.cat([feats, errs.reshape(n, -1), toks], 1).cpu()

    def feature_edges(self, g_mlp: list[torch.Tensor | None], n: int, like: torch.Tensor) -> torch.Tensor:
        """``[n, n_active]``: per target, the sum over each feature's decoder rows of the gradient at the block
        and position a row writes to · the row; ``g_mlp[l] [n, P, d]`` (None: no gradient reaches block l)."""
        s = self.s
        rows = like.new_zeros(n, len(s.decoder))
        for layer, pos, lo, hi in self.groups:
            g = g_mlp[layer]
            if g is None:
                continue
            dec = s.decoder[lo:hi] if self.order is None else s.decoder[self.order[lo:hi]]
            rows[:, lo:hi] = g[:, pos] @ dec.T
        if self.owners is None:
            return rows
        out = like.new_zeros(n, len(s.active))
        out.index_add_(1, self.owners, rows)
        return out


def attribute(lm: LoadedModel, ids: torch.Tensor, transcoders: Transcoders, targets: torch.Tensor,
              probs: torch.Tensor, *, batch_size: int, max_feature_nodes: int | None, update_interval: int = 4,
              s: Setup | None = None) -> tuple[torch.Tensor, torch.Tensor, Setup]:
    """circuit-tracer's loop (attribute.py): logit rows, then feature rows in the order of their influence on the
    logits, re-ranked every ``update_interval`` batches. Returns (the square adjacency over selected features,
    selected feature indices, the setup)."""
    s = s or setup(lm, ids, transcoders)
    n_active, n_pos, n_layers = len(s.active), len(ids), lm.n_layers
    logit_offset = n_active + (n_layers + 1) * n_pos
    n_logits = len(targets)
    total = logit_offset + n_logits
    max_nodes = n_active if max_feature_nodes is None else min(max_feature_nodes, n_active)
    edges = torch.zeros(max_nodes + n_logits, total)
    row_node = torch.zeros(max_nodes + n_logits, dtype=torch.long)
    rows = Rows(lm, ids, transcoders, s, batch_size)
    try:
        vecs = logit_vectors(lm, targets)
        for i in range(0, n_logits, batch_size):
            chunk = vecs[i:i + batch_size]
            k = len(chunk)
            edges[i:i + k, :logit_offset] = rows.compute(torch.full((k,), n_layers), torch.full((k,), n_pos - 1),
                                                         chunk)
            row_node[i:i + k] = torch.arange(logit_offset + i, logit_offset + i + k)
        visited = torch.zeros(n_active, dtype=torch.bool)
        done, st = 0, n_logits
        while done < max_nodes:
            if max_nodes == n_active:
                pending = torch.arange(n_active)
            else:
                infl = partial_influences(edges[:st], probs, row_node[:st])
                rank = torch.argsort(infl[:n_active], descending=True)
                queue = min(update_interval * batch_size, max_nodes - done)
                pending = rank[~visited[rank]][:queue]
            for i in range(0, len(pending), batch_size):
                idx = pending[i:i + batch_size]
                k = len(idx)
                a = s.active[idx]
                edges[st:st + k, :logit_offset] = rows.compute(a[:, 0], a[:, 1], s.encoder[idx])
                row_node[st:st + k] = idx
                visited[idx] = True
                st += k
                done += k
    finally:
        rows.close()
    selected = torch.where(visited)[0]
    if max_nodes < n_active:
        edges = edges[:, torch.cat([selected, torch.arange(n_active, total)])]
    edges = edges[row_node.argsort()]
    n = edges.shape[1]
    full = torch.zeros(n, n)
    full[:max_nodes] = edges[:max_nodes]
    full[n - n_logits:] = edges[max_nodes:]
    return full, selected, s


# ---------------------------------------------------------------- influence, pruning, scores

class PruneResult(NamedTuple):
    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative_scores: torch.Tensor


def normalize_matrix(a: torch.Tensor, clamp: float = 1e-10) -> torch.Tensor:
    a = a.abs()
    return a / a.sum(1, keepdim=True).clamp(min=clamp)


def compute_influence(a: torch.Tensor, weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """``sum_{k>=1} weights @ A^k`` (A is nilpotent: the loop ends when the vector is zero)."""
    current = weights @ a
    influence = current
    for _ in range(max_iter):
        if not current.any():
            return influence
        current = current @ a
        influence = influence + current
    raise RuntimeError("the influence did not converge: the graph has a cycle")


def partial_influences(edges: torch.Tensor, probs: torch.Tensor, row_node: torch.Tensor,
                       max_iter: int = 128) -> torch.Tensor:
    """The influence of every node on the logits through the rows computed so far (``edges [rows, N]``,
    ``row_node``: each row's node)."""
    norm = normalize_matrix(edges, 1e-8)
    prod = torch.zeros(edges.shape[1], dtype=edges.dtype)
    prod[-len(probs):] = probs.to(edges.dtype)
    influence = torch.zeros_like(prod)
    for _ in range(max_iter):
        prod = prod[row_node] @ norm
        if not prod.any():
            break
        influence = influence + prod
    return influence


def find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    ordered = torch.sort(scores, descending=True).values
    cum = torch.cumsum(ordered, 0) / ordered.sum()
    idx = min(int(torch.searchsorted(cum, threshold)), len(cum) - 1)
    return ordered[idx]


def logit_weights(n: int, probs: torch.Tensor) -> torch.Tensor:
    w = torch.zeros(n)
    w[n - len(probs):] = probs.float()
    return w


def prune(a: torch.Tensor, probs: torch.Tensor, n_tokens: int, n_features: int, node_threshold: float = 0.8,
          edge_threshold: float = 0.98) -> PruneResult:
    """circuit-tracer's ``prune_graph``: nodes by cumulative influence, then edges by edge influence, then nodes
    without a kept edge (features need one in and one out; errors one out), to a fixed point."""
    n, n_logits = a.shape[0], len(probs)
    w = logit_weights(n, probs)
    influence = compute_influence(normalize_matrix(a), w)
    node_mask = influence >= find_threshold(influence, node_threshold)
    node_mask[n - n_logits - n_tokens:] = True
    pruned = a.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    norm = normalize_matrix(pruned)
    edge_scores = norm * (compute_influence(norm, w) + w)[:, None]
    edge_mask = edge_scores >= find_threshold(edge_scores.flatten(), edge_threshold)
    sources = n - n_logits - n_tokens
    while True:
        old = node_mask.clone()
        node_mask[:sources] &= edge_mask[:, :sources].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
        if torch.equal(old, node_mask):
            break
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
    ordered = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[ordered.indices] = torch.cumsum(ordered.values, 0) / ordered.values.sum()
    return PruneResult(node_mask, edge_mask, cumulative)


def scores(a: torch.Tensor, probs: torch.Tensor, n_tokens: int, n_errors: int) -> tuple[float, float]:
    """(replacement, completeness) as circuit-tracer's ``compute_graph_scores``."""
    n, n_logits = a.shape[0], len(probs)
    err_start = n - n_logits - n_tokens - n_errors
    w = logit_weights(n, probs)
    norm = normalize_matrix(a)
    infl = compute_influence(norm, w)
    tok = infl[n - n_logits - n_tokens:n - n_logits].sum()
    err = infl[err_start:err_start + n_errors].sum()
    replacement = tok / (tok + err)
    non_error = 1 - norm[:, err_start:err_start + n_errors].sum(1)
    both = infl + w
    completeness = (non_error * both).sum() / both.sum()
    return float(replacement), float(completeness)
